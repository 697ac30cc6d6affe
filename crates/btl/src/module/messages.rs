//! Messages larger than a datagram: cut into datagrams on the sending side
//! (`send_message`, which copies them, and `send_message_shared`, which
//! sends from the caller's buffer), put back together on the receiving
//! side. The reliable stream delivers a peer's datagrams exactly once and
//! in order, so a message is the bytes from a datagram marked first to one
//! marked last.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use udbtl_fabric::Context;
use udbtl_reliability::PeerId;
use udbtl_wire::rel;

use super::delivery::Held;
use super::descriptors::bad;
use super::integrity::payload_offset;

use super::wait::Wait;
use super::{Engine, Flush, Module};
use crate::convertor::Convertor;
use crate::error::BtlError;
use crate::frag::{DesFlags, Descriptor};
use crate::rcache::RegId;
use crate::{EndpointId, NO_ORDER, Tag};

/// Largest message reassembled; a sender that never marks an end cannot
/// make the receiver grow without bound.
pub(super) const MAX_MESSAGE: usize = 1 << 30;

/// Bytes of a message `send_message` copies ahead of what has left: after
/// each run of this many it flushes, and it copies the next run only once
/// the peer's window took the runs before (the backlog holds less than
/// one). The copies are then still in cache when they are checksummed or
/// sealed and when the kernel copies them out, instead of the free list's
/// worth (megabytes) ahead. 1 MiB udbench bandwidth, plain, by how far
/// ahead (2026-12-05, two runs each): on loopback 2.9 GB/s at 16 MiB
/// (the free list's bound before), 4.8 at 1 MiB, 5.0–5.3 at 64 to 256 KiB;
/// across veth at MTU 1500, 1.7 GB/s at 16 MiB, 1.6 at 1 MiB, 1.85 at
/// 256 KiB, 1.8–2.0 at 64 and 128 KiB. Authenticated moved alike.
const COPY_AHEAD: usize = 128 << 10;

/// What one datagram did to its peer's message in progress.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Piece {
    /// Added to a message still in progress.
    Added,
    /// Completed a message: its tag and bytes. Hand the bytes back with
    /// [`Reassembly::recycle`] to keep the allocation.
    Complete(u8, Vec<u8>),
    /// The sender gave up on the message in progress, which is dropped.
    Aborted,
    /// Not part of any message (no first piece seen, or too long): dropped.
    Orphan,
}

#[derive(Debug, Default)]
struct Partial {
    tag: u8,
    bytes: Vec<u8>,
    /// A message is in progress.
    open: bool,
}

/// The message in progress from each peer, at most one per peer.
#[derive(Debug, Default)]
pub(super) struct Reassembly {
    partial: HashMap<u32, Partial>,
}

impl Reassembly {
    /// Adds one in-order datagram's payload from `endpoint`.
    pub(super) fn push(
        &mut self,
        endpoint: EndpointId,
        tag: u8,
        first: bool,
        last: bool,
        abort: bool,
        payload: &[u8],
    ) -> Piece {
        let partial = self.partial.entry(endpoint.0).or_default();
        if abort {
            let was_open = partial.open;
            partial.open = false;
            partial.bytes.clear();
            return if was_open {
                Piece::Aborted
            } else {
                Piece::Orphan
            };
        }
        if first {
            // A new message replaces one its sender never finished.
            partial.tag = tag;
            partial.bytes.clear();
            partial.open = true;
        }
        if !partial.open || partial.bytes.len() + payload.len() > MAX_MESSAGE {
            partial.open = false;
            partial.bytes.clear();
            return Piece::Orphan;
        }
        partial.bytes.extend_from_slice(payload);
        if !last {
            return Piece::Added;
        }
        partial.open = false;
        Piece::Complete(partial.tag, std::mem::take(&mut partial.bytes))
    }

    /// Returns a completed message's buffer for reuse.
    pub(super) fn recycle(&mut self, endpoint: EndpointId, mut bytes: Vec<u8>) {
        if let Some(partial) = self.partial.get_mut(&endpoint.0) {
            if !partial.open && partial.bytes.capacity() < bytes.capacity() {
                bytes.clear();
                partial.bytes = bytes;
            }
        }
    }

    /// Forgets whatever `endpoint` was sending: its peer is gone.
    pub(super) fn discard(&mut self, endpoint: EndpointId) {
        self.partial.remove(&endpoint.0);
    }

    /// Peers with a message in progress.
    pub(super) fn in_progress(&self) -> usize {
        self.partial.values().filter(|p| p.open).count()
    }
}

