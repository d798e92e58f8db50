//! The few system calls `srdma perf` needs beyond std: CPU time of the process, socket buffer
//! sizes, and batched UDP sends and receives (`sendmmsg` / `recvmmsg`) for the UDP baseline.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// CPU seconds (user + system) the whole process, all threads, has used so far.
pub fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` points to writable memory of the right size and type; getrusage only
    // writes it, and RUSAGE_SELF is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return 0.0;
    }
    // SAFETY: getrusage succeeded, so it initialised the struct (and it was zeroed before).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Asks for `bytes` of socket receive and send buffer (the kernel caps it at its maximum).
pub fn set_buffers(sock: &impl AsRawFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // SAFETY: the fd is a live socket; the option value is a c_int of the given length.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// Sends `count` datagrams of `data` to the socket's connected peer with one `sendmmsg`;
/// returns how many the kernel took.
pub fn send_burst(sock: &UdpSocket, data: &[u8], count: usize) -> std::io::Result<usize> {
    let count = count.clamp(1, 1024);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut msgs: Vec<libc::mmsghdr> = (0..count)
        .map(|_| {
            // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are a valid value.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    // SAFETY: every header points at `iov`, which points at `data`; both outlive the call, and
    // the kernel only reads them. The socket is connected, so no address is needed.
    let n = unsafe {
        libc::sendmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            count as libc::c_uint,
            0,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A set of receive buffers for `recvmmsg`.
pub struct RecvBatch {
    bufs: Vec<u8>,
    slot: usize,
    count: usize,
}

impl RecvBatch {
    /// `count` buffers of `slot` bytes.
    pub fn new(count: usize, slot: usize) -> RecvBatch {
        RecvBatch {
            bufs: vec![0; count * slot],
            slot,
            count,
        }
    }

    /// One `recvmmsg` (blocking up to the socket's read timeout): the number of datagrams and
    /// their total payload bytes.
    pub fn recv(&mut self, sock: &UdpSocket) -> std::io::Result<(usize, u64)> {
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .chunks_mut(self.slot)
            .map(|c| libc::iovec {
                iov_base: c.as_mut_ptr().cast(),
                iov_len: c.len(),
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are valid.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: each header points at one iovec, each iovec at a distinct `slot`-byte part of
        // `self.bufs`; all outlive the call. MSG_WAITFORONE returns once one datagram is in.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                self.count as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = n as usize;
        let bytes = msgs[..n].iter().map(|m| u64::from(m.msg_len)).sum();
        Ok((n, bytes))
    }
}

/// The local address the kernel would use to reach `peer` (a UDP connect sends nothing).
pub fn source_towards(peer: SocketAddr) -> Option<std::net::IpAddr> {
    let any: SocketAddr = if peer.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(peer).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}
