//! poll, select and epoll over rsockets and kernel descriptors together.
//!
//! An epoll set is the kernel's (the program made it with `epoll_create`, its number is
//! the kernel's) and holds the program's kernel descriptors as usual; once an rsocket is
//! added to it, the set is marked and its rsockets are kept here (interest, data, and for
//! `EPOLLET`/`EPOLLONESHOT` what was reported). An rsocket listener is in both: its kernel
//! socket in the kernel's set (for clients of the kernel's) and its rsocket here, the two
//! reports merged into one event. `epoll_wait` reports the rsockets that are ready and
//! what the kernel's set has ready, and sleeps on both ([`crate::rsocket::wait`]).

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use libc::{epoll_event, sigset_t, timespec};

use super::abi::MARK_EPOLL;
use super::{Entry, PID, entry, fail, lock, mark, marked, real};
use crate::guard;
use crate::rsocket::reactor::Reactor;
use crate::rsocket::wait::{self, Src};
use crate::rsocket::{self, ReadyQueue, Watch, readiness};
use srdma::fasthash::FastMap;

/// An rsocket in an epoll set.
struct Member {
    fd: c_int,
    entry: Arc<Entry>,
    events: u32,
    data: u64,
    /// `EPOLLET`: the socket's edge counter when it was last reported.
    seen: u64,
    /// `EPOLLONESHOT` fired: silent until `EPOLL_CTL_MOD`.
    off: bool,
    /// The set's watch on the socket: queues the member when the socket changes.
    watch: Arc<Watch>,
    /// Deleted from the set (`EPOLL_CTL_DEL`) and kept for an `EPOLL_CTL_ADD` of the same
    /// socket again, which an event loop does for every request it waits on (redis's ae
    /// deletes a connection's write interest, its last, and adds it back): reported
    /// nowhere, gone with its socket.
    parked: bool,
}

/// The rsockets of an epoll set (its kernel descriptors are in the kernel's set). A wait
/// looks at the members on the ready queue — those whose socket changed since the last
/// look, and those ready then (level-triggered: reported until they are not) — as the
/// kernel's epoll keeps a ready list: a server with a thousand idle connections pays for
/// the few that move.
struct Set {
    /// The members by slot; a member's key is its slot and the slot's generation (a key
    /// left on the queue by a member gone names no other).
    members: Vec<Option<Member>>,
    generations: Vec<u32>,
    free: Vec<usize>,
    /// Each descriptor's member.
    by_fd: FastMap<c_int, u64>,
    queue: Arc<ReadyQueue>,
    /// What a look takes off the queue (kept, with its capacity, between looks).
    taken: Vec<u64>,
    /// The members' reactors (a connection keeps its reactor), and the members that had
    /// none when last asked (not connected yet).
    reactors: Vec<Arc<Reactor>>,
    unresolved: Vec<u64>,
    pid: u32,
}

/// A member's key: its slot and the slot's generation.
fn key_of(slot: usize, generation: u32) -> u64 {
    ((slot as u64) << 32) | u64::from(generation)
}

impl Set {
    fn new(pid: u32) -> Set {
        Set {
            members: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            by_fd: FastMap::default(),
            queue: Arc::new(Mutex::new(Vec::new())),
            taken: Vec::new(),
            reactors: Vec::new(),
            unresolved: Vec::new(),
            pid,
        }
    }

    /// The slot of key `k`, if its member is still there.
    fn slot(&self, k: u64) -> Option<usize> {
        let slot = (k >> 32) as usize;
        (self.generations.get(slot) == Some(&(k as u32))).then_some(slot)
    }

    fn get_mut(&mut self, k: u64) -> Option<&mut Member> {
        let slot = self.slot(k)?;
        self.members[slot].as_mut()
    }

    fn get(&self, k: u64) -> Option<&Member> {
        self.members[self.slot(k)?].as_ref()
    }

    /// The key of descriptor `fd`'s member, whatever its socket.
    fn key_of_fd(&self, fd: c_int) -> Option<u64> {
        self.by_fd.get(&fd).copied()
    }

    /// The member of `fd` for socket `e` (parked or not).
    fn find(&self, fd: c_int, e: &Arc<Entry>) -> Option<u64> {
        let k = self.key_of_fd(fd)?;
        let m = self.get(k)?;
        Arc::ptr_eq(&m.entry, e).then_some(k)
    }