impl<C: Context> Module<C> {
    /// Sends `message`, of any length, to `endpoint`: it is cut into
    /// datagrams that the receiver reassembles and delivers to the `tag`
    /// callback once, whole. Requires a reliable module (reassembly relies
    /// on in-order, exactly-once delivery). Waits, progressing, for free
    /// fragments, and for the peer's window to take what was copied before
    /// it copies more (see `COPY_AHEAD`): so the peer must be progressing
    /// meanwhile (another process, another thread, or this module). Each
    /// wait lasts at most the time it takes to declare a peer lost
    /// (`peer_timeout` and `rto_max`) and a quarter of `peer_timeout`, on
    /// the fabric's clock.
    ///
    /// If the message cannot be finished (no fragment became free, or the
    /// peer was lost), the fragments taken are released and, when part of
    /// the message was already sent, an abort marker follows it so that the
    /// receiver drops the part it has.
    ///
    /// # Errors
    /// An unreliable module, an unknown or lost endpoint, or no fragment
    /// freed in time.
    pub fn send_message(
        &mut self,
        endpoint: EndpointId,
        tag: Tag,
        message: &[u8],
    ) -> Result<(), BtlError> {
        self.send_pieces(
            endpoint,
            tag,
            message.len(),
            |module, range, bounds, wait| {
                let des = module.alloc_piece(range.len(), wait)?;
                module
                    .lock()
                    .send_piece(des, endpoint, tag, &message[range], bounds)
            },
        )
    }

    /// [`send_message`](Self::send_message) without a copy: each datagram
    /// is gathered from `message` when it is posted and whenever it is
    /// resent, and the module keeps a share of `message` until the last
    /// of them is acknowledged. The receiver cannot tell the difference. A
    /// message of one datagram or less is copied all the same: registering
    /// its memory would cost more than the copy (an `ibv_reg_mr` on
    /// InfiniBand).
    ///
    /// # Errors
    /// As [`send_message`](Self::send_message), and a fabric that refused
    /// to register `message`.
    pub fn send_message_shared(
        &mut self,
        endpoint: EndpointId,
        tag: Tag,
        message: &Arc<[u8]>,
    ) -> Result<(), BtlError> {
        if message.len() <= self.limits().eager_limit {
            return self.send_message(endpoint, tag, message);
        }
        // One registration for the whole message, which each datagram's
        // fragment retains, so that none looks it up again.
        let reg = self.mpool_register(message)?;
        let mut convertor = Convertor::shared(Arc::clone(message));
        let sent = self.send_pieces(
            endpoint,
            tag,
            message.len(),
            |module, range, bounds, wait| {
                let des = module.prepare_piece(reg, &mut convertor, range.len(), wait)?;
                module.lock().send_filled_piece(des, endpoint, tag, bounds)
            },
        );
        // The fragments hold their own references.
        let _ = self.mpool_deregister(reg);
        sent
    }

    /// Cuts a message of `len` bytes into one-datagram pieces and has
    /// `send` send each, given its range in the message, its bounds and how
    /// long it may wait for a fragment. Waits for the peer's window as
    /// [`send_message`](Self::send_message) says, and on a failure sends
    /// the abort marker on `tag`.
    fn send_pieces(
        &mut self,
        endpoint: EndpointId,
        tag: Tag,
        len: usize,
        mut send: impl FnMut(&mut Self, Range<usize>, PieceBounds, Duration) -> Result<(), BtlError>,
    ) -> Result<(), BtlError> {
        // Fragments held by a peer that stopped acknowledging come back once
        // it is declared lost: peer_timeout after it was last heard, plus at
        // most one retransmission timeout. Wait that long and a quarter
        // more, so that the caller hears of the loss, not of a shortage (a
        // wait of peer_timeout alone gave up first under load).
        let Some(wait) = self.lock().path.reliable().map(|r| {
            let config = r.core.config();
            config.peer_timeout + config.rto_max + config.peer_timeout / 4
        }) else {
            return Err(BtlError::PeerUnavailable {
                endpoint: endpoint.0,
                reason: "multi-datagram messages need reliable = true".into(),
            });
        };
        let chunk = self.limits().eager_limit.max(1);
        let pieces = len.div_ceil(chunk).max(1);
        // A fragment kept aside for the abort marker, so the receiver can
        // always be told to drop a message cut short.
        let spare = if pieces > 1 {
            Some(self.alloc_waiting(0, wait)?)
        } else {
            None
        };
        let run = (COPY_AHEAD / chunk).max(1);
        let mut result = Ok(());
        for i in 0..pieces {
            if i > 0 && i % run == 0 {
                self.wait_for_backlog(endpoint, run, wait);
            }
            let last = i + 1 == pieces;
            let bounds = PieceBounds {
                first: i == 0,
                last,
                flush: if last || (i + 1) % run == 0 {
                    Flush::Now
                } else {
                    Flush::Later
                },
            };
            result = send(self, i * chunk..len.min((i + 1) * chunk), bounds, wait);
            if result.is_err() {
                if let Some(spare) = spare.filter(|_| i > 0) {
                    // Best effort: if the peer is gone the marker is moot.
                    let mut engine = self.lock();
                    if engine.set_abort(spare).is_ok() && engine.send(endpoint, spare, tag).is_ok()
                    {
                        return result;
                    }
                }
                break;
            }
        }
        if let Some(spare) = spare {
            let _ = self.free(spare);
        }
        // A message cut short may have left pieces unflushed.
        self.lock().flush_deferred();
        result
    }

