//! Reading the pieces of a datagram straight into place.
//!
//! A receive is offered as a scatter list over the front posted buffer:
//! the first packet (segment header and all) ends where a datagram starts
//! in the buffer, each next packet's segment header goes to a small array
//! and its body right after the previous body. The pieces of one datagram
//! then land as that datagram, in place. Anything else a receive may bring
//! (a datagram of one packet, a piece on its own, a train of small
//! datagrams) is recognised afterwards and handled by the caller.
//!
//! Only pieces of more than [`MIN_WIRE`] bytes are read this way: the
//! copy it saves is one from hot scratch space, and the kernel's copy into
//! a scatter list of many short entries costs more than that where pieces
//! are small (below).

use std::io::{self, IoSliceMut};
use std::os::fd::BorrowedFd;

use udbtl_wire::segment;

use super::super::sys::{self, RecvMeta, SKIP};
use super::{MAX_PIECES, PieceHeader};
use crate::RecvWr;

/// The shortest piece (UDP payload) read in place. Open MPI bandwidth
/// across a veth pair, 4–5 alternating runs each (2026-12-06,
/// `results/2026-12-06-segment-9000/`): with 8 972-byte pieces (MTU 9000,
/// 13 scatter entries) reading in place made 128 KiB–4 MiB 1.02–1.10
/// times as fast; with 1 472-byte ones (MTU 1500, 31 entries) 0.86–0.94,
/// the kernel's copy growing from 13 to 24 % of the receiving rank while
/// the user-space copies fell only from 40 to 32 %.
pub(super) const MIN_WIRE: usize = 4096;

/// The segment headers of the pieces after the first, which do not land
/// in the posted buffer.
pub(in crate::udp) type LaterHeaders = [PieceHeader; MAX_PIECES - 1];

/// Scatter entries of a receive in place: the first packet, a header and a
/// body for each later piece, and the spill space.
const ENTRIES: usize = 2 * MAX_PIECES;

/// Where one receive in place puts its bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct InPlace {
    /// Where the first packet lands in the buffer's memory region: the
    /// segment header's length before where a datagram starts.
    base: usize,
    /// Where the posted buffer ends in the region.
    end: usize,
    /// The UDP payload of each piece.
    wire: usize,
}

/// What a receive in place brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placed {
    /// All the pieces of one datagram, which is in place: its length.
    Datagram(usize),
    /// A datagram of one packet, a segment header's length early: its
    /// length.
    Single(usize),
    /// Anything else: [`InPlace::gather`] gets the bytes back in order.
    Other,
}

impl InPlace {
    /// The layout for posted buffer `wr` and pieces of `wire` bytes, if the
    /// buffer holds at least one whole packet.
    pub(super) fn new(wr: RecvWr, wire: usize) -> Option<Self> {
        let start = wr.sge.offset + SKIP;
        let base = start.checked_sub(segment::HEADER_LEN)?;
        let end = wr.sge.offset.checked_add(wr.sge.len)?;
        (wire > segment::HEADER_LEN && base + wire <= end).then_some(Self { base, end, wire })
    }

    /// Where a datagram starts in the buffer.
    pub(super) const fn start(&self) -> usize {
        self.base + segment::HEADER_LEN
    }

