//! The receive path: the pool of receive buffers posted on queue pair 0,
//! checking each received datagram's BTL header, dispatching it (to the
//! caller's queue of deliveries, or to the reliable path), and reposting
//! buffers in one call at the end of a progress call.

use udbtl_fabric::{
    Context, GRH_LEN, Mr, PostError, QpHandle, RecvWr, Sge, WcStatus, WorkCompletion,
};
use udbtl_reliability::Instant;
use udbtl_wire::{btl, rel};

use super::Engine;
use super::delivery::{Delivery, Held};
use crate::{NUM_WC, Tag};

/// The receive buffers: one registration cut into `count` buffers of
/// `stride` bytes, each posted with room for the GRH in front.
#[derive(Debug)]
pub(super) struct RecvPool {
    pub(super) mr: Mr,
    pub(super) stride: usize,
    pub(super) count: usize,
    qp: QpHandle,
    /// Buffers consumed during this progress call, reposted at its end.
    reposts: Vec<RecvWr>,
    /// Where `poll_cq` writes completions.
    pub(super) wcs: Box<[WorkCompletion]>,
    /// Buffers the reliability state holds for datagrams that arrived early.
    pub(super) early_held: usize,
    /// Per buffer: host events still out for the records of the coalesced
    /// datagram it holds (`deliver.rs`); it is reposted when the last one is
    /// finished. Sized once, so that splitting never allocates.
    pub(super) shares: Box<[u32]>,
    /// Buffers no early or undeliverable datagram may take: however many
    /// peers have gaps, the next in-order datagram of any of them (and every
    /// acknowledgement) always finds a posted buffer, so no stream can stall
    /// for want of one.
    reserve: usize,
}

/// The work request that posts buffer `slot` of a pool of `stride`-byte
/// buffers in `mr`; its id is the slot.
pub(super) fn recv_work_request(mr: Mr, stride: usize, slot: u32) -> RecvWr {
    RecvWr {
        wr_id: u64::from(slot),
        sge: Sge {
            lkey: mr.lkey,
            offset: slot as usize * stride,
            len: stride,
        },
    }
}

impl RecvPool {
    pub(super) fn new(mr: Mr, stride: usize, count: usize, qp: QpHandle) -> Self {
        Self {
            mr,
            stride,
            count,
            qp,
            reposts: Vec::with_capacity(NUM_WC),
            wcs: vec![WorkCompletion::EMPTY; NUM_WC].into_boxed_slice(),
            early_held: 0,
            shares: vec![0; count].into_boxed_slice(),
            reserve: (count / 4).clamp(1, 256),
        }
    }

    /// Buffers held beyond the current call: early datagrams, and, while the
    /// application is away, in-order datagrams waiting for it.
    fn held(&self, held_for_app: usize, app_present: bool) -> usize {
        self.early_held + if app_present { 0 } else { held_for_app }
    }

    /// Whether one more buffer may be held without touching the reserve.
    pub(super) fn may_hold(&self, held_for_app: usize, app_present: bool) -> bool {
        self.held(held_for_app, app_present) + 1 + self.reserve <= self.count
    }

    /// What the peers' credit is made of (`Reliability::share_credit`):
    /// the buffers free beyond the reserve, which the peers that send share,
    /// and the least credit any peer gets. While the application runs, an
    /// in-order datagram is taken whatever is held, so every peer gets at
    /// least one (a pool of one buffer still moves); what that overcommits
    /// is refused and retransmitted, never lost. While the application is
    /// away the floor is zero: senders then wait, and hear when room comes
    /// back.
    pub(super) fn credit_room(&self, held_for_app: usize, app_present: bool) -> (usize, u16) {
        let free = self
            .count
            .saturating_sub(self.reserve + self.held(held_for_app, app_present));
        (free, u16::from(app_present || free > 0))
    }

    /// Queues buffer `slot` for reposting at the end of the progress call.
    pub(super) fn repost(&mut self, slot: u32) {
        let wr = recv_work_request(self.mr, self.stride, slot);
        self.reposts.push(wr);
    }

    /// Posts every buffer queued by [`repost`](Self::repost), in one call.
    pub(super) fn flush<C: Context>(&mut self, ctx: &mut C) -> Result<(), PostError> {
        if self.reposts.is_empty() {
            return Ok(());
        }
        let result = ctx.post_recv(self.qp, &self.reposts);
        self.reposts.clear();
        result
    }

    /// The datagram held in buffer `held.slot` (after the GRH).
    pub(super) fn datagram<'a, C: Context>(&self, ctx: &'a C, held: Held) -> Option<&'a [u8]> {
        ctx.mr_bytes(self.mr.handle).ok()?.get(self.range(held))
    }

    /// The datagram held in buffer `held.slot`, writable (to decrypt it in
    /// place).
    pub(super) fn datagram_mut<'a, C: Context>(
        &self,
        ctx: &'a mut C,
        held: Held,
    ) -> Option<&'a mut [u8]> {
        ctx.mr_bytes_mut(self.mr.handle)
            .ok()?
            .get_mut(self.range(held))
    }

    fn range(&self, held: Held) -> core::ops::Range<usize> {
        let start = held.slot as usize * self.stride + GRH_LEN;
        start..start + held.len as usize
    }
}

impl<C: Context> Engine<C> {
    /// A receive completion: checks the BTL header and the job key, then
    /// hands the datagram to the reliable path or, on an unreliable module,
    /// straight to its tag callback.
    pub(super) fn on_receive(&mut self, wc: &WorkCompletion, now: Instant) {
        let slot = wc.wr_id as u32;
        if wc.status != WcStatus::Success {
            self.stats.recv_errors += 1;
            self.recv.repost(slot);
            return;
        }
        let held = Held {
            slot,
            len: wc.payload_len() as u32,
        };
        let header = self.recv.datagram(&self.ctx, held).and_then(|d| {
            btl::Packet::new_checked(d)
                .and_then(|p| btl::Repr::parse(&p))
                .ok()
        });
        let Some(header) = header else {
            self.stats.recv_malformed += 1;
            self.recv.repost(slot);
            return;
        };
        let job_key = header.job_key ^ self.admission.job_key_mask;
        if !self.accepts_job(job_key) {
            self.stats.recv_bad_job_key += 1;
            self.recv.repost(slot);
            return;
        }
        match (header.reliable, self.path.is_reliable(), wc.src) {
            (true, true, Some(src)) => self.on_reliable_receive(held, src, job_key, now),
            (false, false, Some(src)) => {
                let endpoint = self.endpoints.lookup(src);
                self.hold_for_app(Delivery {
                    held,
                    header_len: btl::HEADER_LEN,
                    tag: Tag(header.tag),
                    endpoint,
                    src,
                    flags: rel::FLAG_FIRST | rel::FLAG_LAST,
                });
            }
            // A peer configured differently, or no source address.
            _ => {
                self.stats.recv_malformed += 1;
                self.recv.repost(slot);
            }
        }
    }
}
