//! The reliability extension of the BTL header.
//!
//! When the BTL header's `RELIABLE` flag is set, these 32 bytes follow it:
//!
//! ```text
//!  0        4        8        12                20       22       24       28       32
//!  +--------+--------+--------+-----------------+--------+--------+--------+--------+
//!  | src id |  seq   |  ack   |   sack bitmap   | credit | flags  |checksum|reserved|
//!  +--------+--------+--------+-----------------+--------+--------+--------+--------+
//! ```
//!
//! * `src id` identifies the sending process (the id it published in its
//!   modex entry, [`crate::modex::Address::proc_id`]). The receiver
//!   demultiplexes by the datagram's source address, not by this field; it
//!   checks `src` against the id it knows for that endpoint, so datagrams from
//!   a process that reused the address are dropped.
//! * `seq` is this datagram's sequence number on the sender→receiver
//!   stream (unused on an ACK-only datagram).
//! * `ack` is cumulative: every sequence number before it has arrived.
//! * `sack` bit `i` says `ack + 1 + i` arrived too (a selective ACK of the
//!   64 datagrams after the first gap).
//! * `credit` is how many datagrams past `ack` the receiver will accept.
//! * `checksum` is the IEEE CRC-32 (the polynomial of Ethernet and zlib, not
//!   CRC-32C) of the whole datagram, payload first (the payload, then the
//!   BTL header and this extension), with this field counted as zeros,
//!   meaningful when the `CHECKSUM` flag is set: on fabrics that do not
//!   check integrity themselves. [`crate::datagram`] computes, writes and verifies it.
//! * `flags`:
//!
//!   | bit    | name        | meaning                                            |
//!   |--------|-------------|----------------------------------------------------|
//!   | `0x01` | `ACK_ONLY`  | no payload, only acknowledgement                   |
//!   | `0x02` | `ACK_REQ`   | acknowledge at once                                |
//!   | `0x04` | `CHECKSUM`  | the checksum field is meaningful                   |
//!   | `0x08` | `FIRST`     | first fragment of a message                        |
//!   | `0x10` | `LAST`      | last fragment of a message                         |
//!   | `0x20` | `ABORT`     | the sender gave up on the message in progress      |
//!   | `0x40` | `RESET`     | the sender declared the receiver lost              |
//!   | `0x80` | `COALESCED` | the payload is a list of whole messages ([`crate::coalesced`]) |
//!   | `0x100`| `SEALED`    | the datagram is sealed: `checksum` and `reserved` hold its packet number, a tag follows ([`crate::seal`]) |
//!   | `0x200`| `ECHO`      | an acknowledgement whose `seq` is the `seq` of the probe it answers |
//!   | `0x400`| `ENCRYPTED` | with `SEALED`: the payload is encrypted            |
//!
//! * With `SEALED`, bytes 24..32 (the checksum and reserved fields together)
//!   hold the datagram's 64-bit packet number instead, and a 16-byte
//!   AES-GCM tag follows the extension ([`crate::seal`]); `SEALED` and
//!   `CHECKSUM` exclude each other. Without it, `reserved` is zero.

use crate::field::{Field, read_u16, read_u32, write_u16, write_u32};
use crate::seq::SeqNum;
use crate::{Error, Result};

/// Length of the extension in bytes.
pub const HEADER_LEN: usize = 32;