    fn add(&mut self, fd: c_int, entry: Arc<Entry>, events: u32, data: u64) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.members.push(None);
            self.generations.push(0);
            self.members.len() - 1
        });
        let key = key_of(slot, self.generations[slot]);
        let watch = Watch::new(key, &self.queue);
        entry.rs.watch(watch.clone());
        self.by_fd.insert(fd, key);
        self.unresolved.push(key);
        self.members[slot] = Some(Member {
            fd,
            entry,
            events,
            data,
            seen: 0,
            off: false,
            watch,
            parked: false,
        });
    }

    fn remove(&mut self, key: u64) -> Option<Member> {
        let slot = self.slot(key)?;
        let m = self.members[slot].take()?;
        self.generations[slot] = self.generations[slot].wrapping_add(1);
        self.free.push(slot);
        if self.key_of_fd(m.fd) == Some(key) {
            self.by_fd.remove(&m.fd);
        }
        m.watch.end();
        m.entry.rs.unwatch(&m.watch);
        Some(m)
    }

    /// Takes out the members of socket `e`.
    fn take_entry(&mut self, e: &Arc<Entry>) -> Vec<Member> {
        let keys: Vec<u64> = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(slot, m)| {
                let m = m.as_ref()?;
                Arc::ptr_eq(&m.entry, e).then(|| key_of(slot, self.generations[slot]))
            })
            .collect();
        keys.into_iter().filter_map(|k| self.remove(k)).collect()
    }

    /// The reactors of the members (each asked once it is connected).
    fn reactors(&mut self) -> Vec<Arc<Reactor>> {
        let mut unresolved = std::mem::take(&mut self.unresolved);
        unresolved.retain(|&k| {
            let Some(m) = self.get(k) else {
                return false;
            };
            let Some(r) = m.entry.rs.reactor() else {
                return true;
            };
            if !self.reactors.iter().any(|x| Arc::ptr_eq(x, &r)) {
                self.reactors.push(r);
            }
            false
        });
        self.unresolved = unresolved;
        self.reactors.clone()
    }
}

impl Drop for Set {
    fn drop(&mut self) {
        for m in self.members.iter().flatten() {
            m.watch.end();
            m.entry.rs.unwatch(&m.watch);
        }
    }
}

type Sets = FastMap<c_int, Arc<Mutex<Set>>>;

fn sets() -> &'static Mutex<Sets> {
    static S: OnceLock<Mutex<Sets>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(FastMap::default()))
}

/// The set `epfd` names, if it holds rsockets and is this process's.
fn set(epfd: c_int) -> Option<Arc<Mutex<Set>>> {
    if marked(epfd) & MARK_EPOLL == 0 {
        return None;
    }
    let s = lock(sets()).get(&epfd).cloned()?;
    let pid = PID.load(Ordering::Acquire);
    let ours = lock(&s).pid == pid;
    ours.then_some(s)
}

/// `epfd` closed (or was replaced by `dup2`): its rsockets go with it.
pub(super) fn close_set(epfd: c_int) {
    if marked(epfd) & MARK_EPOLL == 0 {
        return;
    }
    mark(epfd, marked(epfd) & !MARK_EPOLL);
    lock(sets()).remove(&epfd);
}

/// `nfd` names the same set as `epfd` (`dup`).
pub(super) fn alias_set(epfd: c_int, nfd: c_int) {
    if marked(epfd) & MARK_EPOLL == 0 {
        return;
    }
    let mut m = lock(sets());
    if let Some(s) = m.get(&epfd).cloned() {
        m.insert(nfd, s);
        mark(nfd, marked(nfd) | MARK_EPOLL);
    }
}

/// `e` closed for good: out of every set.
pub(super) fn forget(e: &Arc<Entry>) {
    let all: Vec<Arc<Mutex<Set>>> = lock(sets()).values().cloned().collect();
    for s in all {
        lock(&s).take_entry(e);
    }
}

/// `e` went to the kernel: its memberships move into the kernel's sets.
pub(super) fn to_kernel(e: &Arc<Entry>) {
    let all: Vec<(c_int, Arc<Mutex<Set>>)> =
        lock(sets()).iter().map(|(k, v)| (*k, v.clone())).collect();
    for (epfd, s) in all {
        let moved = lock(&s).take_entry(e);
        let moved = moved.into_iter().filter(|m| !m.parked);
        for m in moved {
            let mut ev = epoll_event {
                events: m.events,
                u64: m.data,
            };
            // A listener's kernel socket is there already.
            // SAFETY: the kernel's epoll_ctl with a live event.
            unsafe {
                if (real().epoll_ctl)(epfd, libc::EPOLL_CTL_ADD, m.fd, &mut ev) != 0 {
                    (real().epoll_ctl)(epfd, libc::EPOLL_CTL_MOD, m.fd, &mut ev);
                }
            }
        }
    }
}

