//! What a signal does to a blocking wait: the kernel ends a read(2) of a completion channel
//! with EINTR when a signal handler installed without `SA_RESTART` runs, and restarts it
//! otherwise. srdma waits in poll(2), which never restarts, so it asks which kind of handler
//! the process has.

/// Signals the kernel raises for a fault of the thread itself: their handlers (Rust's stack
/// overflow check, crash reporters) do not run while a thread waits.
const FAULTS: [libc::c_int; 6] = srdma::threads::FAULT_SIGNALS;

/// True if the process has a handler without `SA_RESTART` for a signal that can interrupt a
/// wait: a wait that a signal interrupted should end with EINTR, as the kernel's read(2)
/// would have ended. (Which signal interrupted is not known; any such handler counts, so a
/// wait the kernel would restart may end too, which a program that installs one expects.)
pub(crate) fn interrupting_handler_installed() -> bool {
    // Linux numbers signals 1..=64 (_NSIG - 1); SIGKILL and SIGSTOP report SIG_DFL.
    (1..=64).filter(|s| !FAULTS.contains(s)).any(|sig| {
        // SAFETY: a zeroed sigaction is a valid out-parameter; a NULL new action only reads
        // the current one; an invalid signal number fails with EINVAL and writes nothing.
        let (r, old) = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(sig, std::ptr::null(), &mut old), old)
        };
        r == 0
            && old.sa_sigaction != libc::SIG_DFL
            && old.sa_sigaction != libc::SIG_IGN
            && old.sa_flags & libc::SA_RESTART == 0
    })
}

#[cfg(test)]
mod tests {
    use super::interrupting_handler_installed;

    extern "C" fn nothing(_: libc::c_int) {}

    /// Installs `nothing` for SIGUSR2 with `flags`, runs `f`, puts the old action back.
    fn with_handler<T>(flags: libc::c_int, f: impl FnOnce() -> T) -> T {
        // SAFETY: plain C structs; `nothing` is a valid handler for the process's lifetime.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
            act.sa_flags = flags;
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGUSR2, &act, &mut old), 0);
            let v = f();
            assert_eq!(
                libc::sigaction(libc::SIGUSR2, &old, std::ptr::null_mut()),
                0
            );
            v
        }
    }

    #[test]
    fn only_a_handler_without_sa_restart_interrupts() {
        // The test harness installs none but Rust's for stack overflows (SIGSEGV, SIGBUS).
        assert!(!interrupting_handler_installed());
        assert!(!with_handler(
            libc::SA_RESTART,
            interrupting_handler_installed
        ));
        assert!(with_handler(0, interrupting_handler_installed));
        assert!(!interrupting_handler_installed());
    }
}
