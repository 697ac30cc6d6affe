//! Receiving on a socket with UDP GRO on: one `recvmsg` per datagram or
//! coalesced train, spread over the posted buffers so that each datagram
//! lands in a buffer of its own without a copy.
//!
//! [`sys::recv_scattered`] fills `slot` bytes (the port's longest datagram)
//! of each front posted buffer in turn (as many as the longest recent train
//! needed: one for a socket that gets single datagrams), then the spill
//! space. A train of full-sized datagrams, what a stream of large messages
//! sends, is then in place. Any other train is put right here: datagram `k`
//! moves to buffer `k`. With a shorter stride, datagram `k` starts at byte
//! `k * stride`, at or before buffer `k`, so moving from the last datagram
//! to the first never overwrites bytes still to move: they all lie below
//! the buffer being written. With a longer stride (junk, or a peer with a
//! larger MTU), datagram `k` starts at or after buffer `k`, and the first
//! moves first. Within one datagram the part already in its own buffer
//! moves first.

use std::net::IpAddr;
use std::os::fd::AsFd;

use udbtl_wire::ud;

use super::recv::{Arrival, INVALID_QP, Kept, Receiver, SCATTER_IDLE_POLLS, UdpQp, parse_header};
use super::sys::{self, SKIP};
use crate::bookkeeping::{Memory, Verbs, cq_in};
use crate::{CqHandle, FabricError, MrHandle, QpHandle, Result};

/// Where the bytes of one scattered receive lie: `slot` bytes at each
/// buffer start (`offset + SKIP` of a target), then the spill space.
struct Scattered<'a> {
    targets: &'a [(usize, usize)],
    slot: usize,
}

impl Scattered<'_> {
    /// Moves received bytes `begin..begin + len` to `region[dest..]`, the
    /// start of buffer `own` when that is one the bytes were spread over:
    /// the part already in that buffer moves first (within the buffer),
    /// then the parts elsewhere, which cannot overlap it. `None` if a range
    /// falls outside its slice: the datagram is then dropped as malformed.
    fn move_to(
        &self,
        region: &mut [u8],
        spill: &[u8],
        (begin, len): (usize, usize),
        dest: usize,
        own: Option<usize>,
    ) -> Option<()> {
        let end = begin + len;
        let in_buffers = self.targets.len() * self.slot;
        let fits =
            |at: usize, n: usize, within: usize| at.checked_add(n).is_some_and(|e| e <= within);
        let spilled_from = begin.max(in_buffers);
        if !fits(dest, len, region.len())
            || !fits(
                spilled_from - in_buffers,
                end.saturating_sub(spilled_from),
                spill.len(),
            )
        {
            return None;
        }
        // The part of buffer `b` the bytes cover, as a range of them.
        let part = |b: usize| (b * self.slot).max(begin)..((b + 1) * self.slot).min(end);
        let copy_part = |b: usize, region: &mut [u8]| -> Option<()> {
            let bytes = part(b);
            let (offset, _) = *self.targets.get(b)?;
            let src = offset + SKIP + (bytes.start - b * self.slot);
            let n = bytes.end - bytes.start;
            if !fits(src, n, region.len()) {
                return None;
            }
            region.copy_within(src..src + n, dest + (bytes.start - begin));
            Some(())
        };
        if let Some(b) = own.filter(|&b| !part(b).is_empty()) {
            copy_part(b, region)?;
        }
        let first = begin / self.slot;
        let last = end.min(in_buffers).div_ceil(self.slot);
        for b in (first..last).filter(|&b| Some(b) != own) {
            copy_part(b, region)?;
        }
        if end > spilled_from {
            let from = spilled_from - in_buffers;
            let n = end - spilled_from;
            let at = dest + (spilled_from - begin);
            region[at..at + n].copy_from_slice(&spill[from..from + n]);
        }
        Some(())
    }
}

impl Receiver {
    /// Receives trains (or single datagrams) on GRO queue pair `qp` until
    /// the socket is empty, `budget` completions are queued, or no buffer
    /// is posted; returns how many completions it queued.
    pub(super) fn receive_trains(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
        budget: usize,
    ) -> Result<usize> {
        let mut queued = 0;
        while queued < budget {
            let entry = verbs.qp(qp)?;
            let Some(first) = entry.recv_queue.front().copied() else {
                self.discard_unbuffered(verbs, qp)?;
                break;
            };
            let (cq, slot) = (entry.recv_cq, entry.transport.rx.slot);
            let mut count = 0;
            for wr in entry.recv_queue.iter().take(entry.transport.rx.scatter) {
                if wr.sge.lkey != first.sge.lkey {
                    break;
                }
                self.scratch.targets[count] = (wr.sge.offset, wr.sge.len);
                count += 1;
            }
            let mr = verbs.owned_range(first.sge, entry.pd)?;
            let Verbs { mrs, qps, .. } = &mut *verbs;
            let socket = &qps.get(qp.0).ok_or(INVALID_QP)?.transport.socket;
            let Some(Memory::Owned(region)) = mrs.get_mut(mr.0).map(|m| &mut m.memory) else {
                return Err(FabricError::ProtectionError {
                    lkey: first.sge.lkey,
                });
            };
            let spill = self.spill.as_deref_mut().unwrap_or_default();
            let meta = &mut self.scratch.meta[0];
            let targets = &self.scratch.targets[..count];
            let scattered = sys::recv_scattered(socket.as_fd(), region, targets, slot, spill, meta)
                .map_err(|source| FabricError::Io {
                    operation: "recvmsg",
                    source,
                })?;
            let rx = &mut verbs.qp_mut(qp)?.transport.rx;
            let Some(scattered) = scattered else {
                rx.idle_polls = rx.idle_polls.saturating_add(1);
                if rx.idle_polls >= SCATTER_IDLE_POLLS {
                    rx.scatter = 1;
                }
                break;
            };
            let meta = &self.scratch.meta[0];
            let segments = match meta.stride {
                0 => 1,
                stride => meta.len.div_ceil(stride),
            };
            rx.idle_polls = 0;
            rx.scatter = rx.scatter.max(segments).min(sys::MAX_SCATTER);
            queued += self.complete_train(verbs, qp, cq, mr, scattered, slot)?;
        }
        Ok(queued)
    }

