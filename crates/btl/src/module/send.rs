//! The send path: send credits, the one queue of sends waiting for a credit,
//! and posting a datagram on the queue pair of its route.

use std::collections::VecDeque;

use udbtl_fabric::{Context, Gather, PostError, QpHandle, SendFlags, SendWr};
use udbtl_wire::rel;

use super::endpoints::Route;
use crate::frag::Descriptor;

/// A send waiting for a send credit.
#[derive(Debug, Clone, Copy)]
pub(super) struct WaitingSend {
    pub(super) des: Descriptor,
    /// The reliability header to stamp on it when it is posted; `None` on an
    /// unreliable module.
    pub(super) header: Option<rel::Repr>,
}

/// Send credits and the sends waiting for them.
///
/// A credit is one signaled send work request the queue pairs can hold
/// (`sd_num`, shared by the module's queue pairs as in the seed). A send
/// that finds none waits here, in order, and later sends queue behind it so
/// that order holds; each send completion posts the oldest. Reliable and
/// unreliable sends share this one queue: the reliability state has its own
/// backlog for sends its window holds back, but once sequenced a datagram
/// only waits for a credit, like any other.
#[derive(Debug)]
pub(super) struct SendQueue {
    credits: u32,
    waiting: VecDeque<WaitingSend>,
    /// Deepest the queue has been.
    pub(super) high_water: usize,
    /// Sends that had to wait.
    pub(super) queued_total: u64,
}

impl SendQueue {
    pub(super) fn new(credits: u32) -> Self {
        Self {
            credits,
            waiting: VecDeque::new(),
            high_water: 0,
            queued_total: 0,
        }
    }

    /// `true` when a send may be posted now without overtaking a waiting one.
    pub(super) fn can_post(&self) -> bool {
        self.credits > 0 && self.waiting.is_empty()
    }

    pub(super) fn credits(&self) -> u32 {
        self.credits
    }

    pub(super) fn take_credit(&mut self) {
        self.credits -= 1;
    }

    /// A signaled send completed, or a post that took a credit was undone.
    pub(super) fn return_credit(&mut self) {
        self.credits += 1;
    }

    /// Queues a send behind the waiting ones.
    pub(super) fn push(&mut self, send: WaitingSend) {
        self.waiting.push_back(send);
        self.queued_total += 1;
        self.high_water = self.high_water.max(self.waiting.len());
    }

    /// The oldest waiting send, if a credit is free for it.
    pub(super) fn pop_ready(&mut self) -> Option<WaitingSend> {
        if self.credits == 0 {
            return None;
        }
        self.waiting.pop_front()
    }

    /// Removes and returns the waiting sends `drop` selects, keeping the
    /// order of the rest.
    pub(super) fn remove_where(
        &mut self,
        mut drop: impl FnMut(&WaitingSend) -> bool,
    ) -> Vec<WaitingSend> {
        let mut removed = Vec::new();
        self.waiting.retain(|send| {
            let gone = drop(send);
            if gone {
                removed.push(*send);
            }
            !gone
        });
        removed
    }

    /// Forgets every waiting send (teardown).
    pub(super) fn clear(&mut self) {
        self.waiting.clear();
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }
}

/// Everything about a post that does not depend on the datagram.
#[derive(Debug, Clone, Copy)]
pub(super) struct Poster<'a> {
    pub(super) qps: &'a [QpHandle],
    pub(super) qkey: u32,
    pub(super) inline_max: usize,
}

impl Poster<'_> {
    /// Posts one datagram gathered from `sg_list` on its route's queue pair,
    /// inline when it fits. A signaled send produces a completion carrying
    /// `wr_id`; the caller accounts for the credit it takes.
    pub(super) fn post<C: Context>(
        &self,
        ctx: &mut C,
        route: &Route,
        sg_list: &[Gather<'_>],
        wr_id: u64,
        signaled: bool,
    ) -> Result<(), PostError> {
        let total: usize = sg_list.iter().map(Gather::len).sum();
        let mut flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        if total <= self.inline_max {
            flags = flags | SendFlags::INLINE;
        }
        let wr = SendWr {
            wr_id,
            sg_list,
            ah: route.ah,
            remote_qpn: route.remote_qpn,
            remote_qkey: self.qkey,
            imm: None,
            flags,
        };
        ctx.post_send(self.qps[route.qp_index % self.qps.len()], &[wr])
    }
}
