//! The UD encapsulation header.
//!
//! Datagram providers that do not run on InfiniBand (UDP) carry, in front of
//! each payload, the fields an InfiniBand HCA would put in the packet's BTH and
//! DETH: the partition key and the queue key the receiver checks, plus the
//! optional immediate data of a send-with-immediate.
//!
//! ```text
//!  0      2      3      4      6      8             12            16
//!  +------+------+------+------+------+-------------+-------------+
//!  |magic |vers. |flags | pkey | rsvd |    qkey     |     imm     |
//!  +------+------+------+------+------+-------------+-------------+
//! ```
//!
//! `magic` is `0x5544` ("UD") and `version` is [`VERSION`]. Flag bit 0 means
//! the `imm` field is meaningful; every other flag bit and the reserved field
//! must be zero.

use crate::field::{Field, read_u16, read_u32, write_u16, write_u32};
use crate::{Error, Result};

/// Length of the encapsulation header in bytes.
pub const HEADER_LEN: usize = 16;
/// The magic number that starts every UD datagram.
pub const MAGIC: u16 = 0x5544;
/// The only version this crate understands.
pub const VERSION: u8 = 1;

const FLAG_IMM: u8 = 0x01;

mod field {
    use super::Field;
    pub(super) const MAGIC: Field = 0..2;
    pub(super) const VERSION: usize = 2;
    pub(super) const FLAGS: usize = 3;
    pub(super) const PKEY: Field = 4..6;
    pub(super) const RESERVED: Field = 6..8;
    pub(super) const QKEY: Field = 8..12;
    pub(super) const IMM: Field = 12..16;
}

/// A view over a UD encapsulation header and the payload that follows it.
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

    /// Wraps a buffer after checking it holds at least a whole header.
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

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The magic number.
    pub fn magic(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::MAGIC)
    }

    /// The header version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The raw flag byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// The partition key.
    pub fn pkey(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PKEY)
    }

    /// The reserved field (must be zero).
    pub fn reserved(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::RESERVED)
    }

    /// The queue key the sender addressed.
    pub fn qkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::QKEY)
    }

    /// The immediate data field, whatever the flags say.
    pub fn imm(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::IMM)
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the magic number.
    pub fn set_magic(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::MAGIC, value);
    }

    /// Sets the version.
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Sets the raw flag byte.
    pub fn set_flags(&mut self, value: u8) {
        self.buffer.as_mut()[field::FLAGS] = value;
    }

    /// Sets the partition key.
    pub fn set_pkey(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::PKEY, value);
    }

    /// Sets the reserved field.
    pub fn set_reserved(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::RESERVED, value);
    }

    /// Sets the queue key.
    pub fn set_qkey(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::QKEY, value);
    }

    /// Sets the immediate data field.
    pub fn set_imm(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::IMM, value);
    }
}

/// The validated contents of a UD encapsulation header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Partition key; the receiver drops datagrams of a foreign partition.
    pub pkey: u16,
    /// Queue key; the receiver drops datagrams whose key differs from its QP's.
    pub qkey: u32,
    /// Immediate data of a send-with-immediate.
    pub imm: Option<u32>,
}

impl Repr {
    /// Parses a checked packet.
    ///
    /// # Errors
    /// [`Error`] on a wrong magic number or version, unknown flag bits, or a
    /// non-zero reserved field.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        if packet.magic() != MAGIC
            || packet.version() != VERSION
            || packet.flags() & !FLAG_IMM != 0
            || packet.reserved() != 0
        {
            return Err(Error);
        }
        let imm = (packet.flags() & FLAG_IMM != 0).then(|| packet.imm());
        Ok(Self {
            pkey: packet.pkey(),
            qkey: packet.qkey(),
            imm,
        })
    }

    /// The number of bytes [`Repr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `packet`.
    ///
    /// # Panics
    /// If `packet`'s buffer is shorter than [`HEADER_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_flags(if self.imm.is_some() { FLAG_IMM } else { 0 });
        packet.set_pkey(self.pkey);
        packet.set_reserved(0);
        packet.set_qkey(self.qkey);
        packet.set_imm(self.imm.unwrap_or(0));
    }

    /// Emits the header into a fresh array, for callers that gather it with a
    /// payload held elsewhere.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        self.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    static WITH_IMM: [u8; 20] = [
        0x55, 0x44, 0x01, 0x01, 0xff, 0xff, 0x00, 0x00, 0x01, 0x33, 0x01, 0x33, 0xde, 0xad, 0xbe,
        0xef, b'd', b'a', b't', b'a',
    ];

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&WITH_IMM[..]).unwrap();
        assert_eq!(packet.magic(), MAGIC);
        assert_eq!(packet.version(), VERSION);
        assert_eq!(packet.pkey(), 0xffff);
        assert_eq!(packet.qkey(), 0x0133_0133);
        assert_eq!(packet.imm(), 0xdead_beef);
        assert_eq!(packet.payload(), b"data");
        let repr = Repr::parse(&packet).unwrap();
        assert_eq!(
            repr,
            Repr {
                pkey: 0xffff,
                qkey: 0x0133_0133,
                imm: Some(0xdead_beef)
            }
        );
    }

    #[test]
    fn construct() {
        let repr = Repr {
            pkey: 0xffff,
            qkey: 0x0133_0133,
            imm: Some(0xdead_beef),
        };
        assert_eq!(repr.to_bytes()[..], WITH_IMM[..HEADER_LEN]);
        let plain = Repr { imm: None, ..repr }.to_bytes();
        assert_eq!(plain[3], 0);
        assert_eq!(plain[12..], [0, 0, 0, 0]);
    }

    #[test]
    fn truncated_is_an_error() {
        for len in 0..HEADER_LEN {
            assert_eq!(Packet::new_checked(&WITH_IMM[..len]).unwrap_err(), Error);
        }
    }

    #[test]
    fn bad_fields_are_errors() {
        for (index, value) in [(0, 0x00), (2, 2), (3, 0x80), (6, 1)] {
            let mut bytes = WITH_IMM;
            bytes[index] = value;
            let packet = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(
                Repr::parse(&packet),
                Err(Error),
                "byte {index} = {value:#x}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn unchecked_short_buffer_panics() {
        let _ = Packet::new_unchecked(&WITH_IMM[..HEADER_LEN - 1]).imm();
    }

    proptest! {
        #[test]
        fn emit_then_parse(pkey: u16, qkey: u32, imm: Option<u32>, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let repr = Repr { pkey, qkey, imm };
            let mut bytes = vec![0u8; repr.buffer_len() + payload.len()];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            bytes[HEADER_LEN..].copy_from_slice(&payload);
            let packet = Packet::new_checked(&bytes[..]).unwrap();
            prop_assert_eq!(Repr::parse(&packet).unwrap(), repr);
            prop_assert_eq!(packet.payload(), &payload[..]);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(packet) = Packet::new_checked(&bytes[..]) {
                let _ = Repr::parse(&packet);
                let _ = (packet.magic(), packet.pkey(), packet.qkey(), packet.imm(), packet.payload());
            }
        }
    }
}