/// Flag: the datagram carries no payload, only acknowledgement.
pub const FLAG_ACK_ONLY: u16 = 0x1;
/// Flag: the sender asks for an immediate acknowledgement.
pub const FLAG_ACK_REQ: u16 = 0x2;
/// Flag: the checksum field is meaningful.
pub const FLAG_CHECKSUM: u16 = 0x4;
/// Flag: the first fragment of a message.
pub const FLAG_FIRST: u16 = 0x8;
/// Flag: the last fragment of a message.
pub const FLAG_LAST: u16 = 0x10;
/// Flag: the sender gave up on the message in progress (set on an empty
/// last fragment); the receiver drops what it has of it.
pub const FLAG_ABORT: u16 = 0x20;
/// Flag: the sender declared the receiver lost: every stream between them
/// is broken; the receiver must report it.
pub const FLAG_RESET: u16 = 0x40;
/// Flag: the payload is several whole messages packed by the sender, as a
/// list of [`crate::coalesced`] records (tag, length, bytes), to be
/// delivered one by one, in order. Set only with `FIRST | LAST`.
pub const FLAG_COALESCED: u16 = 0x80;
/// Flag: the datagram is sealed ([`crate::seal`]): bytes 24..32
/// ([`PACKET_NUMBER_FIELD`]) hold its packet number and a tag follows the extension;
/// excludes [`FLAG_CHECKSUM`].
pub const FLAG_SEALED: u16 = 0x100;
/// Flag: an acknowledgement-only datagram that answers a probe (an
/// acknowledgement-only datagram with [`FLAG_ACK_REQ`]): its `seq` is the
/// probe's `seq`, a token the prober made of the time it sent the probe,
/// which shows the peer alive since then and cannot be replayed to show
/// more.
pub const FLAG_ECHO: u16 = 0x200;
/// Flag: with [`FLAG_SEALED`], the payload is encrypted
/// ([`crate::seal::Protection::Encrypt`]).
pub const FLAG_ENCRYPTED: u16 = 0x400;
/// Flag: the message belongs to the BTL's remote reads ([`crate::read`]), a
/// request or a reply as its BTL tag says, not to the BTL's host. Set on
/// every datagram of the message.
pub const FLAG_READ: u16 = 0x800;
const KNOWN_FLAGS: u16 = FLAG_ACK_ONLY
    | FLAG_ACK_REQ
    | FLAG_CHECKSUM
    | FLAG_FIRST
    | FLAG_LAST
    | FLAG_ABORT
    | FLAG_RESET
    | FLAG_COALESCED
    | FLAG_SEALED
    | FLAG_ECHO
    | FLAG_ENCRYPTED
    | FLAG_READ;

mod field {
    use super::Field;
    pub(super) const SRC: Field = 0..4;
    pub(super) const SEQ: Field = 4..8;
    pub(super) const ACK: Field = 8..12;
    pub(super) const SACK_HI: Field = 12..16;
    pub(super) const SACK_LO: Field = 16..20;
    pub(super) const CREDIT: Field = 20..22;
    pub(super) const FLAGS: Field = 22..24;
    pub(super) const CHECKSUM: Field = 24..28;
    pub(super) const RESERVED: Field = 28..32;
}

/// Byte range of the checksum field inside the extension.
pub const CHECKSUM_FIELD: core::ops::Range<usize> = field::CHECKSUM;

/// Byte range of the packet number inside the extension, with
/// [`FLAG_SEALED`]: the checksum and reserved fields together.
pub const PACKET_NUMBER_FIELD: core::ops::Range<usize> = field::CHECKSUM.start..field::RESERVED.end;

/// A view over the extension.
///
/// # Panics
/// The accessors index the buffer directly. On a view made by
/// [`Packet::new_checked`] they cannot panic; on one made by
/// [`Packet::new_unchecked`] over a buffer shorter than [`HEADER_LEN`] they
/// panic.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length. Use only on buffers this
    /// process sized itself, such as when emitting.
    ///
    /// # Panics
    /// Never here, but every accessor and setter panics if the buffer is
    /// shorter than [`HEADER_LEN`]: the length is the caller's promise.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after checking it holds the whole extension.
    ///
    /// # Errors
    /// [`Error`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks the buffer is long enough for every accessor.
    ///
    /// # Errors
    /// [`Error`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error)
        } else {
            Ok(())
        }
    }

    fn u32_at(&self, f: Field) -> u32 {
        read_u32(self.buffer.as_ref(), f)
    }

    /// The sender's id.
    pub fn src(&self) -> u32 {
        self.u32_at(field::SRC)
    }

    /// The sequence number.
    pub fn seq(&self) -> SeqNum {
        SeqNum(self.u32_at(field::SEQ))
    }

    /// The cumulative acknowledgement.
    pub fn ack(&self) -> SeqNum {
        SeqNum(self.u32_at(field::ACK))
    }

    /// The selective acknowledgement bitmap.
    pub fn sack(&self) -> u64 {
        (u64::from(self.u32_at(field::SACK_HI)) << 32) | u64::from(self.u32_at(field::SACK_LO))
    }

    /// The advertised credit.
    pub fn credit(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CREDIT)
    }

    /// The flag bits.
    pub fn flags(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::FLAGS)
    }

    /// The checksum field.
    pub fn checksum(&self) -> u32 {
        self.u32_at(field::CHECKSUM)
    }

    /// The reserved field.
    pub fn reserved(&self) -> u32 {
        self.u32_at(field::RESERVED)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::CHECKSUM, value);
    }
}