/// The rsocket's epoll events now (poll bits and epoll bits share their values).
fn epoll_bits(rs: &rsocket::Rsock, interest: u32) -> u32 {
    let r = readiness(rs) as u16 as u32;
    r & (interest | libc::EPOLLERR as u32 | libc::EPOLLHUP as u32)
}

pub(super) unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    guard(fail(libc::EIO), || {
        let e = match entry(fd) {
            Some(e) if e.ours() => e,
            // SAFETY: the kernel's epoll_ctl, as called.
            _ => return unsafe { (real().epoll_ctl)(epfd, op, fd, ev) },
        };
        if epfd == fd {
            return fail(libc::EINVAL);
        }
        if op != libc::EPOLL_CTL_DEL && ev.is_null() {
            return fail(libc::EFAULT);
        }
        // The set must be open (EBADF as the kernel says). One this process already holds
        // rsockets in is: its close and dup2 come through here and forget it (a server
        // that adds and deletes a connection's interest for every request, as redis's ae
        // does, made this question a system call per call).
        // SAFETY: F_GETFD on the set.
        if marked(epfd) & MARK_EPOLL == 0 && unsafe { (real().fcntl)(epfd, libc::F_GETFD) } < 0 {
            return -1;
        }
        let (events, data) = if ev.is_null() {
            (0, 0)
        } else {
            // SAFETY: the caller's event.
            let v = unsafe { ev.read_unaligned() };
            (v.events, v.u64)
        };
        let s = {
            let mut m = lock(sets());
            m.entry(epfd)
                .or_insert_with(|| Arc::new(Mutex::new(Set::new(PID.load(Ordering::Acquire)))))
                .clone()
        };
        mark(epfd, marked(epfd) | MARK_EPOLL);
        let listening = rsocket::is_listening(&e.rs);
        let mut st = lock(&s);
        let at = st.find(fd, &e);
        let parked = at.and_then(|k| st.get(k)).is_some_and(|m| m.parked);
        match (op, at) {
            (libc::EPOLL_CTL_ADD, Some(_)) if !parked => return fail(libc::EEXIST),
            (libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL, None) => return fail(libc::ENOENT),
            (libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL, Some(_)) if parked => {
                return fail(libc::ENOENT);
            }
            (libc::EPOLL_CTL_ADD, None) => {
                // A stale member of a descriptor number reused for another socket.
                if let Some(k) = st.key_of_fd(fd) {
                    st.remove(k);
                }
                st.add(fd, e.clone(), events, data);
            }
            (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, Some(k)) => {
                if let Some(m) = st.get_mut(k) {
                    m.events = events;
                    m.data = data;
                    m.seen = 0;
                    m.off = false;
                    m.parked = false;
                    m.watch.wake();
                }
            }
            (libc::EPOLL_CTL_DEL, Some(k)) => {
                if let Some(m) = st.get_mut(k) {
                    m.parked = true;
                }
            }
            _ => return fail(libc::EINVAL),
        }
        drop(st);
        if listening {
            // Its kernel socket too, for the kernel's clients.
            // SAFETY: the kernel's epoll_ctl, as called.
            let r = unsafe { (real().epoll_ctl)(epfd, op, fd, ev) };
            if r != 0 && op == libc::EPOLL_CTL_ADD {
                let err = super::errno();
                if err != libc::EEXIST {
                    let mut st = lock(&s);
                    if let Some(k) = st.find(fd, &e) {
                        st.remove(k);
                    }
                    return fail(err);
                }
            }
        }
        0
    })
}

/// Milliseconds, or a timespec, as a timeout (None: forever).
fn timeout_of(ts: *const timespec) -> Result<Option<Duration>, c_int> {
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's timespec.
    let t = unsafe { ts.read_unaligned() };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(libc::EINVAL);
    }
    Ok(Some(
        Duration::from_secs(t.tv_sec as u64) + Duration::from_nanos(t.tv_nsec as u64),
    ))
}