    /// Turns what the last [`sys::recv_scattered`] brought in, spread over
    /// the first `scattered` targets of the scratch space and then the
    /// spill space, into one completion per datagram, each in a front
    /// posted buffer of `qp`. A datagram that is malformed or carries the
    /// wrong keys leaves its buffer posted; datagrams for which no buffer is
    /// posted, or the completion queue has no room, are dropped, as UD drops
    /// them.
    fn complete_train(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
        cq: CqHandle,
        mr: MrHandle,
        scattered: usize,
        slot: usize,
    ) -> Result<usize> {
        let meta = self.scratch.meta[0];
        let Verbs {
            qps,
            cqs,
            mrs,
            stats,
            ..
        } = &mut *verbs;
        let entry = qps.get_mut(qp.0).ok_or(INVALID_QP)?;
        let cq = cq_in(cqs, cq)?;
        let Some(Memory::Owned(region)) = mrs.get_mut(mr.0).map(|m| &mut m.memory) else {
            return Err(FabricError::InvalidHandle {
                kind: "memory region",
            });
        };
        let Some(first) = entry.recv_queue.front().copied() else {
            return Ok(0);
        };
        let train = meta.stride > 0 && meta.len > meta.stride;
        if meta.len == 0 {
            stats.rx_malformed += 1;
            return Ok(0);
        }
        let stride = if train { meta.stride } else { meta.len };
        let segments = meta.len.div_ceil(stride);
        if (meta.truncated && !train) || SKIP + stride > first.sge.len {
            // Longer than the buffers posted: the first completes in error,
            // as verbs reports it, and a train of such datagrams counts
            // each (junk that does not parse counts as malformed instead).
            let Some(repr) = parse_header(&meta.header, meta.len) else {
                stats.rx_malformed += segments as u64;
                return Ok(0);
            };
            if !entry.admit(repr.pkey, repr.qkey, stats) || cq.room() == 0 {
                return Ok(0);
            }
            stats.rx_too_long += segments as u64;
            entry.recv_queue.pop_front();
            let wc = Arrival::TooLong.of(first.wr_id, entry.qp_num, meta.source, &repr);
            cq.push(wc, qp);
            return Ok(1);
        }
        // Whole datagrams only: a truncated train loses its cut tail.
        let whole = if meta.truncated {
            meta.len / stride
        } else {
            meta.len.div_ceil(stride)
        };
        // Each datagram's buffer: the front posted ones (the first
        // `scattered` are where the bytes landed), in the same registration
        // and long enough, as many as the completion queue has room for.
        let mut usable = 0;
        let take = whole.min(cq.room()).min(sys::MAX_SCATTER);
        for wr in entry.recv_queue.iter().take(take) {
            if wr.sge.lkey != first.sge.lkey || wr.sge.len < SKIP + stride {
                break;
            }
            self.scratch.targets[usable] = (wr.sge.offset, wr.sge.len);
            usable += 1;
        }
        stats.rx_no_buffer += (whole - usable + usize::from(meta.truncated)) as u64;
        let spill = self.spill.as_deref().unwrap_or_default();
        let layout = Scattered {
            targets: &self.scratch.targets[..scattered],
            slot,
        };
        // Datagrams shorter than a slot start at or before their buffer and
        // move last first; longer ones (junk, or a peer with a larger MTU)
        // start at or after it and move first first: either way no move
        // overwrites bytes still to be moved.
        let mut moved = [true; sys::MAX_SCATTER];
        let order: &mut dyn Iterator<Item = usize> = if stride <= slot {
            &mut (0..usable).rev()
        } else {
            &mut (0..usable)
        };
        for k in order {
            let in_place = k < scattered && stride <= slot && (k == 0 || stride == slot);
            if !in_place {
                let begin = k * stride;
                let dest = self.scratch.targets[k].0 + SKIP;
                let own = (k < scattered).then_some(k);
                let bytes = (begin, stride.min(meta.len - begin));
                moved[k] = layout.move_to(region, spill, bytes, dest, own).is_some();
            }
        }
        let mut kept = Kept::new();
        let mut queued = 0;
        for (k, &ok) in moved.iter().enumerate().take(usable) {
            let Some(wr) = entry.recv_queue.pop_front() else {
                break;
            };
            let len = stride.min(meta.len - k * stride);
            let at = wr.sge.offset + SKIP;
            let have = ud::HEADER_LEN.min(len);
            let mut header = [0; ud::HEADER_LEN];
            let header = region.get(at..at + have).filter(|_| ok).map(|bytes| {
                header[..have].copy_from_slice(bytes);
                &header
            });
            let Some(repr) = kept.admit(entry, stats, wr, header, len) else {
                continue;
            };
            let payload = len - ud::HEADER_LEN;
            stats.rx_datagrams += 1;
            stats.rx_bytes += payload as u64;
            let wc = Arrival::Whole { payload }.of(wr.wr_id, entry.qp_num, meta.source, &repr);
            cq.push(wc, qp);
            queued += 1;
        }
        if usable > 1 {
            stats.rx_gro_trains += 1;
        }
        kept.restore(&mut entry.recv_queue);
        Ok(queued)
    }
}
