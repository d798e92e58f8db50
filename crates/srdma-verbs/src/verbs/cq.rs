//! Completion channels and CQs: the channel, `ibv_create_cq` and `_ex` with the
//! `ibv_start_poll` API, polling, events, resizing.

use super::*;

/// An `ibv_comp_channel`.
#[repr(C)]
pub(super) struct Channel {
    pub(super) c: ibv_comp_channel,
    pub(super) ch: srdma::CompChannel,
    /// The CQs on this channel, by srdma CQ id (what the channel's events name).
    pub(super) cqs: Mutex<HashMap<u32, usize>>,
}

/// `ibv_create_comp_channel`: a channel whose `fd` is pollable (and may be made
/// non-blocking).
///
/// # Safety
/// `context` is NULL or an open context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        if unsafe { Context::from_c(context) }.is_none() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let ch = match srdma::CompChannel::new() {
            Ok(c) => c,
            Err(e) => {
                set_errno(errno_of(&e));
                return std::ptr::null_mut();
            }
        };
        let c = ibv_comp_channel {
            context,
            fd: ch.as_fd().as_raw_fd(),
            refcnt: 0,
        };
        hand_out(Channel {
            c,
            ch,
            cqs: Mutex::new(HashMap::new()),
        })
    })
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it, as rdma-core.
///
/// # Safety
/// `channel` is NULL or a live channel, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(ch) = (unsafe { back::<Channel, _>(channel) }) else {
            return libc::EINVAL;
        };
        if !lock(&ch.cqs).is_empty() {
            return libc::EBUSY;
        }
        // SAFETY: live objects came from hand_out::<Channel>.
        drop(unsafe { take_back::<Channel, _>(channel) });
        0
    })
}

/// An `ibv_cq`.
#[repr(C)]
pub(super) struct Cq {
    pub(super) c: ibv_cq_ex,
    pub(super) cq: srdma::Cq,
    pub(super) channel: *mut Channel,
    /// Completions taken from srdma, converted by the next poll.
    pub(super) scratch: Mutex<Vec<Wc>>,
    /// Completion events handed out by `ibv_get_cq_event` and acknowledged by
    /// `ibv_ack_cq_events`: `ibv_destroy_cq` waits until the two are equal.
    pub(super) events: EventCount,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current.
    pub(super) cur: Mutex<Option<Wc>>,
}

/// A CQ's completion events taken and acknowledged, as rdma-core's `ibv_cq` counts them
/// (`comp_events_completed` against the kernel's `comp_events_reported`).
#[derive(Default)]
pub(super) struct EventCount {
    /// (taken, acknowledged), each wrapping.
    counts: Mutex<(u32, u32)>,
    acked: std::sync::Condvar,
}

impl EventCount {
    fn taken(&self) {
        let mut c = lock(&self.counts);
        c.0 = c.0.wrapping_add(1);
    }

    fn ack(&self, n: u32) {
        let mut c = lock(&self.counts);
        c.1 = c.1.wrapping_add(n);
        self.acked.notify_all();
    }

