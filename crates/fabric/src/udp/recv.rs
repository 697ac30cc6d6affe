//! Receiving: `recvmmsg` into the buffers posted on a queue pair (GRO
//! trains are `train.rs`'s), and draining queue pairs that have no receive
//! posted.
//!
//! [`Receiver`] holds what receiving needs across queue pairs of one context
//! (the scratch space a batch uses, so that a poll prepares nothing, and
//! whether the kernel still takes GRO); [`RecvState`] holds what it needs per
//! queue pair (the adaptive batch size, whether receives were ever posted).
//! Datagrams land only while [`Context::poll_cq`](crate::Context::poll_cq)
//! runs, which calls [`Receiver::receive`].

use std::net::IpAddr;
use std::os::fd::AsFd;

use socket2::Socket;
use udbtl_wire::ud;

use super::segment::{LaterHeaders, Partials};
use super::{MAX_UDP_PAYLOAD_V6, sys};
use std::collections::VecDeque;

use crate::bookkeeping::{Memory, QpEntry, Verbs, cq_in};
use crate::{
    CqHandle, FabricError, FabricStats, GRH_LEN, NodeAddr, QpAddr, QpHandle, RecvWr, Result,
    WcOpcode, WcStatus, WorkCompletion,
};

/// Empty queue pairs that never had a receive posted are drained (and their
/// datagrams counted as dropped) only every this many polls, so send-only
/// queue pairs cost no system call on the fast path.
const IDLE_DRAIN_INTERVAL: u32 = 64;
/// Most datagrams (or GRO trains) one drain of a queue pair with no
/// receive posted reads: the rest wait for the next.
const DISCARD_MAX: usize = 64;

/// What one `recvmmsg` batch, or one GRO train, needs besides the buffers
/// themselves.
#[derive(Debug)]
pub(super) struct RecvScratch {
    pub(super) targets: [(usize, usize); sys::MAX_SCATTER],
    pub(super) meta: [sys::RecvMeta; sys::MAX_BATCH],
}

const _: () = assert!(sys::MAX_SCATTER >= sys::MAX_BATCH);

pub(super) const INVALID_QP: FabricError = FabricError::InvalidHandle { kind: "queue pair" };

/// The receive side of a context: what every queue pair's receives share.
#[derive(Debug)]
pub(super) struct Receiver {
    /// New queue pairs turn GRO on, until the kernel refuses it once.
    gro: bool,
    /// Where a GRO train continues past the posted buffers it is spread
    /// over ([`sys::recv_scattered`]): one maximal UDP payload, made with the
    /// first queue pair that has GRO on.
    pub(super) spill: Option<Box<[u8]>>,
    polls: u32,
    /// Where a segmenting port's reads land, and where datagrams that no
    /// receive was posted for are read and discarded.
    pub(super) read_scratch: Box<[u8]>,
    /// Per-batch receive bookkeeping, kept here so a poll prepares nothing.
    pub(super) scratch: Box<RecvScratch>,
    /// Datagrams whose pieces came apart, on ports that segment.
    pub(super) partials: Partials,
    /// Where the segment headers of a read in place land, but the first.
    pub(super) piece_headers: LaterHeaders,
}

/// A queue pair's socket.
#[derive(Debug)]
pub(crate) struct UdpQp {
    pub(super) socket: Socket,
    /// What receiving on the socket has learned.
    pub(super) rx: RecvState,
}

/// The receive side of one queue pair.
#[derive(Debug)]
pub(super) struct RecvState {
    /// A receive was posted at least once: the queue pair receives, so an
    /// empty receive queue must drop arrivals promptly.
    receives: bool,
    /// How many datagrams the next receive batch asks for. It doubles while
    /// consecutive polls keep finding full batches and halves on an empty
    /// poll, so a ping-pong reads with one `recvfrom` per poll and a stream
    /// grows to full `recvmmsg` batches within a few polls.
    batch_hint: usize,
    /// Consecutive polls that found data.
    busy_polls: u32,
    /// The socket has UDP GRO on: a read may return a train.
    pub(super) gro: bool,
    /// The longest datagram the port carries, UD header included: how much
    /// of each posted buffer a GRO train fills before the next.
    pub(super) slot: usize,
    /// How many posted buffers the next GRO receive spreads over, before
    /// the spill space: the kernel imports every iovec of a `recvmsg`, even
    /// one that finds nothing, so a socket that gets single datagrams
    /// offers one buffer, and one that gets trains as many as the longest
    /// train lately (1..=[`sys::MAX_SCATTER`]).
    pub(super) scatter: usize,
    /// Consecutive GRO receives that found nothing: after
    /// [`SCATTER_IDLE_POLLS`] of them `scatter` falls back to one.
    pub(super) idle_polls: u32,
    /// The port segments: a read may bring pieces of datagrams
    /// (`segment/`), and how the next read is laid out.
    pub(super) pieces: Option<PieceReads>,
}

