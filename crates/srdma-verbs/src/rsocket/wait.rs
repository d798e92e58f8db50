//! Waiting on several things at once: rsockets, whose readiness comes from their
//! connections' completions, beside kernel descriptors (poll(2) for `rpoll` and the
//! preload's poll, select and epoll).
//!
//! A wait looks at the rsockets after taking what completed, and at the kernel descriptors
//! with a zero-timeout poll, first at once and then every [`KERNEL_EVERY`] while it spins
//! ([`reactor::spin_time`]); after that it sleeps in one `ppoll` on the kernel descriptors,
//! the reactors' channels and the waker (the reactor module's sleeping rule), so a kernel
//! descriptor or an rsocket wakes it alike.

use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::reactor::{self, MAX_SLEEP, Reactor, Sleep};
use super::{Rsock, errno, reactors_of, readiness};

/// How often a spinning wait looks at its kernel descriptors.
const KERNEL_EVERY: Duration = Duration::from_micros(50);

/// What stands behind a descriptor of a wait.
#[derive(Clone)]
pub(crate) enum Src {
    /// A kernel descriptor.
    Kernel,
    /// An rsocket.
    Rs(Arc<Rsock>),
    /// An rsocket listener that also listens in the kernel (the preload's): ready when
    /// either is.
    Both(Arc<Rsock>),
}

impl Src {
    fn rsock(&self) -> Option<&Arc<Rsock>> {
        match self {
            Src::Kernel => None,
            Src::Rs(r) | Src::Both(r) => Some(r),
        }
    }

    fn kernel(&self) -> bool {
        matches!(self, Src::Kernel | Src::Both(_))
    }
}

