//! Byte ranges of header fields and big-endian accessors over them.
//!
//! Callers index only after a `check_len`, so slicing here cannot go out of
//! bounds; the `try_into` conversions are infallible for ranges of the exact
//! width and fall back to zero rather than panic.

use core::ops::Range;

/// A field: a half-open byte range inside a header.
pub(crate) type Field = Range<usize>;

#[inline]
pub(crate) fn read_u16(bytes: &[u8], field: Field) -> u16 {
    bytes
        .get(field)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_be_bytes)
}

#[inline]
pub(crate) fn read_u32(bytes: &[u8], field: Field) -> u32 {
    bytes
        .get(field)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}

#[inline]
pub(crate) fn write_u16(bytes: &mut [u8], field: Field, value: u16) {
    if let Some(b) = bytes.get_mut(field) {
        b.copy_from_slice(&value.to_be_bytes());
    }
}

#[inline]
pub(crate) fn write_u32(bytes: &mut [u8], field: Field, value: u32) {
    if let Some(b) = bytes.get_mut(field) {
        b.copy_from_slice(&value.to_be_bytes());
    }
}