pub(super) unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    ts: *const timespec,
    sigmask: *const sigset_t,
) -> c_int {
    guard(fail(libc::EIO), || {
        let Some(s) = set(epfd) else {
            let ms = match timeout_of(ts) {
                Ok(None) => -1,
                Ok(Some(d)) => d.as_millis().min(c_int::MAX as u128) as c_int,
                Err(e) => return fail(e),
            };
            // SAFETY: the kernel's epoll_pwait, as called.
            return unsafe { (real().epoll_pwait)(epfd, out, max, ms, sigmask) };
        };
        if max <= 0 {
            return fail(libc::EINVAL);
        }
        if out.is_null() {
            return fail(libc::EFAULT);
        }
        let timeout = match timeout_of(ts) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let deadline = timeout.map(|t| Instant::now() + t);
        // SAFETY: the caller's array of `max` events.
        let out = unsafe { std::slice::from_raw_parts_mut(out, max as usize) };
        // SAFETY: the caller's signal mask, if any.
        let mask = (!sigmask.is_null()).then(|| unsafe { &*sigmask });
        let me = [libc::pollfd {
            fd: epfd,
            events: libc::POLLIN,
            revents: 0,
        }];
        let mut n = 0usize;
        let reactors = || lock(&s).reactors();
        let r = wait::wait_loop(reactors, &me, deadline, mask, |k| {
            n = 0;
            let mut listeners: Vec<u64> = Vec::new();
            {
                let mut st = lock(&s);
                let mut keys = std::mem::take(&mut st.taken);
                std::mem::swap(&mut keys, &mut *lock(&st.queue));
                let mut i = 0;
                while i < keys.len() && n < out.len() {
                    let key = keys[i];
                    i += 1;
                    let Some(m) = st.get_mut(key) else {
                        continue;
                    };
                    // Off the queue before the look: a change from now on queues it again.
                    m.watch.taken();
                    if m.off || m.parked {
                        continue;
                    }
                    let bits = epoll_bits(&m.entry.rs, m.events);
                    if bits == 0 {
                        continue;
                    }
                    let edge = m.events & libc::EPOLLET as u32 != 0;
                    if edge {
                        let c = m.entry.rs.event_count();
                        if c == m.seen {
                            continue;
                        }
                        m.seen = c;
                    }
                    if m.events & libc::EPOLLONESHOT as u32 != 0 {
                        m.off = true;
                    } else if !edge {
                        // Level-triggered: looked at again by the next wait, at the back.
                        m.watch.wake();
                    }
                    if rsocket::is_listening(&m.entry.rs) {
                        listeners.push(m.data);
                    }
                    out[n] = epoll_event {
                        events: bits,
                        u64: m.data,
                    };
                    n += 1;
                }
                if i < keys.len() {
                    // No room for them: still queued, first in line.
                    let mut q = lock(&st.queue);
                    let later = std::mem::replace(&mut *q, keys[i..].to_vec());
                    q.extend(later);
                }
                keys.clear();
                st.taken = keys;
            }
            if k && n < out.len() {
                let room = out.len() - n;
                // SAFETY: the kernel's epoll_pwait into the rest of the caller's array.
                let got = unsafe {
                    (real().epoll_pwait)(
                        epfd,
                        out[n..].as_mut_ptr(),
                        room as c_int,
                        0,
                        std::ptr::null(),
                    )
                };
                if got < 0 {
                    return Err(super::errno());
                }
                // A listener's kernel socket and its rsocket, ready together: one event.
                let mut kept = 0;
                for i in 0..got as usize {
                    let ev = out[n + i];
                    let data = ev.u64;
                    if listeners.contains(&data) {
                        if let Some(o) = out[..n].iter_mut().find(|o| o.u64 == data) {
                            o.events |= ev.events;
                            continue;
                        }
                    }
                    out[n + kept] = ev;
                    kept += 1;
                }
                n += kept;
            }
            Ok(n > 0)
        });
        match r {
            Ok(_) => n as c_int,
            Err(e) => fail(e),
        }
    })
}

/// Whether any of `fds` is marked.
fn any_marked(fds: &[libc::pollfd]) -> bool {
    fds.iter().any(|p| marked(p.fd) != 0)
}

