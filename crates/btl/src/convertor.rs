//! The convertor: a cursor over the bytes of a send, whatever their layout.
//!
//! `prepare_src` packs user data after the caller's reserved header; the
//! convertor is where that data comes from. It walks a logical byte stream
//! (the bytes in order, gaps skipped) and remembers how far it got, so a
//! large message is cut into fragments by repeated calls.
//!
//! Only the [`shared`](Convertor::shared) layout can be sent without a copy.
//! The BTL may have to retransmit a fragment long after `prepare_src`
//! returned, so it must hold the bytes itself; borrowed memory cannot be held
//! past the call, and owned, reference-counted memory can.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// A strided layout was described inconsistently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertorError {
    /// Blocks would overlap.
    #[error("block length {block_len} exceeds the stride {stride}")]
    BlockLongerThanStride {
        /// Bytes per block.
        block_len: usize,
        /// Distance between block starts.
        stride: usize,
    },
    /// The last block ends past the end of the base slice.
    #[error(
        "{count} blocks of {block_len} bytes every {stride} bytes need {needed} bytes, but the base has {len}"
    )]
    BaseTooShort {
        /// Bytes per block.
        block_len: usize,
        /// Distance between block starts.
        stride: usize,
        /// Number of blocks.
        count: usize,
        /// Bytes the layout spans.
        needed: usize,
        /// Bytes the base has.
        len: usize,
    },
    /// The layout spans more bytes than an address space holds.
    #[error("{count} blocks every {stride} bytes overflow the address space")]
    TooLarge {
        /// Distance between block starts.
        stride: usize,
        /// Number of blocks.
        count: usize,
    },
}

/// A cursor over a send's data: its layout, and how much of it has been
/// taken.
#[derive(Clone)]
pub struct Convertor<'a> {
    layout: Layout<'a>,
    total: usize,
    position: usize,
}

#[derive(Clone)]
enum Layout<'a> {
    Contiguous(&'a [u8]),
    /// `part` and `offset` locate `position`; they always point at a
    /// non-empty part unless the stream is exhausted, so packing never spins
    /// on empty parts.
    Iovec {
        parts: &'a [&'a [u8]],
        part: usize,
        offset: usize,
    },
    Strided {
        base: &'a [u8],
        block_len: usize,
        stride: usize,
        count: usize,
    },
    Shared(Arc<[u8]>),
}

impl<'a> Convertor<'a> {
    /// One contiguous slice.
    pub fn contiguous(data: &'a [u8]) -> Self {
        Self {
            total: data.len(),
            layout: Layout::Contiguous(data),
            position: 0,
        }
    }

