//! Datagrams longer than the path's MTU ([`udbtl_wire::segment`]).
//!
//! A port that segments carries UD datagrams of up to [`MAX_PIECES`]
//! packets (23 408 bytes at MTU 1500), where the path's MTU would
//! otherwise hold each to one packet: the layers above then pay their
//! per-datagram costs (headers, checksums, acknowledgements, completions)
//! once per 16 packets, and the kernel still sees MTU-sized packets, cut
//! by GSO and usually joined again by GRO.
//!
//! Sending: [`build`] lays a datagram out as its pieces, each behind its
//! segment header, in the sender's scratch space, which leaves as one GSO
//! send. Receiving: a datagram whose pieces all came in one receive, what
//! GRO makes of a GSO send, is put together straight in the front posted
//! buffer ([`Receiver::receive_segmented`]); pieces that came apart (no GRO,
//! or a train GRO split) wait in a small table of partial datagrams, one per
//! sender ([`Partials`]), and a datagram missing a piece is dropped whole,
//! as a lost datagram, and counted.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use udbtl_wire::{segment, ud};

use super::MAX_UDP_PAYLOAD_V4;
use super::recv::{Arrival, INVALID_QP, Receiver, UdpQp, parse_header};
use super::sys::{self, SKIP};
use crate::bookkeeping::{CqEntry, Memory, QpEntry, Verbs, cq_in};
use crate::{FabricError, FabricStats, QpHandle, Result};

/// Most senders with a datagram partly received at once, per context: the
/// oldest is dropped to make room for another.
const PARTIALS_MAX: usize = 8;

/// The longest packet payload a port cuts datagrams for. Cutting costs a
/// copy at each end; at MTU 1500 it saves far more (Open MPI 1 MiB
/// bandwidth across a veth pair: about 1 800 MB/s uncut, 2 800 to 3 000
/// cut), while with 9 000-byte packets a datagram's fixed costs are
/// already spread over 9 KB and the copies cost more than they save (2 900
/// against 3 200 to 3 400 MB/s, 2026-12-05).
pub(super) const WIRE_MAX: usize = 4096;

/// Most pieces a datagram is cut into. Losing one piece loses the
/// datagram, so a lossy path loses datagrams in proportion to their
/// pieces: with 1 % of packets dropped (the veth pair cutting GSO sends
/// in software, an nftables rule dropping single packets; Open MPI 1 MiB
/// bandwidth, 2026-12-05), 44 pieces (64 KiB) fell from 1 110-1 220 to
/// 100-130 MB/s, while 16 pieces went from 1 150 to 710 and one-packet
/// datagrams from 830-870 to 580. Without loss, 16 pieces measured as
/// fast as 44 (3 100-3 200 MB/s across the veth with GSO), 8 pieces 13 %
/// slower.
pub(super) const MAX_PIECES: usize = 16;

/// How many pieces of `wire` bytes (the path's UDP payload) one datagram
/// may be cut into: as many as one GSO send carries, up to [`MAX_PIECES`],
/// or `None` where the port does not segment: packets of more than
/// [`WIRE_MAX`] bytes, or too few to make two pieces of one send.
pub(super) fn pieces_per_send(wire: usize) -> Option<usize> {
    let pieces = (MAX_UDP_PAYLOAD_V4 / wire.max(1)).min(MAX_PIECES);
    (pieces >= 2 && wire > segment::HEADER_LEN && wire <= WIRE_MAX).then_some(pieces)
}

