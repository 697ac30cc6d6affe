//! Wire formats of udbtl.
//!
//! Every header in this crate follows one contract, borrowed from smoltcp:
//!
//! * `Packet<T: AsRef<[u8]>>` is a *view* over a byte buffer. `Packet::new_checked`
//!   (one per header) verifies the buffer is long enough; after it succeeds no
//!   accessor can panic, whatever the bytes contain. Bytes that came from the
//!   network must always go through `new_checked`. `Packet::new_unchecked`
//!   takes the length on the caller's word: accessors index the buffer
//!   directly and panic on a short one rather than make up a value.
//! * `Repr` is the validated, owned value of a header. `Repr::parse` reads a
//!   checked packet and rejects semantically invalid contents; `Repr::emit`
//!   writes exactly `Repr::buffer_len()` bytes.
//! * [`datagram`] covers the reliable datagram as a whole (BTL header,
//!   reliability extension, payload): its checksum is computed, written and
//!   verified there, so no caller adds header offsets itself.
//! * All multi-byte fields are big-endian, so the formats do not depend on the
//!   byte order of either host.
//!
//! Errors are the unit struct [`Error`]: a header is either well formed or it is
//! dropped and counted by the layer that received it, which knows the context.
//!
//! ```
//! use udbtl_wire::ud;
//!
//! let repr = ud::Repr { pkey: 0xffff, qkey: 0x0133_0133, imm: Some(7) };
//! let mut bytes = [0u8; ud::HEADER_LEN];
//! repr.emit(&mut ud::Packet::new_unchecked(&mut bytes[..]));
//! let parsed = ud::Repr::parse(&ud::Packet::new_checked(&bytes[..])?)?;
//! assert_eq!(parsed, repr);
//! # Ok::<(), udbtl_wire::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod btl;
pub mod coalesced;
pub mod datagram;
mod error;
pub(crate) mod field;
pub mod hash;
pub mod modex;
pub mod read;
pub mod rel;
pub mod seal;
pub mod segment;
pub mod seq;
pub mod ud;

pub use error::{Error, Result};
pub use seq::SeqNum;
