//! Threads srdma starts inside a program's process, with every asynchronous signal blocked.
//!
//! A kernel RDMA provider starts no thread in the program: a signal sent to the process
//! (`kill`, `sigqueue`, a timer, a child's SIGCHLD) goes to one of the program's own threads.
//! A program that blocks a signal in every thread it has and reads it through a `signalfd` or
//! `sigwait` (tgtd with SIGUSR2, many daemons with SIGTERM or SIGCHLD) relies on that: were
//! one of srdma's threads to leave the signal unblocked, the kernel would deliver it there and
//! its default action would end the process, or the program's handler would run on a thread
//! it does not know. So every thread srdma starts blocks all signals but those the kernel
//! raises for a fault of the thread itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
//! SIGSYS): a crash in srdma's code still crashes, and Rust's stack-overflow report still runs.
//!
//! The mask is set before the thread exists (the caller's is narrowed for the moment of the
//! `clone` and put back), so no signal can reach the new thread before it blocks it.

use std::io;
use std::thread::JoinHandle;

/// Signals the kernel raises for a fault of the running thread: never blocked by srdma's
/// threads (blocked, the kernel would end the process at once, without its handler).
pub const FAULT_SIGNALS: [libc::c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// The set srdma's threads block: every signal but [`FAULT_SIGNALS`].
fn blocked_set() -> libc::sigset_t {
    // SAFETY: sigfillset and sigdelset write only into the set we own; a zeroed sigset_t is a
    // valid value to start from.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in FAULT_SIGNALS {
            libc::sigdelset(&mut set, s);
        }
        set
    }
}

/// Starts a thread named `name` running `f`, with every asynchronous signal blocked (see the
/// module doc). The calling thread's own mask is the same afterwards.
pub fn spawn<F, T>(name: impl Into<String>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let set = blocked_set();
    // SAFETY: a zeroed sigset_t is a valid out-parameter.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both sets are live; pthread_sigmask changes only the calling thread's mask (and
    // glibc leaves its own internal signals out of it).
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    // The new thread inherits the mask in force now.
    let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
    // SAFETY: `old` is the mask read above; restoring it delivers whatever arrived meanwhile
    // for this thread.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// The shortest time slice the kernel's EEVDF scheduler grants (Linux 6.12 on): 0.1 ms.
pub const SHORT_SLICE_NS: u64 = 100_000;

/// `struct sched_attr` as Linux 3.14 laid it out (`SCHED_ATTR_SIZE_VER0`, 48 bytes); later
/// kernels accept it and leave the fields they added alone.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// The calling thread's scheduling attributes (`sched_getattr`).
fn sched_attr() -> io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most `size` bytes into `attr`, which has that many.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &raw mut attr,
            size_of::<SchedAttr>() as u32,
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// Asks the kernel to give the calling thread (a progress thread) the CPU promptly when it
/// wakes: the shortest EEVDF time slice, its policy and nice value kept. A thread with a
/// shorter slice than the running task preempts it at wake-up; with the default slice it
/// waits for the running task's slice to end — and an application that spins on its memory
/// for a peer's WRITE (perftest's `ib_write_lat`) spins on the core the thread needs to
/// place that WRITE: loopback, `ib_write_lat -s 64`, ~5 % of the round trips took ~1 ms,
/// 10 µs with the short slice. The thread's share of the CPU does not change (its weight
/// is its nice value's), only how finely it is cut. Kernels before 6.12 ignore the slice
/// (CFS, before 6.6, favours a thread that slept at its wake-up by its own rules); a thread
/// of another policy (an application that made its process real-time) is left as it is.
pub fn wake_promptly() -> io::Result<()> {
    let mut attr = sched_attr()?;
    if attr.policy != libc::SCHED_OTHER as u32 {
        return Ok(());
    }
    attr.size = size_of::<SchedAttr>() as u32;
    attr.flags = 0;
    attr.runtime = SHORT_SLICE_NS;
    // SAFETY: a valid sched_attr of `size` bytes, read only.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's mask.
    fn mask() -> libc::sigset_t {
        // SAFETY: a NULL new set only reads the mask into `cur`.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            assert_eq!(
                libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut cur),
                0
            );
            cur
        }
    }

    fn has(set: &libc::sigset_t, sig: libc::c_int) -> bool {
        // SAFETY: reads a live set.
        unsafe { libc::sigismember(set, sig) == 1 }
    }

    #[test]
    fn a_thread_that_wakes_promptly_keeps_its_policy_and_nice_value() {
        let (before, after) = spawn("srdma-test", || {
            // A nice value one above the process's (raising it needs no privilege), so that
            // keeping it is not keeping a default.
            let nice = sched_attr().unwrap().nice + 1;
            // SAFETY: changes the nice value of this thread only (`who` 0 is the calling
            // thread on Linux).
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
            let before = sched_attr().unwrap();
            assert_eq!(before.nice, nice.min(19));
            wake_promptly().unwrap();
            (before, sched_attr().unwrap())
        })
        .unwrap()
        .join()
        .unwrap();
        assert_eq!(after.policy, before.policy);
        assert_eq!(after.nice, before.nice);
        // Kernels with EEVDF's custom slices report the slice; older ones report none.
        assert!(
            after.runtime == 0 || after.runtime == SHORT_SLICE_NS,
            "{after:?}"
        );
    }

    #[test]
    fn a_spawned_thread_blocks_asynchronous_signals_only() {
        let before = mask();
        let inside = spawn("srdma-test", mask).unwrap().join().unwrap();
        for s in [
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGCHLD,
            libc::SIGALRM,
            libc::SIGPIPE,
            libc::SIGRTMIN(),
            libc::SIGRTMAX(),
        ] {
            assert!(has(&inside, s), "signal {s} is not blocked");
        }
        for s in FAULT_SIGNALS {
            assert!(!has(&inside, s), "fault signal {s} is blocked");
        }
        // The caller's mask is as it was.
        let after = mask();
        for s in 1..=64 {
            assert_eq!(has(&before, s), has(&after, s), "signal {s}");
        }
    }
}
