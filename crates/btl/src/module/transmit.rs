//! The transmit queue: send credits, the one queue of sends waiting for a
//! credit, the batch of datagrams posted together, and posting a datagram on
//! the queue pair of its route. Every datagram the module sends leaves
//! through here.

use std::collections::VecDeque;

use udbtl_fabric::{Context, Gather, PostError, QpHandle, SendFlags, SendWr, Sge};
use udbtl_wire::datagram::Epochs;
use udbtl_wire::rel;

use super::descriptors::Frags;
use super::endpoints::Route;
use crate::frag::Descriptor;

/// A send waiting for a send credit.
#[derive(Debug, Clone, Copy)]
pub(super) struct WaitingSend {
    pub(super) des: Descriptor,
    /// The reliability header to stamp on it when it is posted, and the
    /// epochs its seal covers; `None` on an unreliable module.
    pub(super) header: Option<(rel::Repr, Epochs)>,
    /// Whether the fragment was posted before (`Transmit::retransmission`).
    pub(super) resend: bool,
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

    /// Gives the waiting send of `des` the newer `header`: it leaves once,
    /// with the newest. `false` if `des` does not wait.
    pub(super) fn restamp(&mut self, des: Descriptor, header: (rel::Repr, Epochs)) -> bool {
        let Some(send) = self.waiting.iter_mut().find(|s| s.des == des) else {
            return false;
        };
        send.header = Some(header);
        true
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

/// Most datagrams gathered into one `post_send`: a batch the provider can
/// send with one system call, and where consecutive equal datagrams to one
/// peer become one GSO train.
pub(super) const POST_BATCH: usize = 32;

/// A datagram waiting in the [`PostBatch`]: a send work request without
/// borrows, so that it can wait while the engine keeps working.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueuedPost {
    pub(super) route: Route,
    /// The registered bytes, from the BTL header on.
    pub(super) head: Sge,
    /// A descriptor whose caller bytes follow `head`, if it has any.
    pub(super) user: Option<Descriptor>,
    pub(super) wr_id: u64,
    /// Signaled sends hold a send credit, returned by their completion.
    pub(super) signaled: bool,
}

impl QueuedPost {
    /// The datagram of descriptor `des` to `route`: its registered bytes at
    /// `head`, then the descriptor's caller bytes if `with_user`. Signaled:
    /// it holds a send credit until its completion.
    pub(super) fn data(route: Route, des: Descriptor, head: Sge, with_user: bool) -> Self {
        Self {
            route,
            head,
            user: with_user.then_some(des),
            wr_id: u64::from(des.raw()),
            signaled: true,
        }
    }

    /// Fills `out` with the datagram's gather list, and returns its length:
    /// the registered head, then the caller's bytes of a user fragment.
    fn gathers<'a>(&self, frags: &'a Frags, out: &mut [Gather<'a>; 2]) -> usize {
        out[0] = Gather::Registered(self.head);
        match self.user.and_then(|des| frags.user_bytes(des)) {
            Some((lkey, data)) => {
                out[1] = Gather::User { lkey, data };
                2
            }
            None => 1,
        }
    }
}

/// Datagrams queued during one flush of the send side and posted together.
///
/// Its capacity is reserved once: queueing never allocates.
#[derive(Debug)]
struct PostBatch {
    posts: Vec<QueuedPost>,
}

impl PostBatch {
    fn new() -> Self {
        Self {
            posts: Vec::with_capacity(POST_BATCH),
        }
    }

    /// Adds a datagram; returns `true` when the batch is now full and must
    /// be posted before the next is added.
    fn push(&mut self, post: QueuedPost) -> bool {
        self.posts.push(post);
        self.posts.len() >= POST_BATCH
    }
}

/// What became of the datagrams of one [`TransmitQueue::flush`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct BatchOutcome {
    /// Signaled datagrams posted.
    pub(super) posted_signaled: usize,
    /// Refused by the fabric: lost, to the peer.
    pub(super) refused: usize,
    /// Of the refused, those that held a send credit.
    pub(super) refused_signaled: usize,
}

/// The transmit queue: the send credits and the sends waiting for them, the
/// batch being gathered, and what every post shares (the queue pairs, the
/// queue key, the inline threshold).
#[derive(Debug)]
pub(super) struct TransmitQueue {
    /// Send credits and the sends waiting for them.
    pub(super) sends: SendQueue,
    batch: PostBatch,
    /// The number of the batch being gathered: one more each time one is
    /// posted.
    batch_number: u64,
    qps: Vec<QpHandle>,
    inline_max: usize,
}

impl TransmitQueue {
    /// A transmit queue over `qps` with `credits` send credits.
    pub(super) fn new(qps: Vec<QpHandle>, inline_max: usize, credits: u32) -> Self {
        Self {
            sends: SendQueue::new(credits),
            batch: PostBatch::new(),
            batch_number: 0,
            qps,
            inline_max,
        }
    }

