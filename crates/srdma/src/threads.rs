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
