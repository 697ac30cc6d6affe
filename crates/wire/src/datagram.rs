//! The whole reliable datagram: BTL header, reliability extension, payload.
//!
//! ```text
//!  0          8                                   40
//!  +----------+-----------------------------------+-------------------
//!  |   BTL    |      reliability extension        |  payload ...
//!  +----------+-----------------------------------+-------------------
//!                                  ^ checksum at 32..36
//! ```
//!
//! The checksum of a reliable datagram (present when the extension's
//! [`rel::FLAG_CHECKSUM`] is set) is the IEEE CRC-32 (as in Ethernet and
//! zlib; not CRC-32C) of every byte of the datagram, payload first: the
//! bytes after [`HEADER_LEN`], then the two headers with the 4-byte checksum
//! field counted as zeros. With the payload first, a sender can checksum the
//! payload as it writes it, while it is in the cache, and finish with the
//! headers when it sends ([`payload_checksum`], [`fill_checksum_after`]);
//! headers change at every resend, the payload never. This module owns the
//! offsets, so callers never add [`btl::HEADER_LEN`] to
//! [`rel::CHECKSUM_FIELD`] themselves.
//!
//! A sender may hold the datagram in pieces (its headers in one buffer, the
//! user's payload in another): [`checksum`] takes the pieces in order.
//!
//! ```
//! use udbtl_wire::{btl, datagram, rel};
//!
//! let mut head = [0u8; datagram::HEADER_LEN];
//! btl::Repr { tag: 1, job_key: 7, reliable: true }
//!     .emit(&mut btl::Packet::new_unchecked(&mut head[..]));
//! rel::Repr { flags: rel::FLAG_CHECKSUM, ..Default::default() }
//!     .emit(&mut datagram::extension_mut(&mut head[..])?);
//! let payload = b"hello";
//! datagram::fill_checksum(&mut head, &[payload]);
//!
//! // The receiver sees one contiguous datagram.
//! let received = [&head[..], &payload[..]].concat();
//! assert!(datagram::verify_checksum(&received));
//! # Ok::<(), udbtl_wire::Error>(())
//! ```

use core::ops::Range;

use crate::{Error, Result, btl, rel};

/// Length of both headers (BTL header and reliability extension): where the
/// payload of a reliable datagram starts.
pub const HEADER_LEN: usize = btl::HEADER_LEN + rel::HEADER_LEN;

/// Byte range of the checksum field inside the datagram.
pub const CHECKSUM_FIELD: Range<usize> =
    btl::HEADER_LEN + rel::CHECKSUM_FIELD.start..btl::HEADER_LEN + rel::CHECKSUM_FIELD.end;

/// The reliability extension of a datagram that starts with the BTL header.
///
/// # Errors
/// [`crate::Error`] if `datagram` is shorter than [`HEADER_LEN`].
pub fn extension(datagram: &[u8]) -> Result<rel::Packet<&[u8]>> {
    datagram
        .get(btl::HEADER_LEN..)
        .ok_or(Error)
        .and_then(rel::Packet::new_checked)
}

/// The reliability extension of a datagram (or of the buffer holding its
/// headers) that starts with the BTL header, for writing.
///
/// # Errors
/// [`crate::Error`] if `datagram` is shorter than [`HEADER_LEN`].
pub fn extension_mut(datagram: &mut [u8]) -> Result<rel::Packet<&mut [u8]>> {
    datagram
        .get_mut(btl::HEADER_LEN..)
        .ok_or(Error)
        .and_then(rel::Packet::new_checked)
}

/// The checksum of the datagram made of `parts` in order: the IEEE CRC-32 of
/// the bytes after [`HEADER_LEN`] followed by the first [`HEADER_LEN`] bytes,
/// with the bytes at [`CHECKSUM_FIELD`] counted as zeros, whatever they hold
/// (the caller need not clear the field first).
///
/// `parts[0]` starts with the BTL header. The parts may split the datagram
/// anywhere, even inside the checksum field; the result depends only on the
/// concatenated bytes. Never panics.
#[must_use]
pub fn checksum(parts: &[&[u8]]) -> u32 {
    checksum_of(parts.iter().copied())
}

/// [`checksum`] over any sequence of parts (read twice: payload, headers).
fn checksum_of<'a>(parts: impl IntoIterator<Item = &'a [u8]> + Clone) -> u32 {
    let mut payload = crc32fast::Hasher::new();
    for_each_in(parts.clone(), HEADER_LEN..usize::MAX, |bytes| {
        payload.update(bytes);
    });
    finish_checksum(payload.finalize(), parts)
}