    /// The stretches of the receive in order, as (where, length): in the
    /// `region` for [`Part::Region`], else a later header or the spill.
    fn parts(&self) -> impl Iterator<Item = Part> + '_ {
        let chunk = self.wire - segment::HEADER_LEN;
        let first = core::iter::once(Part::Region(self.base, self.wire));
        let later = (1..MAX_PIECES).map_while(move |index| {
            let at = self.start() + index * chunk;
            (at < self.end).then(|| {
                [
                    Part::Header(index - 1),
                    Part::Region(at, chunk.min(self.end - at)),
                ]
            })
        });
        first
            .chain(later.flatten())
            .chain(core::iter::once(Part::Spill))
    }

    /// Receives once, laid out in the buffer `region`, `headers` and
    /// `spill`; says whether anything came.
    pub(super) fn receive(
        &self,
        fd: BorrowedFd<'_>,
        region: &mut [u8],
        headers: &mut LaterHeaders,
        spill: &mut [u8],
        meta: &mut RecvMeta,
    ) -> io::Result<bool> {
        let mut iov: [IoSliceMut<'_>; ENTRIES] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
        let Some(buffer) = region.get_mut(self.base..self.end) else {
            return Ok(false);
        };
        let mut rest = buffer;
        let mut headers = headers.iter_mut();
        let mut spill = Some(spill);
        let mut used = 0;
        for part in self.parts() {
            let slice: &mut [u8] = match part {
                Part::Region(_, len) => {
                    let (now, later) = core::mem::take(&mut rest).split_at_mut(len);
                    rest = later;
                    now
                }
                Part::Header(_) => match headers.next() {
                    Some(header) => header,
                    None => break,
                },
                Part::Spill => match spill.take() {
                    Some(spill) => spill,
                    None => break,
                },
            };
            iov[used] = IoSliceMut::new(slice);
            used += 1;
        }
        sys::recv_into(fd, &mut iov[..used], meta)
    }

    /// What a receive of `len` bytes in packets of `stride` brought, seen
    /// in `region` and `headers`.
    pub(super) fn placed(
        &self,
        region: &[u8],
        headers: &LaterHeaders,
        len: usize,
        stride: usize,
    ) -> Placed {
        let placed: usize = self
            .parts()
            .take_while(|part| !matches!(part, Part::Spill))
            .map(Part::len)
            .sum();
        if len > placed {
            return Placed::Other;
        }
        let first = &region[self.base..self.base + len.min(self.wire)];
        if len == stride && len <= self.wire {
            return if segment::is_segment(first) {
                Placed::Other
            } else {
                Placed::Single(len)
            };
        }
        let count = len.div_ceil(self.wire);
        let last = len - (count - 1) * self.wire;
        let whole = stride == self.wire
            && last > segment::HEADER_LEN
            && segment::Repr::parse(first).is_ok_and(|r| {
                r.index == 0
                    && usize::from(r.count) == count
                    && headers[..count - 1].iter().zip(1..).all(|(header, index)| {
                        segment::Repr::parse(header).is_ok_and(|h| {
                            h.unit == r.unit && h.index == index && h.count == r.count && !h.padded
                        })
                    })
            });
        if whole {
            Placed::Datagram(len - count * segment::HEADER_LEN)
        } else {
            Placed::Other
        }
    }

    /// Copies the `out.len()` bytes a receive brought back into one run,
    /// in the order they came.
    pub(super) fn gather(
        &self,
        region: &[u8],
        headers: &LaterHeaders,
        spill: &[u8],
        out: &mut [u8],
    ) {
        let mut at = 0;
        for part in self.parts() {
            if at == out.len() {
                break;
            }
            let from: &[u8] = match part {
                Part::Region(start, len) => &region[start..start + len],
                Part::Header(index) => &headers[index],
                Part::Spill => spill,
            };
            let n = from.len().min(out.len() - at);
            out[at..at + n].copy_from_slice(&from[..n]);
            at += n;
        }
    }
}

/// One stretch of a receive in place.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// `len` bytes of the posted buffer's region, from an offset.
    Region(usize, usize),
    /// A later piece's segment header.
    Header(usize),
    /// The spill space.
    Spill,
}