    /// Waits until every event taken is acknowledged. An application that never
    /// acknowledges one blocks here, as with rdma-core ("ibv_destroy_cq will hang").
    fn wait_all_acked(&self) {
        let mut c = lock(&self.counts);
        while (c.0.wrapping_sub(c.1) as i32) > 0 {
            c = self
                .acked
                .wait(c)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// `ibv_create_cq`: a CQ of `cqe` entries, optionally on `channel`.
///
/// # Safety
/// `context` NULL or open; `channel` NULL or a live channel of it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match make_cq(ctx, context, cqe, cq_context, channel, comp_vector) {
            Ok(p) => p.cast(),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Creates a CQ (`ibv_cq_ex` inside, so it serves both APIs).
pub(super) fn make_cq(
    ctx: &Context,
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut Cq, c_int> {
    let max = ctx.entry.cfg.limits.max_cqe as c_int;
    // Any of the context's completion vectors (the kernel's check: EINVAL from the last on).
    if !(1..=max).contains(&cqe) || !(0..ctx.vctx.context.num_comp_vectors).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    // SAFETY: `channel` is NULL or checked live by `back`.
    let ch = unsafe { back::<Channel, _>(channel) };
    if !channel.is_null() && ch.is_none() {
        return Err(libc::EINVAL);
    }
    let dev = ctx.device()?;
    let cq = dev
        .create_cq(cqe as usize, ch.map(|c| &c.ch))
        .map_err(|e| errno_of(&e))?;
    // SAFETY: plain C data; zeroed mutex/cond are the static initialisers on glibc, zeroed
    // function pointers are None.
    let mut c: ibv_cq_ex = unsafe { std::mem::zeroed() };
    c.cq.context = context;
    c.cq.channel = channel;
    c.cq.cq_context = cq_context;
    c.cq.handle = cq.id();
    c.cq.cqe = cqe;
    c.start_poll = Some(cq_start_poll);
    c.next_poll = Some(cq_next_poll);
    c.end_poll = Some(cq_end_poll);
    c.read_opcode = Some(cq_read_opcode);
    c.read_vendor_err = Some(cq_read_vendor_err);
    c.read_byte_len = Some(cq_read_byte_len);
    c.read_imm_data = Some(cq_read_imm_data);
    c.read_qp_num = Some(cq_read_qp_num);
    c.read_src_qp = Some(cq_read_src_qp);
    c.read_wc_flags = Some(cq_read_wc_flags);
    c.read_slid = Some(cq_read_slid);
    c.read_sl = Some(cq_read_sl);
    c.read_dlid_path_bits = Some(cq_read_dlid_path_bits);
    let id = cq.id();
    let boxed: *mut Cq = hand_out(Cq {
        c,
        cq,
        channel: channel.cast(),
        scratch: Mutex::new(Vec::with_capacity(16)),
        events: EventCount::default(),
        cur: Mutex::new(None),
    });
    lock(&ctx.sink.cqs).insert(id, boxed as usize);
    if let Some(ch) = ch {
        lock(&ch.cqs).insert(id, boxed as usize);
        // SAFETY: `channel` is live; refcnt is informational for the application.
        unsafe { (*channel).refcnt += 1 };
    }
    Ok(boxed)
}

/// `verbs_context.create_cq_ex` (behind the inline `ibv_create_cq_ex`): a CQ with the
/// `ibv_start_poll` API, reporting the standard `IBV_WC_EX_WITH_*` fields; completion
/// timestamps, CVLAN, flow tags and tag matching are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn vctx_create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the inline caller passes its context.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: readable per ibv_create_cq_ex's contract.
        let a = unsafe { &*attr };
        if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0
            || a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
            || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !IBV_CREATE_CQ_ATTR_KNOWN != 0)
        {
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        let cqe = c_int::try_from(a.cqe).unwrap_or(c_int::MAX);
        match make_cq(
            ctx,
            context,
            cqe,
            a.cq_context,
            a.channel,
            a.comp_vector as c_int,
        ) {
            Ok(p) => p.cast(),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// `ibv_destroy_cq`: 0; EBUSY while a QP uses it. Its async events are dropped or waited
/// for as `ibv_destroy_qp`'s.
///
/// # Safety
/// `cq` is NULL or a live CQ, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { back::<Cq, _>(cq) }) else {
            return libc::EINVAL;
        };
        // The srdma CQ is shared with the QPs that use it: one clone here, one per QP side.
        if c.cq.users() > 1 {
            return libc::EBUSY;
        }
        // SAFETY: a CQ's context outlives it (verbs rule: objects are destroyed first).
        if let Some(ctx) = unsafe { Context::from_c(c.c.cq.context) } {
            lock(&ctx.sink.cqs).remove(&c.cq.id());
            ctx.sink.forget(cq as usize);
        }
        if !c.channel.is_null() {
            // SAFETY: a CQ keeps its channel alive (destroy_comp_channel refuses while the
            // CQ is registered).
            let ch = unsafe { &*c.channel };
            lock(&ch.cqs).remove(&c.cq.id());
            // As rdma-core: the events `ibv_get_cq_event` gave out must be acknowledged
            // first (those not yet taken are dropped: the channel no longer names the CQ).
            c.events.wait_all_acked();
            // SAFETY: as above.
            unsafe { (*c.channel).c.refcnt -= 1 };
        }
        // SAFETY: live objects came from hand_out::<Cq>.
        drop(unsafe { take_back::<Cq, _>(cq) });
        0
    })
}

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on (`cq->cqe` says so); EINVAL
/// outside 1..=max_cqe or below the completions waiting to be polled, as rxe.
///
/// # Safety
/// `cq` is NULL or a live CQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { back::<Cq, _>(cq) }) else {
            return libc::EINVAL;
        };
        let Ok(n) = usize::try_from(cqe) else {
            return libc::EINVAL;
        };
        match c.cq.resize(n) {
            Ok(()) => {
                // SAFETY: `cq` is live (checked above); the application reads `cqe` only
                // after this call returns, as with rdma-core's providers.
                unsafe { (*cq).cqe = cqe };
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

/// `ibv_get_cq_event`: waits for the next event on `channel` (unless its fd is
/// non-blocking: then -1 with EAGAIN) and names the CQ and its context.
///
/// As rdma-core's read(2) of the kernel's channel, the wait is a cancellation point:
/// `pthread_cancel` ends a thread waiting here within [`CANCEL_SLICE`] (the wait runs with
/// cancellation disabled, in slices, and the cancellation acts between them, in this frame,
/// outside the panic boundary: see `signals`).
///
/// # Safety
/// `channel` is NULL or live; `cq` and `cq_context` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    loop {
        // 1: a blocking wait's slice ended without an event.
        let rc = guard(-1, || {
            crate::signals::without_cancellation(|| get_cq_event(channel, cq, cq_context))
        });
        if rc != 1 {
            return rc;
        }
        // SAFETY: a cancellation point; this frame holds nothing to drop.
        unsafe { crate::signals::testcancel() };
    }
}