/// Continues the payload's CRC-32 `payload` over the headers at the start of
/// `parts` (the first [`HEADER_LEN`] bytes), with the checksum field zeroed.
fn finish_checksum<'a>(payload: u32, parts: impl IntoIterator<Item = &'a [u8]> + Clone) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(payload);
    for_each_in(parts.clone(), 0..CHECKSUM_FIELD.start, |bytes| {
        hasher.update(bytes);
    });
    hasher.update(&[0; CHECKSUM_FIELD.end - CHECKSUM_FIELD.start]);
    for_each_in(parts, CHECKSUM_FIELD.end..HEADER_LEN, |bytes| {
        hasher.update(bytes);
    });
    hasher.finalize()
}

/// The CRC-32 of a payload held in `parts`, in order: what
/// [`fill_checksum_after`] completes once the headers are written. A sender
/// computes it right after writing the payload, so that the bytes are read
/// while still in the cache rather than again when the datagram leaves.
#[must_use]
pub fn payload_checksum(parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

/// Feeds the bytes of the concatenation of `parts` that lie in `range` to
/// `sink`, in order, in pieces.
fn for_each_in<'a>(
    parts: impl IntoIterator<Item = &'a [u8]>,
    range: Range<usize>,
    mut sink: impl FnMut(&[u8]),
) {
    let mut offset = 0usize;
    for part in parts {
        let end = offset.saturating_add(part.len());
        let lo = range.start.clamp(offset, end) - offset;
        let hi = range.end.clamp(offset, end) - offset;
        if lo < hi {
            sink(&part[lo..hi]);
        }
        offset = end;
        if offset >= range.end {
            break;
        }
    }
}

/// Writes `value` into the checksum field of `head`, the buffer that starts
/// with the datagram's BTL header.
///
/// # Panics
/// If `head` is shorter than [`HEADER_LEN`]: the sender sized it.
pub fn set_checksum(head: &mut [u8], value: u32) {
    assert!(
        head.len() >= HEADER_LEN,
        "datagram head of {} bytes holds no reliability extension",
        head.len()
    );
    rel::Packet::new_unchecked(&mut head[btl::HEADER_LEN..]).set_checksum(value);
}

/// Computes the checksum of the datagram `head` followed by `rest`, writes it
/// into `head`'s checksum field and returns it. `head` starts with the BTL
/// header and holds both headers; `rest` is the remainder (often the
/// payload), possibly empty.
///
/// This does not set [`rel::FLAG_CHECKSUM`]; the extension's flags are the
/// caller's.
///
/// # Panics
/// If `head` is shorter than [`HEADER_LEN`]: the sender sized it.
pub fn fill_checksum(head: &mut [u8], rest: &[&[u8]]) -> u32 {
    let sum = checksum_of(core::iter::once(&*head).chain(rest.iter().copied()));
    set_checksum(head, sum);
    sum
}

/// Like [`fill_checksum`], for a sender that already holds the CRC-32 of
/// the payload, `payload` ([`payload_checksum`] of every byte after
/// [`HEADER_LEN`], in `head` and after it): only the headers are read.
///
/// # Panics
/// If `head` is shorter than [`HEADER_LEN`]: the sender sized it.
pub fn fill_checksum_after(head: &mut [u8], payload: u32) -> u32 {
    let sum = finish_checksum(payload, [&*head]);
    set_checksum(head, sum);
    sum
}

/// `true` if the checksum field of the received `datagram` (BTL header,
/// extension and payload, in one buffer) matches its contents.
///
/// Whether the checksum is meaningful ([`rel::FLAG_CHECKSUM`]) is the
/// caller's decision. Never panics: a datagram shorter than [`HEADER_LEN`]
/// is `false`.
#[must_use]
pub fn verify_checksum(datagram: &[u8]) -> bool {
    extension(datagram).is_ok_and(|ext| ext.checksum() == checksum(&[datagram]))
}

/// A receiver's 256-bit secret, which it hands only to the processes of its
/// job: the datagrams sent to it are sealed under keys derived from it
/// ([`crate::seal::SealKey::derive`]). Its `Debug` form never shows the
/// bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthKey(pub [u8; 32]);

impl core::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("AuthKey(..)")
    }
}

