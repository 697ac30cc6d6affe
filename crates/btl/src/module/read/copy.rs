//! How a reply's bytes go into the read's target: through the cache, or
//! around it (the `read_copy` parameter).
//!
//! A reader copies each reply datagram into the target as it is delivered.
//! Where the target is not in the cache, every line written is first read
//! from memory; streaming (non-temporal) stores skip that read and copy
//! into such a target about twice as fast, but into a target that is in
//! the cache they run at half the speed of ordinary stores, and either way
//! they leave the bytes in memory, where the application then reads them
//! from (figures in [`udbtl_fabric::memory`]). Only the application knows
//! which case its buffers are in, so ordinary stores are the default and
//! streaming is a choice.
//!
//! Timing a datagram's copy does not tell the cases apart: with ordinary
//! stores the lines written are written back to memory later, outside the
//! copy, so the copy alone looked as fast as a streaming one (3.37 against
//! 3.26 µs for 32 KiB) where the whole read ran a fifth slower (1 MiB on
//! loopback into buffers not in the cache, `results/2026-12-06-read-copy/`).

use udbtl_fabric::memory::copy_streaming;

/// How reads copy into their targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum TargetCopy {
    /// Ordinary stores: the bytes end up in the cache.
    #[default]
    Cached,
    /// Streaming stores: the bytes go to memory without being read first.
    Streaming,
}

impl TargetCopy {
    /// The `read_copy` parameter's value; anything but `streaming` is
    /// `cached` (the parameter's choices are checked where it is parsed).
    pub(crate) fn from_param(value: &str) -> Self {
        match value {
            "streaming" => Self::Streaming,
            _ => Self::Cached,
        }
    }

    /// Copies `src` into `dest`, which are equally long.
    pub(super) fn copy(self, dest: &mut [u8], src: &[u8]) {
        match self {
            Self::Cached => dest.copy_from_slice(src),
            Self::Streaming => copy_streaming(dest, src),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_names_each_way() {
        assert_eq!(TargetCopy::from_param("cached"), TargetCopy::Cached);
        assert_eq!(TargetCopy::from_param("streaming"), TargetCopy::Streaming);
    }

    #[test]
    fn either_way_copies_the_bytes_exactly() {
        for way in [TargetCopy::Cached, TargetCopy::Streaming] {
            for len in [0, 1, 63, 4095, 8192, 65_000] {
                let src: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
                let mut dest = vec![0; len];
                way.copy(&mut dest, &src);
                assert_eq!(dest, src, "{way:?}, {len} bytes");
            }
        }
    }
}
