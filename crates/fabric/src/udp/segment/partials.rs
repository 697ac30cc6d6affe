//! Datagrams whose pieces came apart, waiting for the rest.

use std::net::SocketAddr;

use udbtl_wire::segment;

use super::super::MAX_UDP_PAYLOAD_V4;
use crate::{FabricStats, QpHandle};

/// Most senders with a datagram partly received at once, per context: the
/// oldest is dropped to make room for another.
const PARTIALS_MAX: usize = 8;

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
pub(in crate::udp) struct Partials {
    slots: [Option<Partial>; PARTIALS_MAX],
    /// One largest datagram per slot, made at first use.
    memory: Vec<u8>,
    clock: u64,
}

impl Partials {
    /// Takes one piece from `source` on `qp`; returns the slot whose
    /// datagram it completed. Drops (and counts) whatever piece or partial
    /// datagram cannot be put together.
    pub(super) fn feed(
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
    pub(super) fn abandon(
        &mut self,
        (qp, source): (QpHandle, SocketAddr),
        stats: &mut FabricStats,
    ) {
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
    pub(super) fn take(&mut self, slot: usize) -> Option<&[u8]> {
        let partial = self.slots.get_mut(slot)?.take()?;
        let at = slot * MAX_UDP_PAYLOAD_V4;
        self.memory.get(at..at + partial.len)
    }

    /// Forgets the partial datagrams of a queue pair that is gone.
    pub(in crate::udp) fn forget(&mut self, qp: QpHandle) {
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|p| p.qp == qp) {
                *slot = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            padded: false,
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