/// How a queue pair whose port segments reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct PieceReads {
    /// The UDP payload of each piece.
    pub(super) wire: usize,
    /// The last read brought one whole datagram in pieces long enough to
    /// read in place (`segment/in_place.rs`): the next is laid out to land
    /// that way.
    pub(super) in_place: bool,
    /// Consecutive reads that found nothing: after
    /// [`SCATTER_IDLE_POLLS`] of them reads go through the scratch space
    /// again, which costs an empty poll one buffer, not a scatter list.
    idle_polls: u32,
}

impl RecvState {
    /// Notes what a read on a segmenting port brought: whether it was one
    /// whole datagram in pieces that are worth reading in place.
    pub(super) fn piece_read(&mut self, whole: bool) {
        if let Some(reads) = &mut self.pieces {
            reads.in_place = whole;
            reads.idle_polls = 0;
        }
    }

    /// Notes a read on a segmenting port that found nothing.
    pub(super) fn piece_idle(&mut self) {
        if let Some(reads) = &mut self.pieces {
            reads.idle_polls = reads.idle_polls.saturating_add(1);
            if reads.idle_polls >= SCATTER_IDLE_POLLS {
                reads.in_place = false;
            }
        }
    }
}

/// Empty GRO receives in a row after which a queue pair offers one buffer
/// again: many more than a stream makes between two trains, few against
/// the polls a ping-pong makes while it waits.
pub(super) const SCATTER_IDLE_POLLS: u32 = 64;

impl RecvState {
    /// Notes that a receive was posted: from now on the queue pair is
    /// drained on every poll.
    pub(super) const fn posted(&mut self) {
        self.receives = true;
    }
}

impl Receiver {
    /// A receiver that turns GRO on for new queue pairs if `gro`.
    pub(super) fn new(gro: bool) -> Self {
        Self {
            gro,
            spill: None,
            polls: 0,
            read_scratch: vec![0u8; MAX_UDP_PAYLOAD_V6 + GRH_LEN].into_boxed_slice(),
            scratch: Box::new(RecvScratch {
                targets: [(0, 0); sys::MAX_SCATTER],
                meta: [sys::RecvMeta::EMPTY; sys::MAX_BATCH],
            }),
            partials: Partials::default(),
            piece_headers: LaterHeaders::default(),
        }
    }

    /// The receive state of a new queue pair on `socket`, whose port
    /// carries datagrams of up to `slot` bytes (UD header included), with
    /// GRO on if the kernel still takes it.
    pub(super) fn new_qp(
        &mut self,
        socket: &Socket,
        slot: usize,
        segment: Option<usize>,
    ) -> RecvState {
        let gro = self.gro && self.enable_gro(socket);
        RecvState {
            receives: false,
            batch_hint: 1,
            busy_polls: 0,
            gro,
            slot,
            scatter: 1,
            idle_polls: 0,
            pieces: segment.map(|wire| PieceReads {
                wire,
                in_place: false,
                idle_polls: 0,
            }),
        }
    }

    /// Turns GRO on for a new queue pair's socket; says whether it is on.
    fn enable_gro(&mut self, socket: &Socket) -> bool {
        if let Err(err) = sys::enable_gro(socket.as_fd()) {
            tracing::debug!(%err, "UDP GRO refused by the kernel; receiving datagrams singly");
            self.gro = false;
            return false;
        }
        if self.spill.is_none() {
            self.spill = Some(vec![0u8; MAX_UDP_PAYLOAD_V6].into_boxed_slice());
        }
        true
    }

    /// Pulls datagrams for every receiving queue pair on `cq` into it.
    pub(super) fn receive(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        cq: CqHandle,
        budget: usize,
    ) -> Result<()> {
        self.polls = self.polls.wrapping_add(1);
        let idle_drain = self.polls % IDLE_DRAIN_INTERVAL == 0;
        let handles: [Option<QpHandle>; 8] = {
            let mut out = [None; 8];
            let mut n = 0;
            for (handle, qp) in verbs.qps.iter() {
                if qp.recv_cq == cq && qp.can_receive() && n < out.len() {
                    let empty = qp.recv_queue.is_empty();
                    if !empty || qp.transport.rx.receives || idle_drain {
                        out[n] = Some(QpHandle(handle));
                        n += 1;
                    }
                }
            }
            out
        };
        let mut budget = budget;
        for qp in handles.into_iter().flatten() {
            budget = budget.min(verbs.cq_room(cq));
            if budget == 0 {
                break;
            }
            // A GRO train may complete more datagrams than the budget asked
            // for (its tail goes wherever the completion queue has room).
            budget = budget.saturating_sub(self.receive_on(verbs, qp, budget)?);
        }
        Ok(())
    }

