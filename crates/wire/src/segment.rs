//! The segment header: how the `udp` provider carries a UD datagram longer
//! than the path's MTU.
//!
//! Such a datagram (UD header, then payload) is cut into pieces of at most
//! the path's UDP payload less [`HEADER_LEN`], and each piece leaves as one
//! IP packet that starts with this header. All pieces but the last are
//! equally long, so one UDP GSO send carries them all, and on the way in
//! UDP GRO usually hands them back in one receive. A receiver puts the
//! pieces of one datagram (same sender, same `unit`) together in order of
//! `index`; a datagram missing a piece is dropped whole, as a lost datagram.
//!
//! ```text
//!  0      2      3      4                           8
//!  +------+------+------+---------------------------+
//!  |magic |count |index |           unit            |
//!  +------+------+------+---------------------------+
//! ```
//!
//! `magic` is `0x5553` ("US"), which no UD header starts with
//! ([`crate::ud::MAGIC`]), so segments and whole datagrams can share a
//! socket. `count` is the number of pieces (2 to [`MAX_COUNT`]), `index`
//! this piece's place (below `count`), and `unit` the sender's number for
//! the datagram, new for each one it sends.

use crate::field::{Field, read_u16, read_u32, write_u16, write_u32};
use crate::{Error, Result};

/// Length of the segment header in bytes.
pub const HEADER_LEN: usize = 8;
/// The magic number that starts every segment.
pub const MAGIC: u16 = 0x5553;
/// Most pieces one datagram is cut into: the kernel's limit on the
/// segments of one GSO send.
pub const MAX_COUNT: u8 = 64;

mod field {
    use super::Field;
    pub(super) const MAGIC: Field = 0..2;
    pub(super) const COUNT: usize = 2;
    pub(super) const INDEX: usize = 3;
    pub(super) const UNIT: Field = 4..8;
}

/// A parsed segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Pieces of the datagram.
    pub count: u8,
    /// This piece's place among them.
    pub index: u8,
    /// The sender's number for the datagram.
    pub unit: u32,
}

/// Whether `bytes` start like a segment (the magic number), whatever the
/// rest holds: what tells a segment from a whole UD datagram.
#[must_use]
pub fn is_segment(bytes: &[u8]) -> bool {
    bytes.len() >= field::MAGIC.end && read_u16(bytes, field::MAGIC) == MAGIC
}

impl Repr {
    /// Parses the header at the start of `bytes`.
    ///
    /// # Errors
    /// [`Error`] if `bytes` are shorter than [`HEADER_LEN`], the magic
    /// number is wrong, `count` is outside 2..=[`MAX_COUNT`] or `index` is
    /// not below it.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < HEADER_LEN || !is_segment(bytes) {
            return Err(Error);
        }
        let repr = Self {
            count: bytes[field::COUNT],
            index: bytes[field::INDEX],
            unit: read_u32(bytes, field::UNIT),
        };
        if repr.count < 2 || repr.count > MAX_COUNT || repr.index >= repr.count {
            return Err(Error);
        }
        Ok(repr)
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `bytes`.
    ///
    /// # Panics
    /// If `bytes` are shorter than [`HEADER_LEN`]: the caller sized them.
    pub fn emit(&self, bytes: &mut [u8]) {
        write_u16(bytes, field::MAGIC, MAGIC);
        bytes[field::COUNT] = self.count;
        bytes[field::INDEX] = self.index;
        write_u32(bytes, field::UNIT, self.unit);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_header_round_trips() {
        let repr = Repr {
            count: 44,
            index: 43,
            unit: 0xdead_beef,
        };
        let mut bytes = [0u8; HEADER_LEN];
        repr.emit(&mut bytes);
        assert_eq!(bytes[..2], [0x55, 0x53]);
        assert_eq!(Repr::parse(&bytes), Ok(repr));
    }

    #[test]
    fn a_ud_header_is_no_segment() {
        let ud = crate::ud::Repr {
            pkey: 0xffff,
            qkey: 1,
            imm: None,
        }
        .to_bytes();
        assert!(!is_segment(&ud));
        assert!(Repr::parse(&ud).is_err());
    }

    #[test]
    fn impossible_counts_and_indices_are_refused() {
        for (count, index) in [(0, 0), (1, 0), (65, 0), (4, 4), (2, 200)] {
            let mut bytes = [0u8; HEADER_LEN];
            Repr {
                count,
                index,
                unit: 7,
            }
            .emit(&mut bytes);
            assert!(Repr::parse(&bytes).is_err(), "count {count} index {index}");
        }
    }

    proptest! {
        /// Any bytes parse or are refused, never panic, and what parses
        /// emits back the same header.
        #[test]
        fn any_bytes_parse_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..16)) {
            if let Ok(repr) = Repr::parse(&bytes) {
                let mut again = [0u8; HEADER_LEN];
                repr.emit(&mut again);
                prop_assert_eq!(&again[..], &bytes[..HEADER_LEN]);
            }
        }
    }
}