    /// Progresses while `endpoint`'s backlog (pieces copied and waiting for
    /// its window) holds `limit` or more, for at most `wait`; what follows
    /// then finds out whether the peer is still there.
    fn wait_for_backlog(&mut self, endpoint: EndpointId, limit: usize, wait: Duration) {
        let mut waiting = Wait::new(self.now(), wait);
        while self.lock().backlog(endpoint) >= limit {
            let handled = self.progress();
            if waiting.over(self.now(), handled) {
                return;
            }
        }
    }

    /// A fragment for the next piece of a message: at once if one is free;
    /// otherwise the pieces handed over so far go out, and it waits for
    /// their acknowledgements to free one.
    fn alloc_piece(&mut self, size: usize, wait: Duration) -> Result<Descriptor, BtlError> {
        if let Some(des) = self.alloc(NO_ORDER, size, DesFlags::NONE) {
            return Ok(des);
        }
        self.lock().flush_deferred();
        self.alloc_waiting(size, wait)
    }

    /// Allocates a send fragment, progressing while none is free, for at
    /// most `wait` on the fabric's clock (or until that clock stands still).
    fn alloc_waiting(&mut self, size: usize, wait: Duration) -> Result<Descriptor, BtlError> {
        let mut waiting = Wait::new(self.now(), wait);
        loop {
            if let Some(des) = self.alloc(NO_ORDER, size, DesFlags::NONE) {
                return Ok(des);
            }
            let handled = self.progress();
            if waiting.over(self.now(), handled) {
                return Err(BtlError::NoFragment { waited: wait });
            }
        }
    }

    /// Prepares a fragment that sends the next `len` bytes of `convertor`
    /// (over memory registered as `reg`) without a copy, progressing while
    /// none is free, for at most `wait`.
    fn prepare_piece(
        &mut self,
        reg: RegId,
        convertor: &mut Convertor<'static>,
        len: usize,
        wait: Duration,
    ) -> Result<Descriptor, BtlError> {
        let mut waiting = Wait::new(self.now(), wait);
        loop {
            let mut size = len;
            let prepared = self.prepare_src(
                Some(reg),
                convertor,
                NO_ORDER,
                0,
                &mut size,
                DesFlags::BTL_OWNERSHIP,
            );
            if let Some(des) = prepared {
                if size == len {
                    return Ok(des);
                }
                // A piece is one datagram, which a fragment always takes
                // whole; anything else would shift the message.
                convertor.rewind(size);
                let _ = self.free(des);
                return Err(bad(des, "prepared shorter than a message's piece"));
            }
            self.lock().flush_deferred();
            let handled = self.progress();
            if waiting.over(self.now(), handled) {
                return Err(BtlError::NoFragment { waited: wait });
            }
        }
    }
}

/// What a piece's fragment needs besides its bytes: whether it starts or
/// ends its message, and whether it goes out at once.
#[derive(Clone, Copy)]
struct PieceBounds {
    first: bool,
    last: bool,
    flush: Flush,
}

impl<C: Context> Engine<C> {
    /// Copies one piece of a message into `des` and sends it
    /// ([`send_filled_piece`](Self::send_filled_piece)); `des` is freed on
    /// every error.
    fn send_piece(
        &mut self,
        des: Descriptor,
        endpoint: EndpointId,
        tag: Tag,
        piece: &[u8],
        bounds: PieceBounds,
    ) -> Result<(), BtlError> {
        let copied = self
            .segment_mut(des)
            .map(|seg| seg.copy_from_slice(piece))
            .and_then(|()| self.note_segment_crc(des, piece));
        if let Err(err) = copied {
            let _ = self.free(des);
            return Err(err);
        }
        self.send_filled_piece(des, endpoint, tag, bounds)
    }

    /// Sends `des`, which holds one piece of a message, marked with the
    /// message's bounds; the BTL frees it once it is acknowledged, and with
    /// [`Flush::Now`] puts what is held back with it on the wire. `des` is
    /// freed on every error.
    fn send_filled_piece(
        &mut self,
        des: Descriptor,
        endpoint: EndpointId,
        tag: Tag,
        PieceBounds { first, last, flush }: PieceBounds,
    ) -> Result<(), BtlError> {
        let sent = self.set_message_bounds(des, first, last).and_then(|()| {
            self.frags.checked_mut(des)?.flags = DesFlags::BTL_OWNERSHIP;
            self.send_as(endpoint, des, tag, flush)
        });
        if sent.is_err() {
            let _ = self.free(des);
        }
        sent.map(drop)
    }

