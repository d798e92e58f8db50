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
