//! Shared receive queues: one pool of receive WQEs feeding many QPs.

use std::collections::VecDeque;

use crate::wr::{PostError, RecvWr};

/// A shared receive queue. The engine owns it and lends it to the QP that receives a packet
/// (through [`crate::transport::Ctx::srq`]).
#[derive(Debug)]
pub struct Srq {
    wqes: VecDeque<RecvWr>,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
    limit_reached: bool,
}

impl Srq {
    /// An SRQ holding up to `max_wr` receive WQEs of up to `max_sge` SGEs each.
    pub fn new(max_wr: u32, max_sge: u32) -> Self {
        Srq {
            wqes: VecDeque::with_capacity(max_wr as usize),
            max_wr,
            max_sge,
            limit: 0,
            limit_reached: false,
        }
    }

    /// Posts a receive WQE.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if wr.sges.len() > self.max_sge as usize {
            return Err(PostError::TooManySges {
                num: wr.sges.len(),
                max: self.max_sge,
            });
        }
        if self.wqes.len() >= self.max_wr as usize {
            return Err(PostError::QueueFull {
                queue: "shared receive",
                max: self.max_wr,
            });
        }
        self.wqes.push_back(wr);
        Ok(())
    }

    /// Arms the SRQ limit event (`ibv_modify_srq` with `srq_limit`): when fewer than `limit`
    /// WQEs remain, [`Srq::take_limit_event`] reports it once.
    pub fn set_limit(&mut self, limit: u32) {
        self.limit = limit;
        self.limit_reached = false;
    }

    /// The armed limit, 0 when none is armed (`ibv_query_srq`'s `srq_limit`: 0 again once
    /// the event fired).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The most WQEs the queue holds.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// True once after the queue fell below the armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`);
    /// the limit is then disarmed, as in verbs.
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }

    /// Number of posted WQEs.
    pub fn len(&self) -> usize {
        self.wqes.len()
    }

    /// True when no WQE is posted.
    pub fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }

    /// Returns a WQE taken for a message that was abandoned (UC), to be reused first.
    pub(crate) fn push_front(&mut self, wr: RecvWr) {
        self.wqes.push_front(wr);
    }

    pub(crate) fn pop(&mut self) -> Option<RecvWr> {
        let wr = self.wqes.pop_front()?;
        if self.limit > 0 && (self.wqes.len() as u32) < self.limit {
            self.limit = 0;
            self.limit_reached = true;
        }
        Some(wr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::SgeList;

    fn wr(id: u64) -> RecvWr {
        RecvWr {
            wr_id: id,
            sges: SgeList::new(),
        }
    }

    #[test]
    fn the_limit_fires_once_when_the_queue_falls_below_it_then_disarms() {
        let mut q = Srq::new(8, 1);
        for i in 0..4 {
            q.post(wr(i)).unwrap();
        }
        q.set_limit(3);
        assert_eq!(q.limit(), 3);
        q.pop().unwrap(); // 3 left: not below 3
        assert!(!q.take_limit_event());
        q.pop().unwrap(); // 2 left
        assert!(q.take_limit_event());
        assert!(!q.take_limit_event(), "reported once");
        assert_eq!(q.limit(), 0, "disarmed, as ibv_query_srq then says");
        q.pop().unwrap();
        assert!(!q.take_limit_event(), "a disarmed limit stays quiet");
        // Armed again below the current count: the next pop fires it.
        q.set_limit(2);
        q.pop().unwrap();
        assert!(q.take_limit_event());
    }

    #[test]
    fn no_limit_no_event() {
        let mut q = Srq::new(4, 1);
        q.post(wr(1)).unwrap();
        q.pop().unwrap();
        assert!(!q.take_limit_event());
    }
}