    /// Pieces copied for `endpoint` and waiting for its window.
    fn backlog(&self, endpoint: EndpointId) -> usize {
        self.path
            .reliable()
            .and_then(|r| r.core.queued(PeerId(endpoint.0)))
            .map_or(0, |(_, backlog)| backlog)
    }

    /// Puts on the wire what the reliability state holds back from deferred
    /// sends.
    fn flush_deferred(&mut self) {
        if self.path.is_reliable() {
            let now = self.clock();
            self.flush_transmits(now);
        }
    }

    /// Turns the spare fragment into an abort marker: an empty last piece
    /// the BTL frees once acknowledged.
    fn set_abort(&mut self, des: Descriptor) -> Result<(), BtlError> {
        let frag = self.frags.checked_mut(des)?;
        frag.seg_len = 0;
        frag.flags = DesFlags::BTL_OWNERSHIP;
        frag.msg_flags = rel::FLAG_LAST | rel::FLAG_ABORT;
        Ok(())
    }
}

/// The receiving side: a reliable peer's pieces, put back together.
impl<C: Context> Engine<C> {
    /// Adds one piece of a multi-datagram message; returns the message it
    /// completes, with its tag.
    /// Aborted messages and orphan pieces are counted. Does not repost the
    /// buffer.
    pub(super) fn add_piece(
        &mut self,
        held: Held,
        endpoint: EndpointId,
        tag: Tag,
        flags: u16,
    ) -> Option<(Tag, Vec<u8>)> {
        let piece = match (
            self.recv
                .datagram(&self.ctx, held)
                .and_then(|d| d.get(payload_offset(flags)..)),
            self.path.reliable_mut(),
        ) {
            (Some(payload), Some(reliable)) => reliable.reassembly.push(
                endpoint,
                tag.0,
                flags & rel::FLAG_FIRST != 0,
                flags & rel::FLAG_LAST != 0,
                flags & rel::FLAG_ABORT != 0,
                payload,
            ),
            _ => Piece::Orphan,
        };
        match piece {
            Piece::Added => None,
            Piece::Complete(tag, message) => {
                self.stats.messages_reassembled += 1;
                Some((Tag(tag), message))
            }
            Piece::Aborted => {
                self.stats.messages_aborted += 1;
                None
            }
            Piece::Orphan => {
                self.stats.recv_orphan_pieces += 1;
                None
            }
        }
    }

    /// Hands a reassembled message's bytes back, to keep the allocation.
    pub(super) fn recycle_message(&mut self, endpoint: EndpointId, message: Vec<u8>) {
        if let Some(reliable) = self.path.reliable_mut() {
            reliable.reassembly.recycle(endpoint, message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EP: EndpointId = EndpointId(3);

    #[test]
    fn pieces_make_a_message_and_a_new_first_replaces_an_unfinished_one() {
        let mut r = Reassembly::default();
        assert_eq!(r.push(EP, 9, true, false, false, b"ab"), Piece::Added);
        assert_eq!(r.push(EP, 9, false, false, false, b"cd"), Piece::Added);
        assert_eq!(r.in_progress(), 1);
        assert_eq!(r.push(EP, 7, true, false, false, b"x"), Piece::Added);
        assert_eq!(
            r.push(EP, 0, false, true, false, b"y"),
            Piece::Complete(7, b"xy".to_vec())
        );
        assert_eq!(r.in_progress(), 0);
    }

    #[test]
    fn an_abort_drops_the_message_and_later_pieces_are_orphans() {
        let mut r = Reassembly::default();
        assert_eq!(r.push(EP, 9, true, false, false, b"ab"), Piece::Added);
        assert_eq!(r.push(EP, 0, false, true, true, b""), Piece::Aborted);
        assert_eq!(r.in_progress(), 0);
        assert_eq!(r.push(EP, 9, false, true, false, b"cd"), Piece::Orphan);
        assert_eq!(r.push(EP, 0, false, true, true, b""), Piece::Orphan);
    }

    #[test]
    fn discard_forgets_a_peer() {
        let mut r = Reassembly::default();
        assert_eq!(r.push(EP, 9, true, false, false, b"ab"), Piece::Added);
        r.discard(EP);
        assert_eq!(r.in_progress(), 0);
        assert_eq!(r.push(EP, 9, false, true, false, b"cd"), Piece::Orphan);
    }
}