/// What stands behind `fd` for a poll: an rsocket (connected, connecting), a listener on
/// both sides, or the kernel's descriptor.
fn src_of(fd: c_int) -> Src {
    match entry(fd) {
        Some(e) if e.ours() => {
            if rsocket::is_listening(&e.rs) {
                Src::Both(e.rs.clone())
            } else if rsocket::is_active(&e.rs) {
                Src::Rs(e.rs.clone())
            } else {
                Src::Kernel
            }
        }
        _ => Src::Kernel,
    }
}

/// [`wait::poll`] over `fds`, looking again at what stands behind them whenever a socket
/// was handed to the kernel meanwhile.
fn poll_again(
    fds: &mut [libc::pollfd],
    timeout: Option<Duration>,
    mask: Option<&sigset_t>,
) -> Result<c_int, c_int> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let srcs: Vec<Src> = fds.iter().map(|p| src_of(p.fd)).collect();
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match wait::poll(fds, &srcs, left, mask) {
            Err(wait::RESTART) => continue,
            r => return r,
        }
    }
}

pub(super) unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    ts: *const timespec,
    sigmask: *const sigset_t,
) -> c_int {
    guard(fail(libc::EIO), || {
        if nfds > 0 && fds.is_null() {
            return fail(libc::EFAULT);
        }
        let all = if nfds == 0 {
            &mut []
        } else {
            // SAFETY: the caller's `nfds` pollfds.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        let timeout = match timeout_of(ts) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        if !any_marked(all) {
            // SAFETY: the kernel's ppoll, as called.
            return unsafe { (real().ppoll)(fds, nfds, ts, sigmask) };
        }
        // SAFETY: the caller's signal mask, if any.
        let mask = (!sigmask.is_null()).then(|| unsafe { &*sigmask });
        match poll_again(all, timeout, mask) {
            Ok(n) => n,
            Err(e) => fail(e),
        }
    })
}

/// select(2)'s sets, as poll bits: what a descriptor counts as ready for.
const IN_SET: i16 = libc::POLLIN | libc::POLLHUP | libc::POLLERR;
const OUT_SET: i16 = libc::POLLOUT | libc::POLLERR;
const EX_SET: i16 = libc::POLLPRI;

pub(super) unsafe extern "C" fn pselect(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
    ts: *mut timespec,
    sigmask: *const sigset_t,
    update: bool,
) -> c_int {
    guard(fail(libc::EIO), || {
        if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
            return fail(libc::EINVAL);
        }
        // SAFETY: each set NULL or valid, as the caller gave them.
        let isset =
            |set: *mut libc::fd_set, fd| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
        let mut fds = Vec::new();
        for fd in 0..nfds {
            let mut events = 0;
            if isset(rd, fd) {
                events |= libc::POLLIN;
            }
            if isset(wr, fd) {
                events |= libc::POLLOUT;
            }
            if isset(ex, fd) {
                events |= libc::POLLPRI;
            }
            if events != 0 {
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
            }
        }
        let timeout = match timeout_of(ts) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let start = Instant::now();
        // SAFETY: the caller's signal mask, if any.
        let mask = (!sigmask.is_null()).then(|| unsafe { &*sigmask });
        let r = poll_again(&mut fds, timeout, mask);
        if update && !ts.is_null() {
            let left = timeout.map_or(Duration::ZERO, |t| t.saturating_sub(start.elapsed()));
            // SAFETY: the caller's timeout, which select updates.
            unsafe {
                ts.write_unaligned(timespec {
                    tv_sec: left.as_secs() as libc::time_t,
                    tv_nsec: left.subsec_nanos() as libc::c_long,
                })
            };
        }
        if let Err(e) = r {
            return fail(e);
        }
        if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
            return fail(libc::EBADF);
        }
        for set in [rd, wr, ex] {
            if !set.is_null() {
                // SAFETY: the caller's set.
                unsafe { libc::FD_ZERO(set) };
            }
        }
        let mut count = 0;
        for p in &fds {
            for (set, bits, asked) in [
                (rd, IN_SET, libc::POLLIN),
                (wr, OUT_SET, libc::POLLOUT),
                (ex, EX_SET, libc::POLLPRI),
            ] {
                if !set.is_null() && p.events & asked != 0 && p.revents & bits != 0 {
                    // SAFETY: the caller's set; `p.fd` < nfds <= FD_SETSIZE.
                    unsafe { libc::FD_SET(p.fd, set) };
                    count += 1;
                }
            }
        }
        count
    })
}