    /// The send work request for one datagram gathered from `sg_list`,
    /// inline when it fits.
    fn work_request<'a>(
        &self,
        route: &Route,
        sg_list: &'a [Gather<'a>],
        wr_id: u64,
        signaled: bool,
    ) -> SendWr<'a> {
        let total: usize = sg_list.iter().map(Gather::len).sum();
        let mut flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        if total <= self.inline_max {
            flags = flags | SendFlags::INLINE;
        }
        SendWr {
            wr_id,
            sg_list,
            ah: route.ah,
            remote_qpn: route.remote_qpn,
            remote_qkey: route.remote_qkey,
            imm: None,
            flags,
        }
    }

    /// The route's queue pair; the first if the module has fewer (as the
    /// receiver assumes of a peer that publishes fewer).
    fn qp(&self, route: &Route) -> QpHandle {
        *self.qps.get(route.qp_index).unwrap_or(&self.qps[0])
    }

    /// Posts one signaled datagram gathered from `sg_list` on its route's
    /// queue pair, at once, taking a send credit; its completion carries
    /// `wr_id` and returns the credit. On failure no credit is taken.
    pub(super) fn post_now<C: Context>(
        &mut self,
        ctx: &mut C,
        route: &Route,
        sg_list: &[Gather<'_>],
        wr_id: u64,
    ) -> Result<(), PostError> {
        let wr = self.work_request(route, sg_list, wr_id, true);
        ctx.post_send(self.qp(route), &[wr])?;
        self.sends.take_credit();
        Ok(())
    }

    /// The number of the batch being gathered: a datagram queued now leaves
    /// with it, at the latest when this number has moved on.
    pub(super) const fn batch_number(&self) -> u64 {
        self.batch_number
    }

    /// Adds a datagram to the batch, taking a send credit if it is
    /// signaled; when that fills the batch, posts it and says what became
    /// of it.
    pub(super) fn queue<C: Context>(
        &mut self,
        ctx: &mut C,
        frags: &Frags,
        post: QueuedPost,
    ) -> Option<BatchOutcome> {
        if post.signaled {
            self.sends.take_credit();
        }
        self.batch.push(post).then(|| self.flush(ctx, frags))
    }

    /// Posts every datagram of the batch, in order, and empties it: each run
    /// bound for one queue pair goes in one `post_send`. A datagram the
    /// fabric refuses is skipped and the rest still go; the credit it held
    /// comes back at once.
    pub(super) fn flush<C: Context>(&mut self, ctx: &mut C, frags: &Frags) -> BatchOutcome {
        // A lone datagram (a ping-pong's) prepares one request, not a batch.
        let outcome = match self.batch.posts.len() {
            0 => return BatchOutcome::default(),
            1 => self.post_all::<C, 1>(ctx, frags, &self.batch.posts),
            _ => self.post_all::<C, POST_BATCH>(ctx, frags, &self.batch.posts),
        };
        self.batch.posts.clear();
        self.batch_number += 1;
        for _ in 0..outcome.refused_signaled {
            self.sends.return_credit();
        }
        outcome
    }

    /// [`flush`](Self::flush) for at most `N` datagrams.
    fn post_all<C: Context, const N: usize>(
        &self,
        ctx: &mut C,
        frags: &Frags,
        posts: &[QueuedPost],
    ) -> BatchOutcome {
        let mut outcome = BatchOutcome::default();
        let posts = &posts[..posts.len().min(N)];
        let Some(first) = posts.first() else {
            return outcome;
        };
        // Unused slots keep a filler that is never posted.
        let mut gathers = [[Gather::Registered(first.head); 2]; N];
        let mut lens = [1usize; N];
        for (i, post) in posts.iter().enumerate() {
            lens[i] = post.gathers(frags, &mut gathers[i]);
        }
        let filler = self.work_request(&first.route, &[], 0, false);
        let mut wrs = [filler; N];
        for (i, post) in posts.iter().enumerate() {
            wrs[i] = self.work_request(
                &post.route,
                &gathers[i][..lens[i]],
                post.wr_id,
                post.signaled,
            );
        }
        let mut start = 0;
        while start < posts.len() {
            let qp = self.qp(&posts[start].route);
            let end = start
                + posts[start..]
                    .iter()
                    .take_while(|p| self.qp(&p.route) == qp)
                    .count();
            let mut next = start;
            while next < end {
                match ctx.post_send(qp, &wrs[next..end]) {
                    Ok(()) => next = end,
                    Err(err) => {
                        // The request it names was refused; those before
                        // it were posted. (Clamped: a provider that blames
                        // a request past the run must not end the loop.)
                        let refused = (next + err.posted).min(end - 1);
                        tracing::trace!(error = %err.error, "datagram refused by the fabric");
                        outcome.refused += 1;
                        outcome.refused_signaled += usize::from(posts[refused].signaled);
                        next = refused + 1;
                    }
                }
            }
            start = end;
        }
        outcome.posted_signaled =
            posts.iter().filter(|p| p.signaled).count() - outcome.refused_signaled;
        outcome
    }
}
