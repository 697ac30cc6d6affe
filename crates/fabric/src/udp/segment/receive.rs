//! Reading a port that segments: pieces put back together into the
//! posted buffers.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use udbtl_wire::{segment, ud};

use super::super::recv::{Arrival, INVALID_QP, Receiver, UdpQp, parse_header};
use super::super::sys::{self, SKIP};
use super::Partials;
use super::in_place::{InPlace, MIN_WIRE, Placed};
use crate::bookkeeping::{CqEntry, Memory, QpEntry, Verbs, cq_in};
use crate::{FabricError, FabricStats, QpHandle, RecvWr, Result};

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
    /// The front posted buffer, if it is this receive's and holds `len`
    /// bytes, with where a datagram starts in it; else counts the drop.
    fn front(&mut self, len: usize) -> Option<(RecvWr, usize)> {
        let Some(wr) = self
            .entry
            .recv_queue
            .front()
            .copied()
            .filter(|w| w.sge.lkey == self.lkey)
        else {
            self.stats.rx_no_buffer += 1;
            return None;
        };
        let start = wr.sge.offset + SKIP;
        if SKIP + len > wr.sge.len || start + len > self.region.len() {
            self.stats.rx_too_long += 1;
            return None;
        }
        Some((wr, start))
    }

    /// Delivers the datagram `parts` (UD header onwards, in pieces) into
    /// the front posted buffer; says whether it was queued as a completion.
    /// A datagram nothing is posted for (or whose completion would not fit
    /// the completion queue), or whose header is refused, is dropped and
    /// counted; the buffer stays posted.
    fn deliver(&mut self, parts: &mut dyn Iterator<Item = &[u8]>, len: usize) -> bool {
        let Some((wr, start)) = self.front(len) else {
            return false;
        };
        let dest = &mut self.region[start..start + len];
        let mut at = 0;
        for part in parts {
            dest[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        self.complete(wr, start, len)
    }

    /// Completes the front posted buffer `wr`, in which a datagram of `len`
    /// bytes starts at `start`, as [`deliver`](Self::deliver) does.
    fn complete(&mut self, wr: RecvWr, start: usize, len: usize) -> bool {
        let mut header = [0u8; ud::HEADER_LEN];
        let have = len.min(ud::HEADER_LEN);
        header[..have].copy_from_slice(&self.region[start..start + have]);
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
    /// returns how many completions it queued.
    ///
    /// While whole datagrams in pieces keep coming, each receive is laid
    /// out ([`InPlace`]) so that the pieces of one datagram land as that
    /// datagram in the front posted buffer, with no copy. Otherwise, and
    /// when a receive in place brings anything else, the bytes go through
    /// the scratch space and are put together from there.
    pub(in crate::udp) fn receive_segmented(
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
            let Verbs {
                qps,
                cqs,
                mrs,
                stats,
                ..
            } = &mut *verbs;
            let entry = qps.get_mut(qp.0).ok_or(INVALID_QP)?;
            let Some(Memory::Owned(region)) = mrs.get_mut(mr.0).map(|m| &mut m.memory) else {
                return Err(FabricError::ProtectionError {
                    lkey: front.sge.lkey,
                });
            };
            let rx = &entry.transport.rx;
            let Some(reads) = rx.pieces else {
                return Ok(queued);
            };
            let layout = match &self.spill {
                Some(_) if reads.in_place && rx.gro => InPlace::new(front, reads.wire),
                _ => None,
            };
            let mut meta = sys::RecvMeta::EMPTY;
            let whole_scratch = [(0, self.read_scratch.len())];
            let fd = entry.transport.socket.as_fd();
            let received = match (layout, self.spill.as_deref_mut()) {
                (Some(layout), Some(spill)) => {
                    layout.receive(fd, region, &mut self.piece_headers, spill, &mut meta)
                }
                _ => sys::recv_batch(
                    fd,
                    &mut self.read_scratch,
                    &whole_scratch,
                    core::slice::from_mut(&mut meta),
                    rx.gro,
                )
                .map(|n| n > 0),
            }
            .map_err(|source| FabricError::Io {
                operation: "recvmsg",
                source,
            })?;
            let rx = &mut entry.transport.rx;
            if !received {
                rx.piece_idle();
                break;
            }
            let cq = cq_in(cqs, entry.recv_cq)?;
            let mut landing = Landing {
                qp,
                entry,
                cq,
                region,
                lkey: front.sge.lkey,
                stats,
                source: meta.source,
            };
            // A read in place holds a posted buffer and the spill space,
            // more than the scratch space it may have to be copied into.
            if meta.truncated || SKIP + meta.len > self.read_scratch.len() {
                landing.stats.rx_too_long += 1;
                continue;
            }
            let stride = match meta.stride {
                s if s > 0 && meta.len > s => s,
                _ => meta.len.max(1),
            };
            if stride < meta.len {
                landing.stats.rx_gro_trains += 1;
            }
            let data = &mut self.read_scratch[SKIP..SKIP + meta.len];
            if let Some(layout) = layout {
                let placed = layout.placed(landing.region, &self.piece_headers, meta.len, stride);
                let done = match placed {
                    Placed::Datagram(len) => {
                        if let Some(source) = landing.source {
                            self.partials.abandon((qp, source), landing.stats);
                        }
                        let done = landing
                            .front(len)
                            .is_some_and(|(wr, start)| landing.complete(wr, start, len));
                        landing.stats.rx_in_place += u64::from(done);
                        done
                    }
                    Placed::Single(len) => landing.front(len).is_some_and(|(wr, start)| {
                        let base = layout.start() - segment::HEADER_LEN;
                        landing.region.copy_within(base..base + len, start);
                        landing.complete(wr, start, len)
                    }),
                    Placed::Other => {
                        let spill = self.spill.as_deref().unwrap_or_default();
                        layout.gather(landing.region, &self.piece_headers, spill, data);
                        false
                    }
                };
                if placed != Placed::Other {
                    queued += usize::from(done);
                    landing
                        .entry
                        .transport
                        .rx
                        .piece_read(matches!(placed, Placed::Datagram(_)));
                    continue;
                }
            }
            let data = &self.read_scratch[SKIP..SKIP + meta.len];
            let worth = reads.wire > MIN_WIRE && one_datagram(data, stride, reads.wire);
            landing.entry.transport.rx.piece_read(worth);
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
        let Ok((repr, body)) =
            segment::Repr::parse(piece).and_then(|repr| Ok((repr, repr.body(piece)?)))
        else {
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
            // `data_holds` checked every piece: only the last may be
            // padded, and its body is all that may be shorter than a packet.
            let (full, last) = own
                .split_at_checked((count - 1) * stride)
                .unwrap_or_default();
            let last = segment::body(last).unwrap_or_default();
            let full = full
                .chunks(stride)
                .map(|p| p.get(segment::HEADER_LEN..).unwrap_or_default());
            let len = full.clone().map(<[u8]>::len).sum::<usize>() + last.len();
            let mut bodies = full.chain(core::iter::once(last));
            queued += usize::from(landing.deliver(&mut bodies, len));
            rest = after;
            continue;
        }
        let Some(source) = landing.source else {
            landing.stats.rx_malformed += 1;
            rest = after;
            continue;
        };
        if let Some(slot) = partials.feed((landing.qp, source), repr, body, landing.stats) {
            if let Some(bytes) = partials.take(slot) {
                let len = bytes.len();
                queued += usize::from(landing.deliver(&mut core::iter::once(bytes), len));
            }
        }
        rest = after;
    }
    queued
}

/// Whether `data`, in packets of `stride` bytes, is all the pieces of one
/// datagram cut for `wire`-byte packets, and nothing else.
fn one_datagram(data: &[u8], stride: usize, wire: usize) -> bool {
    let count = data.len().div_ceil(wire);
    count >= 2
        && stride == wire
        && segment::Repr::parse(data).is_ok_and(|r| {
            r.index == 0 && usize::from(r.count) == count && data_holds(data, stride, count, r.unit)
        })
}

/// Whether `data`, in packets of `stride` bytes, starts with all `count`
/// pieces of datagram `unit`, in order.
fn data_holds(data: &[u8], stride: usize, count: usize, unit: u32) -> bool {
    let mut pieces = data.chunks(stride);
    (0..count).all(|index| {
        pieces.next().is_some_and(|piece| {
            segment::Repr::parse(piece).is_ok_and(|r| {
                r.unit == unit
                    && usize::from(r.index) == index
                    && usize::from(r.count) == count
                    && r.body(piece).is_ok_and(|body| !body.is_empty())
            })
        })
    })
}