    /// The concatenation of `parts`; empty parts are allowed.
    pub fn iovec(parts: &'a [&'a [u8]]) -> Self {
        let total = parts.iter().map(|p| p.len()).sum();
        let mut convertor = Self {
            layout: Layout::Iovec {
                parts,
                part: 0,
                offset: 0,
            },
            total,
            position: 0,
        };
        convertor.advance(0);
        convertor
    }

    /// `count` blocks of `block_len` bytes, the first at the start of `base`,
    /// each `stride` bytes after the one before (a vector datatype).
    ///
    /// # Errors
    /// `block_len > stride`, or the last block ends past `base`.
    pub fn strided(
        base: &'a [u8],
        block_len: usize,
        stride: usize,
        count: usize,
    ) -> Result<Self, ConvertorError> {
        if block_len > stride {
            return Err(ConvertorError::BlockLongerThanStride { block_len, stride });
        }
        let needed = match count.checked_sub(1) {
            None => 0,
            Some(last) => last
                .checked_mul(stride)
                .and_then(|start| start.checked_add(block_len))
                .ok_or(ConvertorError::TooLarge { stride, count })?,
        };
        if needed > base.len() {
            return Err(ConvertorError::BaseTooShort {
                block_len,
                stride,
                count,
                needed,
                len: base.len(),
            });
        }
        // Cannot overflow: block_len * count <= needed when count > 0.
        let total = block_len * count;
        Ok(Self {
            layout: Layout::Strided {
                base,
                block_len,
                stride,
                count,
            },
            total,
            position: 0,
        })
    }

    /// Total bytes of the logical stream.
    pub const fn total_len(&self) -> usize {
        self.total
    }

    /// Bytes already packed or taken.
    pub const fn position(&self) -> usize {
        self.position
    }

    /// Bytes still to pack or take.
    pub const fn remaining(&self) -> usize {
        self.total - self.position
    }

    /// Copies the next `min(dst.len(), remaining())` bytes into the start of
    /// `dst`, advances past them, and returns how many were copied.
    pub fn pack(&mut self, dst: &mut [u8]) -> usize {
        let want = dst.len().min(self.remaining());
        let mut done = 0;
        while done < want {
            let chunk = self.chunk();
            let take = chunk.len().min(want - done);
            if take == 0 {
                // Unreachable while the cursor invariants hold; stop rather
                // than spin if they ever do not.
                break;
            }
            dst[done..done + take].copy_from_slice(&chunk[..take]);
            self.advance(take);
            done += take;
        }
        done
    }

    /// Takes the next `min(max, remaining())` bytes without copying: the
    /// shared buffer and the range of it they occupy. `None` for a borrowed
    /// layout (which must be packed), or when nothing is left or `max` is 0.
    pub fn zero_copy(&mut self, max: usize) -> Option<(Arc<[u8]>, Range<usize>)> {
        let Layout::Shared(data) = &self.layout else {
            return None;
        };
        let take = max.min(self.remaining());
        if take == 0 {
            return None;
        }
        let data = Arc::clone(data);
        let range = self.position..self.position + take;
        self.advance(take);
        Some((data, range))
    }

    /// Moves the cursor back by `by` bytes (to the start at most), so bytes
    /// packed or taken for a fragment that could not be sent are taken
    /// again by the next call.
    pub fn rewind(&mut self, by: usize) {
        let target = self.position.saturating_sub(by);
        self.position = 0;
        if let Layout::Iovec { part, offset, .. } = &mut self.layout {
            (*part, *offset) = (0, 0);
        }
        self.advance(target);
    }

    /// `true` if the stream is one run of memory (the seed's
    /// `!need_buffers`): at most one non-empty part, or blocks with no gaps
    /// between them.
    pub fn is_contiguous(&self) -> bool {
        match &self.layout {
            Layout::Contiguous(_) | Layout::Shared(_) => true,
            Layout::Iovec { parts, .. } => parts.iter().filter(|p| !p.is_empty()).count() <= 1,
            Layout::Strided {
                block_len,
                stride,
                count,
                ..
            } => *count <= 1 || block_len == stride,
        }
    }

    /// The bytes from `position` to the end of the current run.
    fn chunk(&self) -> &[u8] {
        let position = self.position;
        let slice = match &self.layout {
            Layout::Contiguous(data) => data.get(position..),
            Layout::Shared(data) => data.get(position..),
            Layout::Iovec {
                parts,
                part,
                offset,
            } => parts.get(*part).and_then(|p| p.get(*offset..)),
            Layout::Strided {
                base,
                block_len,
                stride,
                ..
            } => {
                if *block_len == 0 {
                    None
                } else {
                    let start = position / block_len * stride;
                    base.get(start + position % block_len..start + block_len)
                }
            }
        };
        slice.unwrap_or_default()
    }

    fn advance(&mut self, by: usize) {
        self.position += by;
        if let Layout::Iovec {
            parts,
            part,
            offset,
        } = &mut self.layout
        {
            *offset += by;
            while let Some(current) = parts.get(*part) {
                if *offset < current.len() {
                    break;
                }
                *offset -= current.len();
                *part += 1;
            }
        }
    }
}

impl Convertor<'static> {
    /// Owned, shareable memory: the only layout that
    /// [`zero_copy`](Self::zero_copy) can take from, since the BTL can keep
    /// the buffer alive until the data is acknowledged.
    pub fn shared(data: Arc<[u8]>) -> Self {
        Self {
            total: data.len(),
            layout: Layout::Shared(data),
            position: 0,
        }
    }
}