/// How long a blocking `ibv_get_cq_event` waits before it lets a pending cancellation act.
///
/// A signal that arrives between two slices (a few microseconds each second) finds the
/// thread outside its wait and does not end it with EINTR, where a kernel's read(2) would
/// have ended; a slice of a second keeps that chance to about 1e-5 per signal, and keeps
/// slices from ending together with the usual timers (`alarm`, interval timers of 100 or
/// 200 ms, which end a wait early and are told apart by the time elapsed).
pub(crate) const CANCEL_SLICE: Duration = Duration::from_millis(1000);

/// `ibv_get_cq_event`'s work: 0 with an event, -1 with errno, 1 when a blocking wait of
/// [`CANCEL_SLICE`] found none.
fn get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: per the contract.
    let Some(ch) = (unsafe { back::<Channel, _>(channel) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    loop {
        // A blocking channel waits in srdma's own `get_event`, which also watches the
        // device's socket (the message wakes this thread, not the progress thread).
        let blocking = !is_nonblocking(ch.c.fd);
        let start = std::time::Instant::now();
        let id = match ch.ch.get_event(Some(if blocking {
            CANCEL_SLICE
        } else {
            Duration::ZERO
        })) {
            Ok(Some(id)) => id,
            Ok(None) => {
                if !blocking {
                    set_errno(libc::EAGAIN);
                    return -1;
                }
                if start.elapsed() >= CANCEL_SLICE {
                    return 1;
                }
                // Ended early without an event: a signal. EINTR, as from the kernel's
                // read(2), if its handler does not restart (qperf's timer ends its
                // event-mode tests so).
                if crate::signals::interrupting_handler_installed() {
                    set_errno(libc::EINTR);
                    return -1;
                }
                continue;
            }
            Err(e) => {
                set_errno(errno_of(&e));
                return -1;
            }
        };
        // An event of a CQ destroyed meanwhile is dropped. The map stays locked until the
        // event is counted as taken, so a destroy (which unregisters first, then waits for
        // the taken events' acknowledgements) cannot fall between.
        let cqs = lock(&ch.cqs);
        let Some(&p) = cqs.get(&id) else {
            continue;
        };
        let p = p as *mut Cq;
        // SAFETY: registered CQs are live (destroy unregisters first); the out-pointers
        // are valid per the contract.
        unsafe {
            (*p).events.taken();
            *cq = p.cast();
            *cq_context = (*p).c.cq.cq_context;
        }
        return 0;
    }
}

/// `ibv_ack_cq_events`: counts `nevents` events of `cq` as handled.
///
/// # Safety
/// `cq` is NULL or a live CQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    guard((), || {
        // SAFETY: per the contract.
        if let Some(c) = unsafe { back::<Cq, _>(cq) } {
            c.events.ack(nevents);
        }
    })
}

pub(super) fn wc_to_c(wc: &Wc, out: &mut ibv_wc) {
    out.wr_id = wc.wr_id;
    out.status = wc.status as u32;
    out.opcode = wc.opcode.as_u32();
    out.vendor_err = wc.vendor_err;
    out.byte_len = wc.byte_len;
    out.imm_data = match (wc.imm_data, wc.invalidated_rkey) {
        (Some(imm), _) => imm.to_be(),
        (None, Some(r)) => r.0,
        _ => 0,
    };
    out.qp_num = wc.qp_num.value();
    out.src_qp = wc.src_qp.value();
    out.wc_flags = wc.wc_flags.bits();
    out.pkey_index = wc.pkey_index;
    out.slid = wc.slid;
    out.sl = wc.sl;
    out.dlid_path_bits = wc.dlid_path_bits;
}

