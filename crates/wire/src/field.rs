//! Byte ranges of header fields and big-endian accessors over them.
//!
//! The accessors index directly: a buffer too short for the field panics.
//! Views reach them only after a `check_len` (through `new_checked`), or on a
//! buffer the caller promised is long enough (through `new_unchecked`), so a
//! panic here is a bug in the caller, never a reaction to received bytes.

use core::ops::Range;

/// A field: a half-open byte range inside a header.
pub(crate) type Field = Range<usize>;

/// Reads a big-endian `u16` from the 2-byte `field`.
///
/// # Panics
/// If `bytes` is shorter than `field.end`.
#[inline]
pub(crate) fn read_u16(bytes: &[u8], field: Field) -> u16 {
    debug_assert_eq!(field.len(), 2);
    let b = &bytes[field];
    u16::from_be_bytes([b[0], b[1]])
}

/// Reads a big-endian `u32` from the 4-byte `field`.
///
/// # Panics
/// If `bytes` is shorter than `field.end`.
#[inline]
pub(crate) fn read_u32(bytes: &[u8], field: Field) -> u32 {
    debug_assert_eq!(field.len(), 4);
    let b = &bytes[field];
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Writes `value` big-endian into the 2-byte `field`.
///
/// # Panics
/// If `bytes` is shorter than `field.end`, or `field` is not 2 bytes wide.
#[inline]
pub(crate) fn write_u16(bytes: &mut [u8], field: Field, value: u16) {
    bytes[field].copy_from_slice(&value.to_be_bytes());
}

/// Writes `value` big-endian into the 4-byte `field`.
///
/// # Panics
/// If `bytes` is shorter than `field.end`, or `field` is not 4 bytes wide.
#[inline]
pub(crate) fn write_u32(bytes: &mut [u8], field: Field, value: u32) {
    bytes[field].copy_from_slice(&value.to_be_bytes());
}