/// The validated contents of the extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Repr {
    /// The sender's id.
    pub src: u32,
    /// This datagram's sequence number.
    pub seq: SeqNum,
    /// Cumulative acknowledgement.
    pub ack: SeqNum,
    /// Selective acknowledgement of the 64 sequence numbers after `ack`.
    pub sack: u64,
    /// Datagrams past `ack` the sender of this header will accept.
    pub credit: u16,
    /// Flag bits (`FLAG_*`).
    pub flags: u16,
    /// IEEE CRC-32 of the datagram (see [`crate::datagram::checksum`]),
    /// meaningful with [`FLAG_CHECKSUM`]. With [`FLAG_SEALED`] it is the high
    /// half of the packet number, which only [`crate::seal`] reads and
    /// writes.
    pub checksum: u32,
}

impl Repr {
    /// Parses a checked packet.
    ///
    /// # Errors
    /// [`Error`] on a buffer shorter than [`HEADER_LEN`], unknown flag bits,
    /// both [`FLAG_SEALED`] and [`FLAG_CHECKSUM`], [`FLAG_ENCRYPTED`] without
    /// [`FLAG_SEALED`], or a non-zero reserved field without [`FLAG_SEALED`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        let flags = packet.flags();
        let sealed = flags & FLAG_SEALED != 0;
        if flags & !KNOWN_FLAGS != 0
            || (sealed && flags & FLAG_CHECKSUM != 0)
            || (!sealed && (packet.reserved() != 0 || flags & FLAG_ENCRYPTED != 0))
        {
            return Err(Error);
        }
        Ok(Self {
            src: packet.src(),
            seq: packet.seq(),
            ack: packet.ack(),
            sack: packet.sack(),
            credit: packet.credit(),
            flags: packet.flags(),
            checksum: packet.checksum(),
        })
    }

    /// The number of bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the extension into the first [`HEADER_LEN`] bytes of `packet`;
    /// the reserved field is written as zero (a packet number is filled in
    /// afterwards by [`crate::seal::seal`]).
    ///
    /// # Panics
    /// If `packet`'s buffer is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        let b = packet.buffer.as_mut();
        write_u32(b, field::SRC, self.src);
        write_u32(b, field::SEQ, self.seq.0);
        write_u32(b, field::ACK, self.ack.0);
        write_u32(b, field::SACK_HI, (self.sack >> 32) as u32);
        write_u32(b, field::SACK_LO, self.sack as u32);
        write_u16(b, field::CREDIT, self.credit);
        write_u16(b, field::FLAGS, self.flags);
        write_u32(b, field::CHECKSUM, self.checksum);
        write_u32(b, field::RESERVED, 0);
    }

    /// `true` if every bit of `flag` is set.
    pub const fn has(&self, flag: u16) -> bool {
        self.flags & flag == flag
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[rustfmt::skip]
    static BYTES: [u8; HEADER_LEN] = [
        0, 0, 0, 7,  0, 0, 1, 0,  0xff, 0xff, 0xff, 0xff,
        0x80, 0, 0, 0, 0, 0, 0, 1,
        0, 64,  0, 0x1e,  0xde, 0xad, 0xbe, 0xef,  0, 0, 0, 0,
    ];

    fn repr() -> Repr {
        Repr {
            src: 7,
            seq: SeqNum(256),
            ack: SeqNum(u32::MAX),
            sack: (1 << 63) | 1,
            credit: 64,
            flags: FLAG_ACK_REQ | FLAG_CHECKSUM | FLAG_FIRST | FLAG_LAST,
            checksum: 0xdead_beef,
        }
    }

    #[test]
    fn fixture_round_trip() {
        assert_eq!(
            Repr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap(),
            repr()
        );
        let mut bytes = [0xaa; HEADER_LEN];
        repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn malformed_is_an_error() {
        assert!(Packet::new_checked(&BYTES[..HEADER_LEN - 1]).is_err());
        let mut bad = BYTES;
        bad[22] = 0x01;
        assert!(Repr::parse(&Packet::new_checked(&bad[..]).unwrap()).is_err());
        let mut bad = BYTES;
        bad[31] = 1;
        assert!(Repr::parse(&Packet::new_checked(&bad[..]).unwrap()).is_err());
    }

    #[test]
    fn every_known_flag_parses_and_the_next_bit_does_not() {
        for flag in [
            FLAG_ACK_ONLY,
            FLAG_ACK_REQ,
            FLAG_CHECKSUM,
            FLAG_FIRST,
            FLAG_LAST,
            FLAG_ABORT,
            FLAG_RESET,
            FLAG_COALESCED,
            FLAG_SEALED,
            FLAG_ECHO,
            FLAG_SEALED | FLAG_ENCRYPTED,
            FLAG_READ,
        ] {
            let mut bytes = BYTES;
            bytes[22..24].copy_from_slice(&flag.to_be_bytes());
            let parsed = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
            assert!(parsed.has(flag), "flag {flag:#x}");
        }
        let mut bytes = BYTES;
        bytes[22..24].copy_from_slice(&(FLAG_READ << 1).to_be_bytes());
        assert!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).is_err());
        bytes[22..24].copy_from_slice(&FLAG_ENCRYPTED.to_be_bytes());
        assert!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).is_err());
    }

    #[test]
    fn a_seal_owns_the_reserved_field_and_excludes_the_checksum_flag() {
        let mut bytes = BYTES;
        bytes[31] = 1;
        bytes[22..24].copy_from_slice(&FLAG_SEALED.to_be_bytes());
        assert!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).is_ok());
        bytes[22..24].copy_from_slice(&(FLAG_SEALED | FLAG_CHECKSUM).to_be_bytes());
        assert!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).is_err());
        assert_eq!(PACKET_NUMBER_FIELD, 24..32);
    }

    #[test]
    fn parse_of_a_short_unchecked_view_is_an_error() {
        assert!(Repr::parse(&Packet::new_unchecked(&BYTES[..HEADER_LEN - 1])).is_err());
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn unchecked_short_buffer_panics() {
        let _ = Packet::new_unchecked(&BYTES[..HEADER_LEN - 1]).reserved();
    }

    proptest! {
        #[test]
        fn emit_then_parse(src: u32, seq: u32, ack: u32, sack: u64, credit: u16, flags in 0u16..=KNOWN_FLAGS, checksum: u32) {
            // The excluded pairs.
            let flags = if flags & FLAG_SEALED != 0 { flags & !FLAG_CHECKSUM } else { flags & !FLAG_ENCRYPTED };
            let repr = Repr { src, seq: SeqNum(seq), ack: SeqNum(ack), sack, credit, flags, checksum };
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..48)) {
            if let Ok(packet) = Packet::new_checked(&bytes[..]) {
                let _ = Repr::parse(&packet);
                let _ = (packet.src(), packet.seq(), packet.ack(), packet.sack(), packet.credit());
                let _ = (packet.flags(), packet.checksum(), packet.reserved());
            }
            let _ = Repr::parse(&Packet::new_unchecked(&bytes[..]));
        }
    }
}