/// The C library's `ppoll`, as the preload found it (the program's `ppoll` is the
/// preload's, which would hand the descriptors marked as rsockets back here).
type PpollFn = unsafe extern "C" fn(
    *mut libc::pollfd,
    libc::nfds_t,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

static REAL_PPOLL: std::sync::OnceLock<PpollFn> = std::sync::OnceLock::new();

/// Waits use `f` as ppoll from now on (the preload's C library function).
pub(crate) fn use_ppoll(f: PpollFn) {
    let _ = REAL_PPOLL.set(f);
}

/// `ppoll` with `timeout` and `sigmask`; -1 with errno on error.
fn ppoll(
    fds: &mut [libc::pollfd],
    timeout: Option<Duration>,
    sigmask: Option<&libc::sigset_t>,
) -> c_int {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let f = REAL_PPOLL.get().copied().unwrap_or(libc::ppoll);
    // SAFETY: `fds` is a live array of its length; the timespec and sigset (if any) live on.
    unsafe {
        f(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            ts.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            sigmask.map_or(std::ptr::null(), |m| m as *const _),
        )
    }
}

/// Sleeps (if the sleeping rule allows) until news, a reactor's completion or `deadline`,
/// at most [`MAX_SLEEP`].
pub(crate) fn sleep_on(
    s: &mut Sleep,
    reactors: &[Arc<Reactor>],
    deadline: Option<Instant>,
) -> Result<(), c_int> {
    if s.may_sleep(reactors) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(s.fd())
            .chain(reactors.iter().map(|r| r.fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let left = deadline.map_or(MAX_SLEEP, |d| {
            d.saturating_duration_since(Instant::now()).min(MAX_SLEEP)
        });
        if ppoll(&mut fds, Some(left), None) > 0 {
            for (p, r) in fds[1..].iter().zip(reactors) {
                if p.revents != 0 {
                    r.drain();
                }
            }
        }
    }
    s.again();
    Ok(())
}

/// Sleeps until news (a connect ended, a listener accepted) or `deadline`, at most
/// [`MAX_SLEEP`].
pub(crate) fn sleep_news(deadline: Option<Instant>) -> Result<(), c_int> {
    let mut s = Sleep::begin();
    sleep_on(&mut s, &[], deadline)
}

/// The loop every multi-descriptor wait runs: `look(kernel)` says whether something is
/// ready (with `kernel` true it also looks at the kernel descriptors, without waiting);
/// `kernel_fds` are what to sleep on besides the rsockets; `reactors` gives the reactors
/// of the rsockets (asked again after each sleep: a socket may have connected meanwhile).
/// Ok(true) when ready, Ok(false) at the deadline, EINTR when a signal ended the sleep (as
/// poll(2), select(2) and epoll_wait(2) end, whatever SA_RESTART says).
pub(crate) fn wait_loop(
    mut reactors: impl FnMut() -> Vec<Arc<Reactor>>,
    kernel_fds: &[libc::pollfd],
    deadline: Option<Instant>,
    sigmask: Option<&libc::sigset_t>,
    mut look: impl FnMut(bool) -> Result<bool, c_int>,
) -> Result<bool, c_int> {
    let start = Instant::now();
    let spin_until = start + reactor::spin_time();
    let mut rs_list = reactors();
    let mut kernel_due = true;
    let mut last_kernel = start;
    let mut sleep: Option<Sleep> = None;
    loop {
        for r in &rs_list {
            r.progress();
        }
        let now = Instant::now();
        let k = kernel_due || now.duration_since(last_kernel) >= KERNEL_EVERY;
        if k {
            last_kernel = now;
            kernel_due = false;
        }
        if look(k)? {
            return Ok(true);
        }
        if deadline.is_some_and(|d| now >= d) {
            if !k && !kernel_fds.is_empty() {
                // One last look at the kernel's before giving up.
                kernel_due = true;
                continue;
            }
            return Ok(false);
        }
        if now < spin_until {
            reactor::spin_turn(now - start);
            continue;
        }
        let Some(s) = sleep.as_mut() else {
            // Counted among the sleepers before the next look (the reactor's rule).
            sleep = Some(Sleep::begin());
            kernel_due = true;
            continue;
        };
        if s.may_sleep(&rs_list) {
            let mut fds: Vec<libc::pollfd> = kernel_fds.to_vec();
            let nk = fds.len();
            fds.push(libc::pollfd {
                fd: s.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            fds.extend(rs_list.iter().map(|r| libc::pollfd {
                fd: r.fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let left = deadline.map_or(MAX_SLEEP, |d| {
                d.saturating_duration_since(now).min(MAX_SLEEP)
            });
            let n = ppoll(&mut fds, Some(left), sigmask);
            if n < 0 {
                let e = errno();
                if e == libc::EINTR {
                    return Err(libc::EINTR);
                }
                return Err(e);
            }
            if n > 0 {
                for (p, r) in fds[nk + 1..].iter().zip(&rs_list) {
                    if p.revents != 0 {
                        r.drain();
                    }
                }
                if fds[..nk].iter().any(|p| p.revents != 0) {
                    kernel_due = true;
                }
            }
        }
        s.again();
        rs_list = reactors();
    }
}

/// What [`poll`] returns when a preload socket among its descriptors was handed to the
/// kernel meanwhile: the caller looks at what stands behind each descriptor again.
pub(crate) const RESTART: c_int = libc::ERESTART;

/// poll(2) over `fds`, where `srcs[i]` says what stands behind `fds[i]`. Returns the number
/// of descriptors with events, as poll does ([`RESTART`]: see there).
pub(crate) fn poll(
    fds: &mut [libc::pollfd],
    srcs: &[Src],
    timeout: Option<Duration>,
    sigmask: Option<&libc::sigset_t>,
) -> Result<c_int, c_int> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let kernel: Vec<usize> = (0..fds.len())
        .filter(|&i| srcs[i].kernel() && fds[i].fd >= 0)
        .collect();
    let kernel_fds: Vec<libc::pollfd> = kernel
        .iter()
        .map(|&i| libc::pollfd {
            fd: fds[i].fd,
            events: fds[i].events,
            revents: 0,
        })
        .collect();
    let mut kre: Vec<i16> = vec![0; fds.len()];
    let mut count = 0;
    let socks: Vec<Arc<Rsock>> = srcs.iter().filter_map(|s| s.rsock().cloned()).collect();
    wait_loop(
        || reactors_of(&socks),
        &kernel_fds,
        deadline,
        sigmask,
        |k| {
            if k && !kernel.is_empty() {
                let mut tmp = kernel_fds.clone();
                if ppoll(&mut tmp, Some(Duration::ZERO), None) < 0 {
                    return Err(errno());
                }
                for (t, &i) in tmp.iter().zip(&kernel) {
                    kre[i] = t.revents;
                }
            }
            count = 0;
            for (i, p) in fds.iter_mut().enumerate() {
                let mut r = kre[i];
                if let Some(rs) = srcs[i].rsock() {
                    let mask = p.events | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
                    let got = readiness(rs);
                    if got & libc::POLLNVAL != 0 && super::handed_over(rs) {
                        return Err(RESTART);
                    }
                    r |= got & mask;
                }
                if p.fd < 0 {
                    r = 0;
                }
                p.revents = r;
                if r != 0 {
                    count += 1;
                }
            }
            Ok(count > 0)
        },
    )?;
    Ok(count)
}
