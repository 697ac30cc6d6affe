//! Remote reads: the BTL's `get` carried over the reliable stream.
//!
//! A process that wants bytes of a peer's memory sends a request; the peer
//! answers with the bytes, straight from that memory, as one message of
//! consecutive datagrams, which the reader copies straight into its own
//! destination. Both messages carry the reliability flag
//! [`FLAG_READ`](crate::rel::FLAG_READ), and their BTL tag says which of the
//! two they are ([`TAG_REQUEST`], [`TAG_REPLY`]): they belong to the BTL,
//! not to its host, whose tags stay free.
//!
//! A request (the whole payload):
//!
//! ```text
//!  0          4          8                 16                24        32
//!  +----------+----------+-----------------+-----------------+---------+
//!  |    id    | reserved |   region key    |     address     |   len   |
//!  +----------+----------+-----------------+-----------------+---------+
//! ```
//!
//! A reply starts with a header, then the bytes, `len` of them across the
//! message's datagrams when `status` is [`STATUS_OK`], none otherwise:
//!
//! ```text
//!  0          4          8
//!  +----------+----------+--- bytes ...
//!  |    id    |  status  |
//!  +----------+----------+---
//! ```
//!
//! `id` is the reader's, echoed. The key names a region the owner of the
//! memory registered; the owner serves only ranges inside one.

use crate::field::{Field, read_u32, write_u32};
use crate::{Error, Result};

/// Tag of a request.
pub const TAG_REQUEST: u8 = 0;
/// Tag of a reply.
pub const TAG_REPLY: u8 = 1;
/// Bytes of a request.
pub const REQUEST_LEN: usize = 32;
/// Bytes of a reply's header.
pub const REPLY_HEADER_LEN: usize = 8;

/// Reply status: the bytes follow.
pub const STATUS_OK: u32 = 0;
/// Reply status: the key names no region of the owner's, or the range runs
/// outside it.
pub const STATUS_NO_REGION: u32 = 1;
/// Reply status: the owner cannot send that many bytes in one reply.
pub const STATUS_TOO_LONG: u32 = 2;
/// Reply status: the owner cannot send from the region (the fabric refused
/// to register it).
pub const STATUS_UNAVAILABLE: u32 = 3;

mod field {
    use super::Field;
    pub(super) const ID: Field = 0..4;
    pub(super) const RESERVED: Field = 4..8;
    pub(super) const KEY: Field = 8..16;
    pub(super) const ADDR: Field = 16..24;
    pub(super) const LEN: Field = 24..32;
    pub(super) const STATUS: Field = 4..8;
}

fn read_u64(bytes: &[u8], field: Field) -> u64 {
    let hi = read_u32(bytes, field.start..field.start + 4);
    let lo = read_u32(bytes, field.start + 4..field.end);
    (u64::from(hi) << 32) | u64::from(lo)
}

fn write_u64(bytes: &mut [u8], field: Field, value: u64) {
    write_u32(bytes, field.start..field.start + 4, (value >> 32) as u32);
    write_u32(bytes, field.start + 4..field.end, value as u32);
}

/// A request for `len` bytes at `addr` inside region `key` of the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// The reader's name for the read, echoed in the reply.
    pub id: u32,
    /// The region, as its owner registered it.
    pub key: u64,
    /// The first byte wanted, in the owner's address space.
    pub addr: u64,
    /// Bytes wanted.
    pub len: u64,
}

impl Request {
    /// Parses a request payload.
    ///
    /// # Errors
    /// [`Error`] on a payload that is not [`REQUEST_LEN`] bytes, or a
    /// nonzero reserved field.
    pub fn parse(payload: &[u8]) -> Result<Self> {
        if payload.len() != REQUEST_LEN || read_u32(payload, field::RESERVED) != 0 {
            return Err(Error);
        }
        Ok(Self {
            id: read_u32(payload, field::ID),
            key: read_u64(payload, field::KEY),
            addr: read_u64(payload, field::ADDR),
            len: read_u64(payload, field::LEN),
        })
    }

    /// Writes the request into the first [`REQUEST_LEN`] bytes of `buffer`.
    ///
    /// # Panics
    /// If `buffer` is shorter than [`REQUEST_LEN`].
    pub fn emit(&self, buffer: &mut [u8]) {
        write_u32(buffer, field::ID, self.id);
        write_u32(buffer, field::RESERVED, 0);
        write_u64(buffer, field::KEY, self.key);
        write_u64(buffer, field::ADDR, self.addr);
        write_u64(buffer, field::LEN, self.len);
    }
}

/// The header of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReplyHeader {
    /// The request's id.
    pub id: u32,
    /// [`STATUS_OK`], or why no bytes follow.
    pub status: u32,
}

impl ReplyHeader {
    /// Parses the header at the start of a reply's first datagram; the bytes
    /// after [`REPLY_HEADER_LEN`] are the read's.
    ///
    /// # Errors
    /// [`Error`] on a payload shorter than [`REPLY_HEADER_LEN`].
    pub fn parse(payload: &[u8]) -> Result<Self> {
        if payload.len() < REPLY_HEADER_LEN {
            return Err(Error);
        }
        Ok(Self {
            id: read_u32(payload, field::ID),
            status: read_u32(payload, field::STATUS),
        })
    }

    /// Writes the header into the first [`REPLY_HEADER_LEN`] bytes of
    /// `buffer`.
    ///
    /// # Panics
    /// If `buffer` is shorter than [`REPLY_HEADER_LEN`].
    pub fn emit(&self, buffer: &mut [u8]) {
        write_u32(buffer, field::ID, self.id);
        write_u32(buffer, field::STATUS, self.status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_request_parses_as_emitted(id: u32, key: u64, addr: u64, len: u64) {
            let request = Request { id, key, addr, len };
            let mut bytes = [0u8; REQUEST_LEN];
            request.emit(&mut bytes);
            prop_assert_eq!(Request::parse(&bytes), Ok(request));
        }

        #[test]
        fn a_reply_header_parses_as_emitted(id: u32, status: u32, tail in 0usize..16) {
            let header = ReplyHeader { id, status };
            let mut bytes = vec![0u8; REPLY_HEADER_LEN + tail];
            header.emit(&mut bytes);
            prop_assert_eq!(ReplyHeader::parse(&bytes), Ok(header));
        }

        #[test]
        fn any_bytes_parse_or_fail_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Request::parse(&bytes);
            let _ = ReplyHeader::parse(&bytes);
        }
    }

    #[test]
    fn a_request_of_the_wrong_length_or_with_reserved_bits_is_refused() {
        let mut bytes = [0u8; REQUEST_LEN + 1];
        assert_eq!(Request::parse(&bytes), Err(Error));
        assert_eq!(Request::parse(&bytes[..REQUEST_LEN - 1]), Err(Error));
        bytes[5] = 1;
        assert_eq!(Request::parse(&bytes[..REQUEST_LEN]), Err(Error));
        assert_eq!(
            ReplyHeader::parse(&bytes[..REPLY_HEADER_LEN - 1]),
            Err(Error)
        );
    }
}