/// `ops.poll_cq`: up to `num_entries` completions into `wc`; their number, or -1 for bad
/// arguments.
pub(super) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard(-1, || {
        // SAFETY: the inline ibv_poll_cq passes a CQ of this context.
        let Some(c) = (unsafe { back_fast::<Cq, _>(cq) }) else {
            return -1;
        };
        if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
            return -1;
        }
        let mut s = lock(&c.scratch);
        s.clear();
        let n = c.cq.poll_into(&mut s, num_entries as usize);
        for (i, w) in s.iter().enumerate().take(n) {
            // SAFETY: `wc` holds `num_entries` >= n entries (the verbs contract).
            wc_to_c(w, unsafe { &mut *wc.add(i) });
        }
        n as c_int
    })
}

/// `ops.req_notify_cq`: arms the CQ for one event.
pub(super) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the inline caller passes a CQ of this context.
        let Some(c) = (unsafe { back_fast::<Cq, _>(cq) }) else {
            return libc::EINVAL;
        };
        c.cq.req_notify(solicited_only != 0);
        0
    })
}

/// The CQ behind an `ibv_cq_ex` of the inline polling API.
///
/// # Safety
/// `cq` is a live CQ of this library (the inline wrappers pass the application's).
pub(super) unsafe fn cq_ex<'a>(cq: *mut ibv_cq_ex) -> Option<&'a Cq> {
    // SAFETY: per the contract.
    unsafe { back_fast::<Cq, _>(cq) }
}

/// Makes the next completion current: 0, or ENOENT when there is none.
pub(super) fn cq_advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the inline caller passes its CQ.
    let Some(c) = (unsafe { cq_ex(cq) }) else {
        return libc::EINVAL;
    };
    match c.cq.poll_one() {
        Some(wc) => {
            // SAFETY: the CQ is live; `status` and `wr_id` are read by the inline API.
            unsafe {
                (*cq).status = wc.status as u32;
                (*cq).wr_id = wc.wr_id;
            }
            *lock(&c.cur) = Some(wc);
            0
        }
        None => libc::ENOENT,
    }
}

/// `ibv_start_poll`.
pub(super) unsafe extern "C" fn cq_start_poll(
    cq: *mut ibv_cq_ex,
    attr: *mut ibv_poll_cq_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: `attr` is NULL or readable (verbs contract).
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        cq_advance(cq)
    })
}

/// `ibv_next_poll`.
pub(super) unsafe extern "C" fn cq_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || cq_advance(cq))
}

/// `ibv_end_poll`.
pub(super) unsafe extern "C" fn cq_end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: the inline caller passes its CQ.
        if let Some(c) = unsafe { cq_ex(cq) } {
            *lock(&c.cur) = None;
        }
    })
}

/// Reads a field of the current completion (0 without one).
pub(super) fn cq_read<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&Wc) -> T) -> T {
    guard(T::default(), || {
        // SAFETY: the inline caller passes its CQ.
        let Some(c) = (unsafe { cq_ex(cq) }) else {
            return T::default();
        };
        lock(&c.cur).as_ref().map(f).unwrap_or_default()
    })
}

/// `ibv_wc_read_opcode`.
pub(super) unsafe extern "C" fn cq_read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    cq_read(cq, |w| w.opcode.as_u32())
}
/// `ibv_wc_read_vendor_err`.
pub(super) unsafe extern "C" fn cq_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.vendor_err)
}
/// `ibv_wc_read_byte_len`.
pub(super) unsafe extern "C" fn cq_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.byte_len)
}
/// `ibv_wc_read_imm_data` (network order; the invalidated R_Key for SEND with invalidate).
pub(super) unsafe extern "C" fn cq_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| match (w.imm_data, w.invalidated_rkey) {
        (Some(imm), _) => imm.to_be(),
        (None, Some(r)) => r.0,
        _ => 0,
    })
}
/// `ibv_wc_read_qp_num`.
pub(super) unsafe extern "C" fn cq_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.qp_num.value())
}
/// `ibv_wc_read_src_qp`.
pub(super) unsafe extern "C" fn cq_read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.src_qp.value())
}
/// `ibv_wc_read_wc_flags`.
pub(super) unsafe extern "C" fn cq_read_wc_flags(cq: *mut ibv_cq_ex) -> std::ffi::c_uint {
    cq_read(cq, |w| w.wc_flags.bits())
}
/// `ibv_wc_read_slid`.
pub(super) unsafe extern "C" fn cq_read_slid(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| u32::from(w.slid))
}
/// `ibv_wc_read_sl`.
pub(super) unsafe extern "C" fn cq_read_sl(cq: *mut ibv_cq_ex) -> u8 {
    cq_read(cq, |w| w.sl)
}
/// `ibv_wc_read_dlid_path_bits`.
pub(super) unsafe extern "C" fn cq_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    cq_read(cq, |w| w.dlid_path_bits)
}
