//! The BTL header, which starts every datagram the BTL sends.
//!
//! ```text
//!  0        1        2                4                                  8
//!  +--------+--------+----------------+----------------------------------+
//!  |version |  tag   |     flags      |             job key              |
//!  +--------+--------+----------------+----------------------------------+
//! ```
//!
//! The original component sent a 1-byte header holding only the tag, which
//! left every payload misaligned by one byte. This header is 8 bytes, so the
//! payload that follows it (at offset 40 + 8 of a receive buffer) is 8-byte
//! aligned. The job key lets a receiver drop datagrams from another job, or
//! from a stale run that reused its ports. It travels XORed with the
//! receiving module's random mask ([`crate::modex::Admission`]), so the
//! field a receiver accepts cannot be computed from the job's name. `flags` announces optional headers
//! that follow: [`FLAG_RELIABLE`] says the reliability extension
//! ([`crate::rel`]) comes next. Unknown flag bits are an error.

use crate::field::{Field, read_u16, read_u32, write_u16, write_u32};
use crate::{Error, Result};

/// Length of the BTL header in bytes.
pub const HEADER_LEN: usize = 8;
/// The only version this crate understands.
pub const VERSION: u8 = 1;
/// Flag: the reliability extension follows this header.
pub const FLAG_RELIABLE: u16 = 0x1;
/// Flag bits this version defines.
const KNOWN_FLAGS: u16 = FLAG_RELIABLE;

mod field {
    use super::Field;
    pub(super) const VERSION: usize = 0;
    pub(super) const TAG: usize = 1;
    pub(super) const FLAGS: Field = 2..4;
    pub(super) const JOB_KEY: Field = 4..8;
}

/// A view over a BTL header and the payload after it.
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

    /// Wraps a buffer after checking it holds a whole header.
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

    /// The header version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The active-message tag.
    pub fn tag(&self) -> u8 {
        self.buffer.as_ref()[field::TAG]
    }

    /// The flag bits.
    pub fn flags(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::FLAGS)
    }

    /// The job key.
    pub fn job_key(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::JOB_KEY)
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the version.
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Sets the tag.
    pub fn set_tag(&mut self, value: u8) {
        self.buffer.as_mut()[field::TAG] = value;
    }

    /// Sets the flag bits.
    pub fn set_flags(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::FLAGS, value);
    }

    /// Sets the job key.
    pub fn set_job_key(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::JOB_KEY, value);
    }
}

/// The validated contents of a BTL header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Active-message tag: selects the receive callback.
    pub tag: u8,
    /// Key of the job that sent the datagram.
    pub job_key: u32,
    /// The reliability extension follows.
    pub reliable: bool,
}

impl Repr {
    /// Parses a checked packet.
    ///
    /// # Errors
    /// [`Error`] on an unknown version or flag bits.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Self> {
        packet.check_len()?;
        if packet.version() != VERSION || packet.flags() & !KNOWN_FLAGS != 0 {
            return Err(Error);
        }
        Ok(Self {
            tag: packet.tag(),
            job_key: packet.job_key(),
            reliable: packet.flags() & FLAG_RELIABLE != 0,
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
        packet.set_version(VERSION);
        packet.set_tag(self.tag);
        packet.set_flags(if self.reliable { FLAG_RELIABLE } else { 0 });
        packet.set_job_key(self.job_key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    static BYTES: [u8; 10] = [0x01, 0x41, 0x00, 0x00, 0xca, 0xfe, 0xf0, 0x0d, 0xaa, 0xbb];

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.tag(), 0x41);
        assert_eq!(packet.payload(), &[0xaa, 0xbb]);
        assert_eq!(
            Repr::parse(&packet).unwrap(),
            Repr {
                tag: 0x41,
                job_key: 0xcafe_f00d,
                reliable: false,
            }
        );
    }

    #[test]
    fn construct() {
        let mut bytes = [0xffu8; HEADER_LEN];
        Repr {
            tag: 0x41,
            job_key: 0xcafe_f00d,
            reliable: false,
        }
        .emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES[..HEADER_LEN]);
    }

    #[test]
    fn rejects_truncation_versions_and_unknown_flags() {
        for len in 0..HEADER_LEN {
            assert!(Packet::new_checked(&BYTES[..len]).is_err());
        }
        let mut bad = BYTES;
        bad[0] = 2;
        assert!(Repr::parse(&Packet::new_checked(&bad[..]).unwrap()).is_err());
        let mut bad = BYTES;
        bad[3] = 2;
        assert!(Repr::parse(&Packet::new_checked(&bad[..]).unwrap()).is_err());
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn unchecked_short_buffer_panics() {
        let _ = Packet::new_unchecked(&BYTES[..HEADER_LEN - 1]).job_key();
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn emit_into_short_buffer_panics() {
        let mut bytes = [0u8; HEADER_LEN - 1];
        Repr {
            tag: 1,
            job_key: 2,
            reliable: true,
        }
        .emit(&mut Packet::new_unchecked(&mut bytes[..]));
    }

    proptest! {
        #[test]
        fn emit_then_parse(tag: u8, job_key: u32, reliable: bool) {
            let repr = Repr { tag, job_key, reliable };
            let mut bytes = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            if let Ok(packet) = Packet::new_checked(&bytes[..]) {
                let _ = Repr::parse(&packet);
                let _ = (packet.tag(), packet.flags(), packet.job_key(), packet.payload());
            }
        }
    }
}