    /// Receives up to `budget` datagrams on one queue pair and returns how
    /// many completions it queued.
    fn receive_on(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
        budget: usize,
    ) -> Result<usize> {
        if verbs.qp(qp)?.transport.rx.pieces.is_some() {
            return self.receive_segmented(verbs, qp, budget);
        }
        if verbs.qp(qp)?.transport.rx.gro {
            return self.receive_trains(verbs, qp, budget);
        }
        let mut queued = 0;
        loop {
            let entry = verbs.qp(qp)?;
            let Some(first) = entry.recv_queue.front().copied() else {
                self.discard_unbuffered(verbs, qp)?;
                return Ok(queued);
            };
            // One batch reads into one registration: posted buffers normally
            // all come from a single receive slab.
            let scratch = &mut *self.scratch;
            let limit = (budget - queued).min(entry.transport.rx.batch_hint);
            let mut count = 0;
            for wr in entry.recv_queue.iter().take(limit) {
                if wr.sge.lkey != first.sge.lkey {
                    break;
                }
                scratch.targets[count] = (wr.sge.offset, wr.sge.len);
                count += 1;
            }
            let mr = verbs.owned_range(first.sge, entry.pd)?;
            let received = {
                let Verbs { mrs, qps, .. } = &mut *verbs;
                let transport = &qps.get(qp.0).ok_or(INVALID_QP)?.transport;
                let socket = &transport.socket;
                let region = match mrs.get_mut(mr.0).map(|m| &mut m.memory) {
                    Some(Memory::Owned(bytes)) => &mut bytes[..],
                    _ => {
                        return Err(FabricError::ProtectionError {
                            lkey: first.sge.lkey,
                        });
                    }
                };
                sys::recv_batch(
                    socket.as_fd(),
                    region,
                    &scratch.targets[..count],
                    &mut scratch.meta,
                    false,
                )
                .map_err(|source| FabricError::Io {
                    operation: "recvmmsg",
                    source,
                })?
            };
            let transport = &mut verbs.qp_mut(qp)?.transport;
            if received == 0 {
                if queued == 0 {
                    transport.rx.busy_polls = 0;
                    transport.rx.batch_hint = (transport.rx.batch_hint / 2).max(1);
                }
                return Ok(queued);
            }
            if queued == 0 {
                transport.rx.busy_polls = transport.rx.busy_polls.saturating_add(1);
            }
            let full = received == count;
            if full && transport.rx.busy_polls >= 2 {
                transport.rx.batch_hint = (count * 2).min(sys::MAX_BATCH);
            }
            queued += self.complete_receives(verbs, qp, received)?;
            // A full batch of more than one suggests more are waiting.
            if !full || count == 1 || queued >= budget {
                return Ok(queued);
            }
        }
    }

    /// Turns the `received` datagrams in the scratch space, which landed in
    /// the first posted buffers of `qp`, into completions. A datagram that is malformed or carries the wrong keys
    /// leaves its buffer posted.
    fn complete_receives(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
        received: usize,
    ) -> Result<usize> {
        let Verbs {
            qps, cqs, stats, ..
        } = &mut *verbs;
        let entry = qps.get_mut(qp.0).ok_or(INVALID_QP)?;
        let cq = cq_in(cqs, entry.recv_cq)?;
        let mut kept = Kept::new();
        let mut queued = 0;
        for meta in &self.scratch.meta[..received] {
            let Some(wr) = entry.recv_queue.pop_front() else {
                break;
            };
            let Some(repr) = kept.admit(entry, stats, wr, Some(&meta.header), meta.len) else {
                continue;
            };
            let payload = meta.len - ud::HEADER_LEN;
            let completion = if meta.truncated {
                stats.rx_too_long += 1;
                Arrival::TooLong
            } else {
                stats.rx_datagrams += 1;
                stats.rx_bytes += payload as u64;
                Arrival::Whole { payload }
            };
            cq.push(
                completion.of(wr.wr_id, entry.qp_num, meta.source, &repr),
                qp,
            );
            queued += 1;
        }
        kept.restore(&mut entry.recv_queue);
        Ok(queued)
    }

