//! The payload of a coalesced datagram (reliability flag
//! [`FLAG_COALESCED`](crate::rel::FLAG_COALESCED)): several whole messages
//! to one peer, packed by the sender into one datagram, each to be
//! delivered on its own, in order.
//!
//! The payload is a sequence of records, back to back, with nothing after
//! the last:
//!
//! ```text
//!  0     1          2          4
//!  +-----+----------+----------+---------------+
//!  | tag | reserved | len (LE) |  len bytes    |  ... next record
//!  +-----+----------+----------+---------------+
//! ```
//!
//! * `tag` is the message's BTL tag (the datagram's own BTL header tag is
//!   that of the first record, and is not used).
//! * `reserved` is zero.
//! * `len` is the message's length, **little-endian** (unlike the headers,
//!   which are big-endian: the record format was specified so, and it is
//!   read only by this module).
//!
//! A list with no record, a record whose header or bytes run past the end,
//! or a nonzero reserved byte is malformed: [`Records`] yields one error and
//! stops, and [`validate`] refuses it, so a receiver can reject the whole
//! datagram before delivering any of it.

use crate::{Error, Result};

/// Bytes of a record's header.
pub const RECORD_HEADER_LEN: usize = 4;
/// Longest message one record can carry.
pub const MAX_RECORD_LEN: usize = u16::MAX as usize;

/// One message of a coalesced payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The message's tag.
    pub tag: u8,
    /// The message's bytes.
    pub bytes: &'a [u8],
}

/// Bytes a record of a `len`-byte message takes.
pub const fn record_len(len: usize) -> usize {
    RECORD_HEADER_LEN + len
}

/// An iterator over the records of a coalesced payload. On a malformed
/// payload it yields one `Err` and then ends; it never panics.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    rest: &'a [u8],
    seen: usize,
    failed: bool,
}

impl<'a> Records<'a> {
    /// The records of `payload`.
    pub const fn new(payload: &'a [u8]) -> Self {
        Self {
            rest: payload,
            seen: 0,
            failed: false,
        }
    }

    fn fail(&mut self) -> Option<Result<Record<'a>>> {
        self.failed = true;
        self.rest = &[];
        Some(Err(Error))
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.rest.is_empty() {
            // An empty list is malformed: a coalesced datagram carries at
            // least one message.
            return if self.seen == 0 { self.fail() } else { None };
        }
        let Some((header, body)) = self.rest.split_first_chunk::<RECORD_HEADER_LEN>() else {
            return self.fail();
        };
        let [tag, reserved, lo, hi] = *header;
        let len = usize::from(u16::from_le_bytes([lo, hi]));
        if reserved != 0 || len > body.len() {
            return self.fail();
        }
        let (bytes, rest) = body.split_at(len);
        self.rest = rest;
        self.seen += 1;
        Some(Ok(Record { tag, bytes }))
    }
}

/// The number of records of `payload`, if it is well formed.
///
/// # Errors
/// [`Error`] if the list is empty, truncated or has a nonzero reserved byte.
pub fn validate(payload: &[u8]) -> Result<usize> {
    let mut count = 0;
    for record in Records::new(payload) {
        record?;
        count += 1;
    }
    Ok(count)
}

/// Writes a record header for a `len`-byte message with `tag` into the
/// first [`RECORD_HEADER_LEN`] bytes of `buf`.
///
/// # Errors
/// [`Error`] if `buf` is too short or `len` exceeds [`MAX_RECORD_LEN`].
pub fn emit_header(buf: &mut [u8], tag: u8, len: usize) -> Result<()> {
    let len = u16::try_from(len).map_err(|_| Error)?;
    let header = buf.get_mut(..RECORD_HEADER_LEN).ok_or(Error)?;
    let [lo, hi] = len.to_le_bytes();
    header.copy_from_slice(&[tag, 0, lo, hi]);
    Ok(())
}

/// Turns the `len`-byte message at the start of `buf` into a one-record
/// list in place (the bytes move up by [`RECORD_HEADER_LEN`]); returns the
/// list's length.
///
/// # Errors
/// [`Error`] if `buf` cannot hold the record or `len` exceeds
/// [`MAX_RECORD_LEN`]; `buf` is then unchanged.
pub fn wrap_in_place(buf: &mut [u8], tag: u8, len: usize) -> Result<usize> {
    let total = record_len(len);
    if total > buf.len() || len > MAX_RECORD_LEN {
        return Err(Error);
    }
    buf.copy_within(..len, RECORD_HEADER_LEN);
    emit_header(buf, tag, len)?;
    Ok(total)
}

