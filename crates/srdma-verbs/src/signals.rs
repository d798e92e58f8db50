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

// Thread cancellation. rdma-core's blocking calls (`rdma_get_cm_event`, `ibv_get_cq_event`,
// `ibv_get_async_event`) wait in a read(2) of a kernel file, a cancellation point:
// `pthread_cancel` ends a thread that waits there (libiscsi's iSER transport cancels its CM
// thread so on every disconnect). glibc cancels by a forced unwind from the cancellation
// point up the thread's stack; met by the library's `catch_unwind` (the panic boundary), it
// aborts the process ("FATAL: exception not rethrown"). So those calls wait where a
// cancellation may act only in a frame of their own that holds nothing to drop, outside the
// panic boundary, and run the rest with cancellation disabled.

unsafe extern "C-unwind" {
    /// glibc's read(2), declared as what it is: a cancellation point that may unwind.
    #[link_name = "read"]
    pub(crate) fn cancellable_read(
        fd: libc::c_int,
        buf: *mut libc::c_void,
        count: libc::size_t,
    ) -> libc::ssize_t;
    /// glibc's poll(2), a cancellation point.
    #[link_name = "poll"]
    pub(crate) fn cancellable_poll(
        fds: *mut libc::pollfd,
        nfds: libc::nfds_t,
        timeout: libc::c_int,
    ) -> libc::c_int;
    /// `pthread_testcancel`: unwinds now if a cancellation is pending.
    #[link_name = "pthread_testcancel"]
    pub(crate) fn testcancel();
}

/// Runs `f` with the calling thread's cancellation disabled (a `pthread_cancel` meanwhile
/// stays pending, to act at the caller's next cancellation point), then restores the state.
pub(crate) fn without_cancellation<T>(f: impl FnOnce() -> T) -> T {
    let mut old: libc::c_int = 0;
    // SAFETY: pthread_setcancelstate only writes the old state into `old`.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
    let v = f();
    // SAFETY: as above; the old state is put back (a cancellation does not act here).
    unsafe { pthread_setcancelstate(old, std::ptr::null_mut()) };
    v
}

/// glibc's value (the libc crate does not have it).
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

unsafe extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, oldstate: *mut libc::c_int) -> libc::c_int;
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