/// Lays out the datagram `parts` (UD header, then payload) as pieces for
/// `wire`-byte packets, each behind its segment header naming `unit`, in
/// `out`; returns the bytes written, or `None` if `out` is too short or the
/// datagram needs more pieces than a header can count.
pub(super) fn build(out: &mut [u8], parts: &[&[u8]], wire: usize, unit: u32) -> Option<usize> {
    let chunk = wire.checked_sub(segment::HEADER_LEN).filter(|&c| c > 0)?;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let count = u8::try_from(total.div_ceil(chunk)).ok()?;
    if !(2..=segment::MAX_COUNT).contains(&count)
        || total + usize::from(count) * segment::HEADER_LEN > out.len()
    {
        return None;
    }
    let mut at = 0;
    let mut bytes = parts.iter().copied();
    let mut pending: &[u8] = &[];
    for index in 0..count {
        segment::Repr { count, index, unit }.emit(&mut out[at..]);
        at += segment::HEADER_LEN;
        let mut need = chunk.min(total - usize::from(index) * chunk);
        while need > 0 {
            if pending.is_empty() {
                pending = bytes.next()?;
            }
            let n = need.min(pending.len());
            out[at..at + n].copy_from_slice(&pending[..n]);
            (at, need, pending) = (at + n, need - n, &pending[n..]);
        }
    }
    Some(at)
}

/// A datagram partly received from one sender.
#[derive(Debug)]
struct Partial {
    qp: QpHandle,
    source: SocketAddr,
    unit: u32,
    count: u8,
    next: u8,
    /// Bytes so far, in `Partials::memory`'s slot of this entry.
    len: usize,
    /// When it last grew, in receives: the oldest goes first.
    touched: u64,
}

/// Datagrams partly received, one per sender at most, in memory of their
/// own until their last piece comes (a sender's pieces arrive in order on
/// its flow, so a new datagram from it means the partial one lost a piece).
#[derive(Debug, Default)]
pub(super) struct Partials {
    slots: [Option<Partial>; PARTIALS_MAX],
    /// One largest datagram per slot, made at first use.
    memory: Vec<u8>,
    clock: u64,
}

impl Partials {
    /// Takes one piece from `source` on `qp`; returns the slot whose
    /// datagram it completed. Drops (and counts) whatever piece or partial
    /// datagram cannot be put together.
    fn feed(
        &mut self,
        (qp, source): (QpHandle, SocketAddr),
        repr: segment::Repr,
        body: &[u8],
        stats: &mut FabricStats,
    ) -> Option<usize> {
        self.clock += 1;
        let found = self
            .slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|p| p.qp == qp && p.source == source));
        let slot = if repr.index == 0 {
            if found.and_then(|i| self.slots[i].take()).is_some() {
                stats.rx_incomplete += 1;
            }
            let free = self
                .slots
                .iter()
                .position(Option::is_none)
                .unwrap_or_else(|| {
                    // All taken: the one longest untouched goes.
                    let oldest = (0..PARTIALS_MAX)
                        .min_by_key(|&i| self.slots[i].as_ref().map_or(0, |p| p.touched))
                        .unwrap_or(0);
                    self.slots[oldest] = None;
                    stats.rx_incomplete += 1;
                    oldest
                });
            self.slots[free] = Some(Partial {
                qp,
                source,
                unit: repr.unit,
                count: repr.count,
                next: 0,
                len: 0,
                touched: self.clock,
            });
            free
        } else {
            let Some(i) = found.filter(|&i| {
                self.slots[i].as_ref().is_some_and(|p| {
                    p.unit == repr.unit && p.next == repr.index && p.count == repr.count
                })
            }) else {
                // A piece of a datagram whose start was lost (or evicted):
                // the partial one it follows, if any, is lost too.
                if let Some(i) = found {
                    self.slots[i] = None;
                }
                stats.rx_incomplete += 1;
                return None;
            };
            i
        };
        let stride = MAX_UDP_PAYLOAD_V4;
        if self.memory.is_empty() {
            self.memory = vec![0; PARTIALS_MAX * stride];
        }
        let partial = self.slots[slot].as_mut()?;
        if partial.len + body.len() > stride {
            self.slots[slot] = None;
            stats.rx_malformed += 1;
            return None;
        }
        let at = slot * stride + partial.len;
        self.memory[at..at + body.len()].copy_from_slice(body);
        partial.len += body.len();
        partial.next += 1;
        partial.touched = self.clock;
        (partial.next == partial.count).then_some(slot)
    }

    /// Drops (and counts) the partial datagram from `source` on `qp`, if
    /// any: one of its pieces never came, since a whole datagram from the
    /// same sender came after it.
    fn abandon(&mut self, (qp, source): (QpHandle, SocketAddr), stats: &mut FabricStats) {
        for slot in &mut self.slots {
            if slot
                .as_ref()
                .is_some_and(|p| p.qp == qp && p.source == source)
            {
                *slot = None;
                stats.rx_incomplete += 1;
            }
        }
    }

    /// The bytes of the datagram completed in `slot`, which frees it.
    fn take(&mut self, slot: usize) -> Option<&[u8]> {
        let partial = self.slots.get_mut(slot)?.take()?;
        let at = slot * MAX_UDP_PAYLOAD_V4;
        self.memory.get(at..at + partial.len)
    }

    /// Forgets the partial datagrams of a queue pair that is gone.
    pub(super) fn forget(&mut self, qp: QpHandle) {
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|p| p.qp == qp) {
                *slot = None;
            }
        }
    }
}

