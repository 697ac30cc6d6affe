//! Messages larger than a datagram, put back together. The reliable stream
//! delivers a peer's datagrams exactly once and in order, so a message is
//! the bytes from a datagram marked first to one marked last.

use std::collections::HashMap;

use crate::EndpointId;

/// Largest message reassembled; a sender that never marks an end cannot
/// make the receiver grow without bound.
pub(super) const MAX_MESSAGE: usize = 1 << 30;

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