impl Part {
    fn len(self) -> usize {
        match self {
            Self::Region(_, len) => len,
            Self::Header(_) => segment::HEADER_LEN,
            Self::Spill => usize::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sge;

    const WIRE: usize = 1472;

    fn layout(buffer: usize) -> InPlace {
        let sge = Sge {
            lkey: crate::LKey(1),
            offset: 64,
            len: buffer,
        };
        InPlace::new(RecvWr { wr_id: 0, sge }, WIRE).expect("room for a packet")
    }

    /// Lays `stream` out as the kernel would over the layout's scatter list.
    fn scatter(
        layout: &InPlace,
        region: &mut [u8],
        headers: &mut LaterHeaders,
        spill: &mut [u8],
        stream: &[u8],
    ) {
        let mut rest = stream;
        for part in layout.parts() {
            let to: &mut [u8] = match part {
                Part::Region(at, len) => &mut region[at..at + len],
                Part::Header(index) => &mut headers[index],
                Part::Spill => &mut *spill,
            };
            let n = to.len().min(rest.len());
            to[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
    }

    /// A datagram of `len` bytes cut into pieces, as they go on the wire.
    fn pieces(datagram: &[u8], unit: u32) -> Vec<u8> {
        let chunks: Vec<&[u8]> = datagram.chunks(WIRE - segment::HEADER_LEN).collect();
        let count = chunks.len() as u8;
        let mut out = Vec::new();
        for (index, chunk) in (0..).zip(chunks) {
            let mut header = PieceHeader::default();
            segment::Repr {
                count,
                index,
                unit,
                padded: false,
            }
            .emit(&mut header);
            out.extend_from_slice(&header);
            out.extend_from_slice(chunk);
        }
        out
    }

    fn bytes(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + seed) as u8).collect()
    }

    struct Read {
        region: Vec<u8>,
        headers: LaterHeaders,
        spill: Vec<u8>,
    }

    fn read(layout: &InPlace, stream: &[u8]) -> Read {
        let mut r = Read {
            region: vec![0; layout.end + 64],
            headers: LaterHeaders::default(),
            spill: vec![0; 1 << 16],
        };
        scatter(layout, &mut r.region, &mut r.headers, &mut r.spill, stream);
        r
    }

    #[test]
    fn the_pieces_of_one_datagram_land_as_that_datagram() {
        let at = layout(SKIP + 23_000);
        let datagram = bytes(20_000, 1);
        let stream = pieces(&datagram, 7);
        let r = read(&at, &stream);
        assert_eq!(
            at.placed(&r.region, &r.headers, stream.len(), WIRE),
            Placed::Datagram(datagram.len())
        );
        assert_eq!(
            &r.region[at.start()..at.start() + datagram.len()],
            &datagram[..]
        );
    }

    #[test]
    fn one_packet_is_a_move_away_and_the_rest_goes_back_in_order() {
        let at = layout(SKIP + 23_000);
        let small = bytes(100, 2);
        let r = read(&at, &small);
        assert_eq!(
            at.placed(&r.region, &r.headers, 100, 100),
            Placed::Single(100)
        );
        assert_eq!(&r.region[at.start() - 8..at.start() + 92], &small[..]);
        // Anything else is recognised and given back as it came: a train of
        // small datagrams, two datagrams in pieces, a lone piece, and a
        // train too long for the buffer.
        let train: Vec<u8> = (0..40).flat_map(|i| bytes(500, i)).collect();
        let two = [pieces(&bytes(3000, 3), 1), pieces(&bytes(4000, 4), 2)].concat();
        let lone = pieces(&bytes(5000, 5), 9)[..WIRE].to_vec();
        let cases = [(&train, 500), (&two, WIRE), (&lone, WIRE)];
        for (stream, stride) in cases {
            let r = read(&at, stream);
            assert_eq!(
                at.placed(&r.region, &r.headers, stream.len(), stride),
                Placed::Other
            );
            let mut out = vec![0; stream.len()];
            at.gather(&r.region, &r.headers, &r.spill, &mut out);
            assert_eq!(&out, stream);
        }
        let short = layout(SKIP + 3000);
        let long = pieces(&bytes(6000, 6), 3);
        let r = read(&short, &long);
        assert_eq!(
            short.placed(&r.region, &r.headers, long.len(), WIRE),
            Placed::Other
        );
        let mut out = vec![0; long.len()];
        short.gather(&r.region, &r.headers, &r.spill, &mut out);
        assert_eq!(out, long);
    }

    #[test]
    fn a_buffer_shorter_than_a_packet_is_not_read_in_place() {
        let sge = Sge {
            lkey: crate::LKey(1),
            offset: 0,
            len: SKIP + 1000,
        };
        assert!(InPlace::new(RecvWr { wr_id: 0, sge }, WIRE).is_none());
    }
}