impl fmt::Debug for Convertor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The data itself can be megabytes; only the shape is useful.
        let layout = match &self.layout {
            Layout::Contiguous(_) => "contiguous",
            Layout::Iovec { .. } => "iovec",
            Layout::Strided { .. } => "strided",
            Layout::Shared(_) => "shared",
        };
        f.debug_struct("Convertor")
            .field("layout", &layout)
            .field("total", &self.total)
            .field("position", &self.position)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Packs everything, in chunks whose sizes cycle through `chunks`.
    fn pack_all(mut conv: Convertor<'_>, chunks: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        for &size in chunks.iter().cycle() {
            if conv.remaining() == 0 {
                break;
            }
            let before = conv.position();
            let mut buf = vec![0xAA; size];
            let n = conv.pack(&mut buf);
            assert_eq!(n, size.min(conv.remaining() + n));
            assert_eq!(conv.position(), before + n);
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(conv.pack(&mut [0; 8]), 0);
        out
    }

    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(1usize..100, 1..6)
    }

    proptest! {
        #[test]
        fn contiguous_packs_the_slice(len in 0usize..600, chunks in chunk_sizes()) {
            let data = bytes(len);
            let conv = Convertor::contiguous(&data);
            prop_assert!(conv.is_contiguous());
            prop_assert_eq!(pack_all(conv, &chunks), data);
        }

        #[test]
        fn iovec_packs_the_concatenation(
            lens in prop::collection::vec(prop_oneof![Just(0usize), 0usize..80], 0..10),
            chunks in chunk_sizes(),
        ) {
            let owned: Vec<Vec<u8>> =
                lens.iter().enumerate().map(|(i, &n)| bytes(n + i).split_off(i)).collect();
            let parts: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            let conv = Convertor::iovec(&parts);
            prop_assert_eq!(conv.total_len(), lens.iter().sum::<usize>());
            prop_assert_eq!(conv.is_contiguous(), lens.iter().filter(|&&n| n > 0).count() <= 1);
            prop_assert_eq!(pack_all(conv, &chunks), owned.concat());
        }

        #[test]
        fn strided_packs_the_blocks(
            block_len in 0usize..20,
            gap in 0usize..20,
            count in 0usize..20,
            slack in 0usize..5,
            chunks in chunk_sizes(),
        ) {
            let stride = block_len + gap;
            let span = if count == 0 { 0 } else { (count - 1) * stride + block_len };
            let base = bytes(span + slack);
            let conv = Convertor::strided(&base, block_len, stride, count).unwrap();
            let expected: Vec<u8> = (0..count)
                .flat_map(|i| base[i * stride..i * stride + block_len].iter().copied())
                .collect();
            prop_assert_eq!(conv.total_len(), block_len * count);
            prop_assert_eq!(pack_all(conv, &chunks), expected);
        }

        #[test]
        fn zero_copy_ranges_tile_the_shared_buffer(len in 0usize..600, maxes in chunk_sizes()) {
            let data: Arc<[u8]> = bytes(len).into();
            let mut conv = Convertor::shared(Arc::clone(&data));
            let mut next = 0;
            for &max in maxes.iter().cycle() {
                let Some((buf, range)) = conv.zero_copy(max) else { break };
                prop_assert!(Arc::ptr_eq(&buf, &data));
                prop_assert_eq!(range.start, next);
                prop_assert!(!range.is_empty() && range.len() <= max);
                next = range.end;
            }
            prop_assert_eq!(next, len);
            prop_assert_eq!(conv.remaining(), 0);
        }
    }

    #[test]
    fn rewind_takes_the_same_bytes_again() {
        let a = bytes(5);
        let b = bytes(9);
        let parts: [&[u8]; 4] = [&a, &[], &b, &[]];
        let mut conv = Convertor::iovec(&parts);
        let mut first = [0; 8];
        assert_eq!(conv.pack(&mut first), 8);
        conv.rewind(4);
        assert_eq!(conv.position(), 4);
        let mut again = [0; 4];
        assert_eq!(conv.pack(&mut again), 4);
        assert_eq!(again, first[4..]);
        conv.rewind(100);
        assert_eq!(pack_all(conv, &[3]), [a, b].concat());

        let mut shared = Convertor::shared(bytes(10).into());
        let (_, range) = shared.zero_copy(6).unwrap();
        shared.rewind(range.len());
        assert_eq!(shared.zero_copy(6).unwrap().1, range);
    }

    #[test]
    fn zero_copy_and_pack_share_one_cursor() {
        let data: Arc<[u8]> = bytes(10).into();
        let mut conv = Convertor::shared(Arc::clone(&data));
        let mut head = [0; 4];
        assert_eq!(conv.pack(&mut head), 4);
        assert_eq!(head, data[..4]);
        let (_, range) = conv.zero_copy(100).unwrap();
        assert_eq!(range, 4..10);
        assert!(conv.zero_copy(100).is_none());
    }

    #[test]
    fn borrowed_layouts_are_never_zero_copy() {
        let data = bytes(10);
        assert!(Convertor::contiguous(&data).zero_copy(4).is_none());
        let mut shared = Convertor::shared(data.into());
        assert!(shared.zero_copy(0).is_none());
        assert_eq!(shared.position(), 0);
    }

    #[test]
    fn strided_layouts_are_checked() {
        let base = [0u8; 10];
        assert_eq!(
            Convertor::strided(&base, 5, 4, 2).unwrap_err(),
            ConvertorError::BlockLongerThanStride {
                block_len: 5,
                stride: 4
            }
        );
        assert_eq!(
            Convertor::strided(&base, 3, 4, 3).unwrap_err(),
            ConvertorError::BaseTooShort {
                block_len: 3,
                stride: 4,
                count: 3,
                needed: 11,
                len: 10
            }
        );
        assert!(matches!(
            Convertor::strided(&base, 1, usize::MAX, 3),
            Err(ConvertorError::TooLarge { .. })
        ));
        assert!(Convertor::strided(&base, 2, 4, 3).is_ok_and(|c| !c.is_contiguous()));
        assert!(Convertor::strided(&base, 5, 5, 2).is_ok_and(|c| c.is_contiguous()));
        assert!(Convertor::strided(&base, 2, 4, 1).is_ok_and(|c| c.is_contiguous()));
    }

    #[test]
    fn debug_shows_the_shape_not_the_data() {
        let conv = Convertor::contiguous(&[1, 2, 3]);
        assert_eq!(
            format!("{conv:?}"),
            "Convertor { layout: \"contiguous\", total: 3, position: 0 }"
        );
    }
}