/// Where a receive's datagrams go: the queue pair's posted buffers, its
/// completion queue and the context's counters.
struct Landing<'a> {
    qp: QpHandle,
    entry: &'a mut QpEntry<UdpQp>,
    cq: &'a mut CqEntry,
    region: &'a mut [u8],
    lkey: crate::LKey,
    stats: &'a mut FabricStats,
    source: Option<SocketAddr>,
}

impl Landing<'_> {
    /// Delivers the datagram `parts` (UD header onwards, in pieces) into
    /// the front posted buffer; says whether it was queued as a completion.
    /// A datagram nothing is posted for (or whose completion would not fit
    /// the completion queue), or whose header is refused, is dropped and
    /// counted; the buffer stays posted.
    fn deliver(&mut self, parts: &mut dyn Iterator<Item = &[u8]>, len: usize) -> bool {
        let Some(wr) = self
            .entry
            .recv_queue
            .front()
            .copied()
            .filter(|w| w.sge.lkey == self.lkey)
        else {
            self.stats.rx_no_buffer += 1;
            return false;
        };
        let start = wr.sge.offset + SKIP;
        let Some(dest) = self
            .region
            .get_mut(start..start + len)
            .filter(|_| SKIP + len <= wr.sge.len)
        else {
            self.stats.rx_too_long += 1;
            return false;
        };
        let mut at = 0;
        for part in parts {
            dest[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        let mut header = [0u8; ud::HEADER_LEN];
        let have = len.min(ud::HEADER_LEN);
        header[..have].copy_from_slice(&dest[..have]);
        let Some(repr) = parse_header(&header, len) else {
            self.stats.rx_malformed += 1;
            return false;
        };
        if !self.entry.admit(repr.pkey, repr.qkey, self.stats) {
            return false;
        }
        if self.cq.room() == 0 {
            self.stats.rx_no_buffer += 1;
            return false;
        }
        self.entry.recv_queue.pop_front();
        let payload = len - ud::HEADER_LEN;
        self.stats.rx_datagrams += 1;
        self.stats.rx_bytes += payload as u64;
        let wc = Arrival::Whole { payload }.of(wr.wr_id, self.entry.qp_num, self.source, &repr);
        self.cq.push(wc, self.qp);
        true
    }
}

impl Receiver {
    /// Receives on a queue pair whose port segments, until the socket is
    /// empty, `budget` completions are queued, or no buffer is posted;
    /// returns how many completions it queued. Each receive (a datagram,
    /// a piece, or a GRO train of them) lands in the scratch space first.
    pub(super) fn receive_segmented(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
        budget: usize,
    ) -> Result<usize> {
        let mut queued = 0;
        while queued < budget {
            let entry = verbs.qp(qp)?;
            let Some(front) = entry.recv_queue.front().copied() else {
                self.discard_unbuffered(verbs, qp)?;
                break;
            };
            let mr = verbs.owned_range(front.sge, entry.pd)?;
            let entry = verbs.qp(qp)?;
            let (socket, gro) = (&entry.transport.socket, entry.transport.rx.gro);
            let target = [(0, self.read_scratch.len())];
            let meta = &mut self.scratch.meta[..1];
            let received =
                sys::recv_batch(socket.as_fd(), &mut self.read_scratch, &target, meta, gro)
                    .map_err(|source| FabricError::Io {
                        operation: "recvmsg",
                        source,
                    })?;
            if received == 0 {
                break;
            }
            let meta = self.scratch.meta[0];
            let Verbs {
                qps,
                cqs,
                mrs,
                stats,
                ..
            } = &mut *verbs;
            let entry = qps.get_mut(qp.0).ok_or(INVALID_QP)?;
            let cq = cq_in(cqs, entry.recv_cq)?;
            let Some(Memory::Owned(region)) = mrs.get_mut(mr.0).map(|m| &mut m.memory) else {
                return Err(FabricError::ProtectionError {
                    lkey: front.sge.lkey,
                });
            };
            let mut landing = Landing {
                qp,
                entry,
                cq,
                region,
                lkey: front.sge.lkey,
                stats,
                source: meta.source,
            };
            if meta.truncated {
                landing.stats.rx_too_long += 1;
                continue;
            }
            let data = &self.read_scratch[SKIP..SKIP + meta.len];
            let stride = match meta.stride {
                s if s > 0 && meta.len > s => s,
                _ => meta.len.max(1),
            };
            if stride < meta.len {
                landing.stats.rx_gro_trains += 1;
            }
            queued += land_pieces(&mut landing, &mut self.partials, data, stride);
        }
        Ok(queued)
    }
}

/// Lands what one receive brought, `data` in packets of `stride` bytes
/// (the last may be shorter): whole datagrams as they are, the pieces of a
/// datagram that are all here straight into a posted buffer, and any
/// other piece through `partials`. Returns the completions queued.
fn land_pieces(
    landing: &mut Landing<'_>,
    partials: &mut Partials,
    data: &[u8],
    stride: usize,
) -> usize {
    let mut queued = 0;
    let mut rest = data;
    while !rest.is_empty() {
        let (piece, after) = rest.split_at(stride.min(rest.len()));
        if !segment::is_segment(piece) {
            queued += usize::from(landing.deliver(&mut core::iter::once(piece), piece.len()));
            rest = after;
            continue;
        }
        let Ok(repr) = segment::Repr::parse(piece) else {
            landing.stats.rx_malformed += 1;
            rest = after;
            continue;
        };
        let count = usize::from(repr.count);
        // The whole datagram in this receive: its pieces are the next
        // `count` packets, each the next index of the same unit.
        let whole = repr.index == 0 && data_holds(rest, stride, count, repr.unit);
        if whole {
            if let Some(source) = landing.source {
                partials.abandon((landing.qp, source), landing.stats);
            }
            let span = (count * stride).min(rest.len());
            let (own, after) = rest.split_at(span);
            let len = own.len() - count * segment::HEADER_LEN;
            let mut bodies = own.chunks(stride).map(|p| &p[segment::HEADER_LEN..]);
            queued += usize::from(landing.deliver(&mut bodies, len));
            rest = after;
            continue;
        }
        let Some(source) = landing.source else {
            landing.stats.rx_malformed += 1;
            rest = after;
            continue;
        };
        if let Some(slot) = partials.feed(
            (landing.qp, source),
            repr,
            &piece[segment::HEADER_LEN..],
            landing.stats,
        ) {
            if let Some(bytes) = partials.take(slot) {
                let len = bytes.len();
                queued += usize::from(landing.deliver(&mut core::iter::once(bytes), len));
            }
        }
        rest = after;
    }
    queued
}

/// Whether `data`, in packets of `stride` bytes, starts with all `count`
/// pieces of datagram `unit`, in order.
fn data_holds(data: &[u8], stride: usize, count: usize, unit: u32) -> bool {
    let mut pieces = data.chunks(stride);
    (0..count).all(|index| {
        pieces.next().is_some_and(|piece| {
            segment::Repr::parse(piece).is_ok_and(|r| {
                r.unit == unit && usize::from(r.index) == index && usize::from(r.count) == count
            }) && piece.len() > segment::HEADER_LEN
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_pieces(image: &[u8], wire: usize) -> Vec<(segment::Repr, Vec<u8>)> {
        image
            .chunks(wire)
            .map(|p| {
                (
                    segment::Repr::parse(p).expect("a segment"),
                    p[segment::HEADER_LEN..].to_vec(),
                )
            })
            .collect()
    }

    #[test]
    fn a_datagram_is_cut_into_numbered_pieces_that_join_back() {
        let header = [1u8; 16];
        let payload: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let mut out = vec![0u8; 1 << 16];
        let len = build(
            &mut out,
            &[&header, &payload[..3000], &payload[3000..]],
            1472,
            9,
        )
        .expect("built");
        let pieces = parse_pieces(&out[..len], 1472);
        assert_eq!(pieces.len(), 4);
        for (index, (repr, _)) in pieces.iter().enumerate() {
            assert_eq!(
                (repr.count, usize::from(repr.index), repr.unit),
                (4, index, 9)
            );
        }
        let joined: Vec<u8> = pieces.into_iter().flat_map(|(_, body)| body).collect();
        assert_eq!(joined[..16], header);
        assert_eq!(joined[16..], payload[..]);
    }

    #[test]
    fn a_datagram_that_fits_one_packet_is_not_cut() {
        let mut out = vec![0u8; 1 << 16];
        assert_eq!(build(&mut out, &[&[0u8; 1000]], 1472, 1), None);
    }

    #[test]
    fn a_datagram_longer_than_the_space_is_refused() {
        let mut out = vec![0u8; 4000];
        assert_eq!(build(&mut out, &[&[0u8; 5000]], 1472, 1), None);
    }

    #[test]
    fn one_gso_send_bounds_the_pieces() {
        assert_eq!(pieces_per_send(1472), Some(MAX_PIECES));
        assert_eq!(pieces_per_send(4096), Some(MAX_PIECES.min(15)));
        assert_eq!(pieces_per_send(8972), None);
        assert_eq!(pieces_per_send(65_507), None);
    }

    #[test]
    fn pieces_that_came_apart_are_put_together_or_dropped() {
        let mut stats = FabricStats::default();
        let mut partials = Partials::default();
        let qp = QpHandle(crate::table::Table::default().insert(()));
        let from = "127.0.0.1:9".parse().expect("addr");
        let piece = |index, unit| segment::Repr {
            count: 3,
            index,
            unit,
        };
        assert_eq!(
            partials.feed((qp, from), piece(0, 1), b"ab", &mut stats),
            None
        );
        assert_eq!(
            partials.feed((qp, from), piece(1, 1), b"cd", &mut stats),
            None
        );
        let slot = partials
            .feed((qp, from), piece(2, 1), b"e", &mut stats)
            .expect("complete");
        assert_eq!(partials.take(slot), Some(&b"abcde"[..]));
        // A lost middle piece: the datagram is dropped once the last comes.
        assert_eq!(
            partials.feed((qp, from), piece(0, 2), b"ab", &mut stats),
            None
        );
        assert_eq!(
            partials.feed((qp, from), piece(2, 2), b"e", &mut stats),
            None
        );
        assert_eq!(stats.rx_incomplete, 1);
        // A new datagram from the sender ends a partial one.
        assert_eq!(
            partials.feed((qp, from), piece(0, 3), b"ab", &mut stats),
            None
        );
        assert_eq!(
            partials.feed((qp, from), piece(0, 4), b"xy", &mut stats),
            None
        );
        assert_eq!(stats.rx_incomplete, 2);
        // So does one that came whole, and only that sender's.
        let other = "127.0.0.1:10".parse().expect("addr");
        assert_eq!(
            partials.feed((qp, other), piece(0, 5), b"ab", &mut stats),
            None
        );
        partials.abandon((qp, from), &mut stats);
        assert_eq!(stats.rx_incomplete, 3);
        assert_eq!(
            partials.feed((qp, from), piece(1, 4), b"cd", &mut stats),
            None
        );
        assert_eq!(stats.rx_incomplete, 4);
        assert_eq!(
            partials.feed((qp, other), piece(1, 5), b"cd", &mut stats),
            None
        );
        let slot = partials
            .feed((qp, other), piece(2, 5), b"e", &mut stats)
            .expect("complete");
        assert_eq!(partials.take(slot), Some(&b"abcde"[..]));
    }
}
