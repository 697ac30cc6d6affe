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
//! `magic` is `0x5553` ("US"), or `0x5550` ("UP") on a padded last piece
//! (below); no UD header starts with either ([`crate::ud::MAGIC`]), so
//! segments and whole datagrams can share a socket. `count` is the number
//! of pieces (2 to [`MAX_COUNT`]), `index` this piece's place (below
//! `count`), and `unit` the sender's number for the datagram, new for each
//! one it sends.
//!
//! A GSO send's packets are all equally long but the last, so the pieces
//! of a datagram whose last piece is short can be followed in the same
//! send only if that piece is padded to full length. A padded piece is the
//! last of its datagram; its packet ends with the body's length (two bytes,
//! network order) and holds zeros between the body and that length:
//!
//! ```text
//!  +----------------+--------------+---------+--------+
//!  | header ("UP")  |     body     |  zeros  | length |
//!  +----------------+--------------+---------+--------+
//! ```

use crate::field::{Field, read_u16, read_u32, write_u16, write_u32};
use crate::{Error, Result};

/// Length of the segment header in bytes.
pub const HEADER_LEN: usize = 8;
/// The magic number that starts every segment but a padded one.
pub const MAGIC: u16 = 0x5553;
/// The magic number that starts a padded last piece.
pub const MAGIC_PADDED: u16 = 0x5550;
/// Bytes at the end of a padded piece that give its body's length.
pub const TRAILER_LEN: usize = 2;
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
    /// Whether this last piece is padded to its packet's full length
    /// ([`body`] finds the body).
    pub padded: bool,
}

/// Whether `bytes` start like a segment (the magic number), whatever the
/// rest holds: what tells a segment from a whole UD datagram.
#[must_use]
pub fn is_segment(bytes: &[u8]) -> bool {
    bytes.len() >= field::MAGIC.end && matches!(read_u16(bytes, field::MAGIC), MAGIC | MAGIC_PADDED)
}

/// The body of the piece `packet` (header onwards, as it came), without a
/// padded piece's padding.
///
/// # Errors
/// [`Error`] if the header does not parse ([`Repr::parse`]) or a padded
/// piece's length does not fit the packet.
pub fn body(packet: &[u8]) -> Result<&[u8]> {
    Repr::parse(packet)?.body(packet)
}

/// The trailer that ends a padded piece whose body is `len` bytes, if the
/// length fits one.
#[must_use]
pub fn trailer(len: usize) -> Option<[u8; TRAILER_LEN]> {
    u16::try_from(len).ok().map(u16::to_be_bytes)
}

impl Repr {
    /// Parses the header at the start of `bytes`.
    ///
    /// # Errors
    /// [`Error`] if `bytes` are shorter than [`HEADER_LEN`], the magic
    /// number is wrong, `count` is outside 2..=[`MAX_COUNT`], `index` is
    /// not below it, or a padded piece is not the last.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < HEADER_LEN || !is_segment(bytes) {
            return Err(Error);
        }
        let repr = Self {
            count: bytes[field::COUNT],
            index: bytes[field::INDEX],
            unit: read_u32(bytes, field::UNIT),
            padded: read_u16(bytes, field::MAGIC) == MAGIC_PADDED,
        };
        if repr.count < 2
            || repr.count > MAX_COUNT
            || repr.index >= repr.count
            || (repr.padded && repr.index + 1 != repr.count)
        {
            return Err(Error);
        }
        Ok(repr)
    }

    /// The body of `packet`, the piece this header was parsed from, without
    /// a padded piece's padding ([`body`] for a piece not parsed yet).
    ///
    /// # Errors
    /// [`Error`] if `packet` is shorter than the header, or a padded
    /// piece's length does not fit it.
    pub fn body<'a>(&self, packet: &'a [u8]) -> Result<&'a [u8]> {
        let rest = packet.get(HEADER_LEN..).ok_or(Error)?;
        if !self.padded {
            return Ok(rest);
        }
        let room = rest.len().checked_sub(TRAILER_LEN).ok_or(Error)?;
        let len = usize::from(read_u16(rest, room..rest.len()));
        if len > room {
            return Err(Error);
        }
        Ok(&rest[..len])
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `bytes`.
    ///
    /// # Panics
    /// If `bytes` are shorter than [`HEADER_LEN`]: the caller sized them.
    pub fn emit(&self, bytes: &mut [u8]) {
        let magic = if self.padded { MAGIC_PADDED } else { MAGIC };
        write_u16(bytes, field::MAGIC, magic);
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
        for padded in [false, true] {
            let repr = Repr {
                count: 44,
                index: 43,
                unit: 0xdead_beef,
                padded,
            };
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut bytes);
            assert_eq!(bytes[..2], [0x55, if padded { 0x50 } else { 0x53 }]);
            assert_eq!(Repr::parse(&bytes), Ok(repr));
        }
    }

    fn packet(repr: Repr, rest: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_LEN];
        repr.emit(&mut bytes);
        bytes.extend_from_slice(rest);
        bytes
    }

    /// The padded last of three pieces.
    const PADDED_LAST: Repr = Repr {
        count: 3,
        index: 2,
        unit: 9,
        padded: true,
    };

    #[test]
    fn a_padded_piece_gives_back_its_body_alone() {
        let last = PADDED_LAST;
        let mut rest = vec![7u8; 300];
        rest.extend_from_slice(&[0; 100]);
        rest.extend_from_slice(&trailer(300).expect("fits"));
        assert_eq!(body(&packet(last, &rest)), Ok(&[7u8; 300][..]));
        // Padding of nothing, and a piece that is all body.
        assert_eq!(body(&packet(last, &trailer(0).expect("fits"))), Ok(&[][..]));
        let plain = Repr {
            padded: false,
            ..last
        };
        assert_eq!(body(&packet(plain, &rest)), Ok(&rest[..]));
    }

    #[test]
    fn a_padded_piece_that_lies_about_its_length_or_place_is_refused() {
        let last = PADDED_LAST;
        let mut rest = vec![7u8; 300];
        rest.extend_from_slice(&trailer(301).expect("fits"));
        assert!(body(&packet(last, &rest)).is_err());
        assert!(body(&packet(last, &[1])).is_err());
        assert!(body(&packet(last, &[])).is_err());
        let not_last = Repr { index: 1, ..last };
        assert!(body(&packet(not_last, &trailer(0).expect("fits"))).is_err());
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
                padded: false,
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
            if let Ok(found) = body(&bytes) {
                prop_assert!(found.len() + HEADER_LEN <= bytes.len());
            }
        }
    }
}
