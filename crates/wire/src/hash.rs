//! A stable hash for values that cross process boundaries.
//!
//! [`Fnv1a`] is the 64-bit FNV-1a hash. Its output is stable across
//! processes, hosts and Rust releases, unlike std's `DefaultHasher` (whose
//! algorithm may change between releases and is randomly keyed through
//! `RandomState`): use it for ids published to peers, which every process of a
//! job must compute alike.
//!
//! It deliberately does not implement [`core::hash::Hasher`]: `Hash` impls
//! feed integers in native byte order and lengths as `usize`, which differ
//! between hosts. Feed it explicit bytes (big-endian integers, for instance).
//!
//! FNV-1a is not a cryptographic hash and not resistant to chosen inputs.
//!
//! ```
//! use udbtl_wire::hash::{Fnv1a, fnv1a};
//!
//! let mut hasher = Fnv1a::new();
//! hasher.write(b"foo");
//! hasher.write(b"bar");
//! assert_eq!(hasher.finish(), fnv1a(b"foobar"));
//! assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
//! ```

/// The FNV-1a 64-bit offset basis: the hash of no bytes.
const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// The FNV 64-bit prime.
const PRIME: u64 = 0x0100_0000_01b3;

/// An incremental 64-bit FNV-1a hasher: writing `a` then `b` hashes the same
/// as writing their concatenation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fnv1a(u64);

impl Fnv1a {
    /// A hasher that has seen no bytes.
    #[must_use]
    pub const fn new() -> Self {
        Self(OFFSET_BASIS)
    }

    /// Feeds `bytes` to the hash.
    pub const fn write(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            self.0 = (self.0 ^ bytes[i] as u64).wrapping_mul(PRIME);
            i += 1;
        }
    }

    /// The hash of every byte written so far.
    #[must_use]
    pub const fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

/// The 64-bit FNV-1a hash of `bytes`.
#[must_use]
pub const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv1a::new();
    hasher.write(bytes);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(Fnv1a::default().finish(), fnv1a(b""));
    }

    #[test]
    fn usable_in_const_context() {
        const ID: u64 = fnv1a(b"a");
        assert_eq!(ID, 0xaf63_dc4c_8601_ec8c);
    }

    proptest! {
        #[test]
        fn incremental_equals_one_shot(bytes in proptest::collection::vec(any::<u8>(), 0..64), cut: prop::sample::Index) {
            let at = cut.index(bytes.len() + 1);
            let mut hasher = Fnv1a::default();
            hasher.write(&bytes[..at]);
            hasher.write(&bytes[at..]);
            prop_assert_eq!(hasher.finish(), fnv1a(&bytes));
        }
    }
}