/// Appends a record of `bytes` with `tag` at offset `at` of `buf` (the end
/// of the list so far); returns the list's new length.
///
/// # Errors
/// [`Error`] if `buf` cannot hold it or `bytes` is longer than
/// [`MAX_RECORD_LEN`]; `buf` is then unchanged.
pub fn append(buf: &mut [u8], at: usize, tag: u8, bytes: &[u8]) -> Result<usize> {
    let end = at.checked_add(record_len(bytes.len())).ok_or(Error)?;
    if end > buf.len() || bytes.len() > MAX_RECORD_LEN {
        return Err(Error);
    }
    emit_header(&mut buf[at..], tag, bytes.len())?;
    buf[at + RECORD_HEADER_LEN..end].copy_from_slice(bytes);
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fixture() {
        let bytes = [7, 0, 2, 0, b'h', b'i', 9, 0, 0, 0];
        let records: Vec<_> = Records::new(&bytes).collect::<Result<_>>().expect("valid");
        assert_eq!(
            records,
            [
                Record {
                    tag: 7,
                    bytes: b"hi"
                },
                Record { tag: 9, bytes: b"" }
            ]
        );
        assert_eq!(validate(&bytes), Ok(2));
    }

    #[test]
    fn malformed_lists_are_refused() {
        // Empty, a short header, a length past the end, a reserved byte.
        for bad in [&[][..], &[1, 0, 0], &[1, 0, 3, 0, 1, 2], &[1, 1, 0, 0]] {
            assert_eq!(validate(bad), Err(Error), "{bad:?}");
            let mut records = Records::new(bad);
            assert_eq!(records.next(), Some(Err(Error)));
            assert_eq!(records.next(), None);
        }
        // A good record then a truncated one: the good one, then the error.
        let mut records = Records::new(&[1, 0, 1, 0, 5, 2, 0]);
        assert_eq!(
            records.next(),
            Some(Ok(Record {
                tag: 1,
                bytes: &[5]
            }))
        );
        assert_eq!(records.next(), Some(Err(Error)));
        assert_eq!(records.next(), None);
    }

    #[test]
    fn emitting_refuses_what_does_not_fit() {
        let mut buf = [0u8; 8];
        assert_eq!(wrap_in_place(&mut buf, 1, 5), Err(Error));
        assert_eq!(append(&mut buf, 2, 1, &[0; 3]), Err(Error));
        assert_eq!(append(&mut buf, usize::MAX, 1, &[]), Err(Error));
        assert_eq!(emit_header(&mut buf, 1, MAX_RECORD_LEN + 1), Err(Error));
        assert_eq!(buf, [0; 8]);
    }

    proptest! {
        #[test]
        fn wrap_then_append_round_trips(
            messages in proptest::collection::vec(
                (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..64)), 1..16)
        ) {
            let mut buf = vec![0u8; 2048];
            let (tag0, first) = &messages[0];
            buf[..first.len()].copy_from_slice(first);
            let mut end = wrap_in_place(&mut buf, *tag0, first.len()).expect("fits");
            for (tag, bytes) in &messages[1..] {
                end = append(&mut buf, end, *tag, bytes).expect("fits");
            }
            let parsed: Vec<_> = Records::new(&buf[..end])
                .map(|r| r.map(|r| (r.tag, r.bytes.to_vec())))
                .collect::<Result<_>>()
                .expect("valid");
            prop_assert_eq!(&parsed, &messages);
            prop_assert_eq!(validate(&buf[..end]), Ok(messages.len()));
            // A list cut short by one byte is refused.
            prop_assert_eq!(validate(&buf[..end - 1]), Err(Error));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let total: usize = Records::new(&bytes)
                .map_while(|r| r.ok())
                .map(|r| record_len(r.bytes.len()))
                .sum();
            prop_assert!(total <= bytes.len());
            if validate(&bytes).is_ok() {
                prop_assert_eq!(total, bytes.len());
            }
        }
    }
}