/// Where a datagram's `seq` and `ack` lie in their streams beyond what the
/// 32-bit fields say: the high 32 bits of each 64-bit stream position (the
/// epoch: how often the stream's numbers wrapped before). They are not
/// sent; both ends track them, and a seal's tag covers them, so a datagram
/// recorded before a stream's numbers wrapped does not open after. A
/// number that is not a stream position (a probe's time token, and its
/// echo) has epoch 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Epochs {
    /// The epoch of `seq`, in the sender's send stream.
    pub seq: u32,
    /// The epoch of `ack`, in the receiver's send stream.
    pub ack: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqNum;
    use proptest::prelude::*;

    /// A sealed reliable datagram carrying `payload`.
    fn datagram(payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_LEN + payload.len()];
        btl::Repr {
            tag: 9,
            job_key: 0xcafe_f00d,
            reliable: true,
        }
        .emit(&mut btl::Packet::new_unchecked(&mut bytes[..]));
        rel::Repr {
            src: 3,
            seq: SeqNum(41),
            ack: SeqNum(17),
            sack: 0b101,
            credit: 64,
            flags: rel::FLAG_CHECKSUM | rel::FLAG_FIRST | rel::FLAG_LAST,
            checksum: 0,
        }
        .emit(&mut extension_mut(&mut bytes).unwrap());
        bytes[HEADER_LEN..].copy_from_slice(payload);
        let (head, tail) = bytes.split_at_mut(HEADER_LEN);
        fill_checksum(head, &[tail]);
        bytes
    }

    #[test]
    fn layout() {
        assert_eq!(HEADER_LEN, 40);
        assert_eq!(CHECKSUM_FIELD, 32..36);
    }

    #[test]
    fn checksum_is_ieee_crc32_of_payload_then_headers_with_the_field_zeroed() {
        let bytes = datagram(b"payload");
        let mut zeroed = bytes.clone();
        zeroed[CHECKSUM_FIELD].fill(0);
        let reordered = [&zeroed[HEADER_LEN..], &zeroed[..HEADER_LEN]].concat();
        assert_eq!(checksum(&[&bytes]), crc32fast::hash(&reordered));
        assert_eq!(
            extension(&bytes).unwrap().checksum(),
            crc32fast::hash(&reordered)
        );
        // The check value of the IEEE CRC-32, so it cannot be CRC-32C.
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn checksum_ignores_the_fields_contents() {
        let mut bytes = datagram(b"abc");
        let sum = checksum(&[&bytes]);
        bytes[CHECKSUM_FIELD].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(checksum(&[&bytes]), sum);
    }

    #[test]
    fn header_only_datagram() {
        let bytes = datagram(b"");
        assert_eq!(bytes.len(), HEADER_LEN);
        assert!(verify_checksum(&bytes));
    }

    #[test]
    fn short_input_is_rejected() {
        let bytes = datagram(b"");
        for len in 0..HEADER_LEN {
            assert!(!verify_checksum(&bytes[..len]), "length {len}");
            assert!(extension(&bytes[..len]).is_err());
        }
    }

    #[test]
    #[should_panic(expected = "holds no reliability extension")]
    fn set_checksum_on_a_short_head_panics() {
        set_checksum(&mut [0u8; HEADER_LEN - 1], 1);
    }

    #[test]
    fn the_key_stays_out_of_debug_output() {
        assert_eq!(format!("{:?}", AuthKey([7; 32])), "AuthKey(..)");
    }

    proptest! {
        #[test]
        fn split_parts_agree_with_one_piece(
            payload in proptest::collection::vec(any::<u8>(), 0..96),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..5),
        ) {
            let bytes = datagram(&payload);
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut start = 0;
            for cut in cuts {
                parts.push(&bytes[start..cut]);
                start = cut;
            }
            parts.push(&bytes[start..]);
            prop_assert_eq!(checksum(&parts), checksum(&[&bytes]));
        }

        #[test]
        fn a_payload_checksummed_ahead_seals_the_same(
            payload in proptest::collection::vec(any::<u8>(), 0..200),
            cut: prop::sample::Index,
        ) {
            let sealed = datagram(&payload);
            let mut head = sealed[..HEADER_LEN].to_vec();
            head[CHECKSUM_FIELD].fill(0xa5);
            let (a, b) = payload.split_at(cut.index(payload.len() + 1));
            let ahead = payload_checksum(&[a, b]);
            prop_assert_eq!(fill_checksum_after(&mut head, ahead), checksum(&[&sealed]));
            prop_assert_eq!(&head[..], &sealed[..HEADER_LEN]);
        }

        #[test]
        fn split_at_every_point(payload in proptest::collection::vec(any::<u8>(), 0..48)) {
            let bytes = datagram(&payload);
            let whole = checksum(&[&bytes]);
            for cut in 0..=bytes.len() {
                let (a, b) = bytes.split_at(cut);
                prop_assert_eq!(checksum(&[a, b]), whole, "cut at {}", cut);
                prop_assert_eq!(checksum(&[&[], a, &[], b]), whole);
            }
        }

        #[test]
        fn verify_accepts_intact_and_rejects_any_flipped_byte(
            payload in proptest::collection::vec(any::<u8>(), 0..128),
            index: prop::sample::Index,
            flip in 1u8..,
        ) {
            let bytes = datagram(&payload);
            prop_assert!(verify_checksum(&bytes));
            let mut bad = bytes.clone();
            let at = index.index(bad.len());
            bad[at] ^= flip;
            prop_assert!(!verify_checksum(&bad), "byte {} ^ {:#x} passed", at, flip);
        }

        #[test]
        fn verify_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = verify_checksum(&bytes);
        }

    }
}