    /// Reads and discards what arrived for a queue pair with no receive
    /// posted, as UD drops such datagrams: each is counted as dropped for
    /// want of a buffer, or as malformed when it is garbage.
    ///
    /// Datagrams are read one at a time into the whole scratch buffer, so
    /// that each, or each datagram of a GRO train, is judged by its own
    /// header. This path is not a fast one: it serves queue pairs that
    /// only send, whose sockets nobody should write to.
    pub(super) fn discard_unbuffered(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
    ) -> Result<()> {
        const SKIP: usize = GRH_LEN - ud::HEADER_LEN;
        let transport = &verbs.qp(qp)?.transport;
        let (socket, gro) = (&transport.socket, transport.rx.gro);
        let target = [(0, self.read_scratch.len())];
        let meta = &mut self.scratch.meta[..1];
        let (mut dropped, mut malformed) = (0, 0);
        for _ in 0..DISCARD_MAX {
            let n = sys::recv_batch(socket.as_fd(), &mut self.read_scratch, &target, meta, gro)
                .map_err(|source| FabricError::Io {
                    operation: "recvmsg",
                    source,
                })?;
            if n == 0 {
                break;
            }
            let (len, stride) = (meta[0].len, meta[0].stride);
            let stride = if stride > 0 && len > stride {
                stride
            } else {
                len.max(1)
            };
            for begin in (0..len.max(1)).step_by(stride) {
                let at = SKIP + begin;
                let have = ud::HEADER_LEN.min(len - begin);
                let mut header = [0; ud::HEADER_LEN];
                header[..have].copy_from_slice(&self.read_scratch[at..at + have]);
                if parse_header(&header, len - begin).is_some() {
                    dropped += 1;
                } else {
                    malformed += 1;
                }
            }
        }
        verbs.stats.rx_no_buffer += dropped;
        verbs.stats.rx_malformed += malformed;
        Ok(())
    }
}

/// Receives taken off a queue pair whose datagram was dropped: their
/// buffers go back to the front of the queue, in order, once the batch is
/// done, as verbs leaves a receive posted when a datagram is discarded.
pub(super) struct Kept {
    wrs: [Option<RecvWr>; sys::MAX_SCATTER],
    count: usize,
}

impl Kept {
    pub(super) const fn new() -> Self {
        Self {
            wrs: [None; sys::MAX_SCATTER],
            count: 0,
        }
    }

    /// The UD header `header` of the `len`-byte datagram received into
    /// `wr`, if it parses and `entry` admits it; otherwise the drop is
    /// counted (`None` for a header: malformed) and `wr` kept.
    pub(super) fn admit<Q>(
        &mut self,
        entry: &QpEntry<Q>,
        stats: &mut FabricStats,
        wr: RecvWr,
        header: Option<&[u8; ud::HEADER_LEN]>,
        len: usize,
    ) -> Option<ud::Repr> {
        let repr = header.and_then(|header| parse_header(header, len));
        if repr.is_none() {
            stats.rx_malformed += 1;
        }
        let admitted = repr.filter(|r| entry.admit(r.pkey, r.qkey, stats));
        if admitted.is_none() && self.count < self.wrs.len() {
            self.wrs[self.count] = Some(wr);
            self.count += 1;
        }
        admitted
    }

    /// Puts the kept receives back at the front of `queue`, in order.
    pub(super) fn restore(self, queue: &mut VecDeque<RecvWr>) {
        for wr in self.wrs[..self.count].iter().rev().flatten() {
            queue.push_front(*wr);
        }
    }
}

/// How a datagram that was accepted arrived.
#[derive(Debug, Clone, Copy)]
pub(super) enum Arrival {
    /// Whole, with `payload` bytes after its UD header.
    Whole { payload: usize },
    /// Longer than its buffer: it completes in error, as verbs reports it.
    TooLong,
}

impl Arrival {
    /// The completion of the receive `wr_id` on queue pair `qp_num`, from
    /// `source`, whose UD header is `repr`.
    pub(super) fn of(
        self,
        wr_id: u64,
        qp_num: u32,
        source: Option<std::net::SocketAddr>,
        repr: &ud::Repr,
    ) -> WorkCompletion {
        let (status, byte_len) = match self {
            Self::Whole { payload } => (WcStatus::Success, (GRH_LEN + payload) as u32),
            Self::TooLong => (WcStatus::LocalLengthError, 0),
        };
        WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len,
            qp_num,
            src: source.map(|s| QpAddr {
                node: NodeAddr::Ip(s.ip()),
                qpn: u32::from(s.port()),
            }),
            imm: repr.imm,
        }
    }
}

/// The encapsulation header of a received datagram, if it has a valid one.
pub(super) fn parse_header(header: &[u8; ud::HEADER_LEN], len: usize) -> Option<ud::Repr> {
    let header = header.get(..len.min(ud::HEADER_LEN))?;
    ud::Packet::new_checked(header)
        .and_then(|p| ud::Repr::parse(&p))
        .ok()
}
