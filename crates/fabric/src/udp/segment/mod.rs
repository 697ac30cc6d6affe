//! Datagrams longer than the path's MTU ([`udbtl_wire::segment`]).
//!
//! A port that segments carries UD datagrams of up to [`MAX_PIECES`]
//! packets and one GSO send (23 408 bytes at MTU 1500; 7 packets, 62 748
//! bytes, at MTU 9000), where the path's MTU would otherwise hold each to
//! one packet: the layers above then pay their per-datagram costs
//! (headers, checksums, acknowledgements, completions) once per many
//! packets, and the kernel still sees MTU-sized packets, cut by GSO and
//! usually joined again by GRO.
//!
//! Sending: [`gather`] lays a datagram out as its pieces, each behind its
//! segment header, as a gather list over the caller's bytes (no copy),
//! which leaves in one GSO send, with the pieces of the next datagrams to
//! the same peer behind it where they fit ([`pieces_send_end`]). Receiving ([`receive`]): a datagram whose
//! pieces all came in one receive, what GRO makes of a GSO send, is read
//! in place ([`in_place`]) or put together in the front posted buffer;
//! pieces that came apart (no GRO, or a train GRO split) wait in a small
//! table of partial datagrams, one per sender ([`Partials`]), and a
//! datagram missing a piece is dropped whole, as a lost datagram, and
//! counted.

use std::io::IoSlice;
use std::net::SocketAddr;

use udbtl_wire::segment;

use super::{MAX_GSO_SEGMENTS, MAX_UDP_PAYLOAD_V4};

mod in_place;
mod partials;
mod receive;

pub(super) use in_place::LaterHeaders;
pub(super) use partials::Partials;

/// The longest packet payload a port cuts datagrams for: jumbo frames
/// included. A sender gathers the pieces from the caller's bytes
/// ([`gather`]); the receiver copies them together from scratch space, or
/// reads them in place where they are long ([`in_place`]). At MTU 1500
/// cutting saves far more than it costs (Open MPI 1 MiB bandwidth across a
/// veth pair: about 1 800 MB/s uncut, 2 800 to 3 000 cut, 2026-12-05). At
/// MTU 9000 (7 pieces, read in place) it measured 1.33 and 1.27 times as
/// fast at 16 and 32 KiB and 0.94 to 1.10 times from 128 KiB to 4 MiB
/// (Open MPI osu bandwidth, 4 alternating runs, 2026-12-06); cut but
/// copied together, 0.91 to 0.96 there.
pub(super) const WIRE_MAX: usize = 9000;

/// Most pieces a datagram is cut into. Losing one piece loses the
/// datagram, so a lossy path loses datagrams in proportion to their
/// pieces: with 1 % of packets dropped (the veth pair cutting GSO sends
/// in software, an nftables rule dropping single packets; Open MPI 1 MiB
/// bandwidth, 2026-12-05), 44 pieces (64 KiB) fell from 1 110-1 220 to
/// 100-130 MB/s, while 16 pieces went from 1 150 to 710 and one-packet
/// datagrams from 830-870 to 580. Without loss, 16 pieces measured as
/// fast as 44 (3 100-3 200 MB/s across the veth with GSO), 8 pieces 13 %
/// slower.
pub(super) const MAX_PIECES: usize = 16;

/// How many pieces of `wire` bytes (the path's UDP payload) one datagram
/// may be cut into: as many as one GSO send carries, up to [`MAX_PIECES`],
/// or `None` where the port does not segment: packets of more than
/// [`WIRE_MAX`] bytes, or too few to make two pieces of one send.
pub(super) fn pieces_per_send(wire: usize) -> Option<usize> {
    let pieces = (MAX_UDP_PAYLOAD_V4 / wire.max(1)).min(MAX_PIECES);
    (pieces >= 2 && wire > segment::HEADER_LEN && wire <= WIRE_MAX).then_some(pieces)
}

/// Where the GSO send that begins with cut datagram `start` ends
/// (exclusive): the run of cut datagrams (`cut[i]`) to one destination
/// whose pieces one send can carry, each before the last filling all its
/// pieces (a GSO send's packets are all `wire` bytes but the last), within
/// [`MAX_GSO_SEGMENTS`] packets and one IPv4 UDP payload.
///
/// Datagram `i` is `sizes[i]` bytes, UD header included. Two full
/// datagrams share a send at MTU 1500 (32 packets of 1 472 bytes), which
/// halves the sends, and the packets the kernel handles one by one on the
/// way, for the same bytes; a receiver tells the datagrams apart by their
/// segment headers as it does when GRO joins two sends.
pub(super) fn pieces_send_end(
    dests: &[SocketAddr],
    sizes: &[usize],
    cut: &[bool],
    wire: usize,
    start: usize,
) -> usize {
    let Some(chunk) = wire.checked_sub(segment::HEADER_LEN).filter(|&c| c > 0) else {
        return start + 1;
    };
    let count = sizes.len().min(dests.len()).min(cut.len());
    let packets = |size: usize| size.div_ceil(chunk);
    let on_wire = |size: usize| size + packets(size) * segment::HEADER_LEN;
    let mut end = start + 1;
    let (mut segments, mut bytes) = sizes
        .get(start)
        .map_or((0, 0), |&s| (packets(s), on_wire(s)));
    while end < count
        && cut[end]
        && dests[end] == dests[start]
        && sizes[end - 1] % chunk == 0
        && segments + packets(sizes[end]) <= MAX_GSO_SEGMENTS
        && bytes + on_wire(sizes[end]) <= MAX_UDP_PAYLOAD_V4
    {
        segments += packets(sizes[end]);
        bytes += on_wire(sizes[end]);
        end += 1;
    }
    end
}

/// A piece's segment header, as it goes on the wire.
pub(super) type PieceHeader = [u8; segment::HEADER_LEN];

/// Gather entries one datagram of `parts` gather parts may need when it is
/// cut into pieces: a header per piece, and per piece the parts it spans,
/// which add up to at most the pieces plus the parts.
pub(super) const fn gather_len(parts: usize) -> usize {
    2 * MAX_PIECES + parts
}

/// Lays out the datagram `parts` (UD header, then payload) as pieces for
/// `wire`-byte packets without copying it: writes each piece's segment
/// header, naming `unit`, into `headers`, and fills `iov` with the headers
/// and the slices of `parts` in the order the packets carry them. Returns
/// the entries of `iov` used, or `None` if the datagram fits one packet,
/// needs more pieces than `headers` hold or a header can count, or `iov`
/// is too short ([`gather_len`] is enough).
pub(super) fn gather<'a>(
    headers: &'a mut [PieceHeader],
    parts: &[&'a [u8]],
    wire: usize,
    unit: u32,
    iov: &mut [IoSlice<'a>],
) -> Option<usize> {
    let chunk = wire.checked_sub(segment::HEADER_LEN).filter(|&c| c > 0)?;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let count = u8::try_from(total.div_ceil(chunk)).ok()?;
    if !(2..=segment::MAX_COUNT).contains(&count) || usize::from(count) > headers.len() {
        return None;
    }
    let headers = &mut headers[..usize::from(count)];
    for (index, header) in (0..count).zip(headers.iter_mut()) {
        segment::Repr { count, index, unit }.emit(header);
    }
    let headers: &'a [PieceHeader] = headers;
    let mut used = 0;
    let mut push = |bytes: &'a [u8]| {
        *iov.get_mut(used)? = IoSlice::new(bytes);
        used += 1;
        Some(())
    };
    let mut bytes = parts.iter().copied().filter(|part| !part.is_empty());
    let mut pending: &'a [u8] = &[];
    for (index, header) in headers.iter().enumerate() {
        push(header)?;
        let mut need = chunk.min(total - index * chunk);
        while need > 0 {
            if pending.is_empty() {
                pending = bytes.next()?;
            }
            let (now, later) = pending.split_at(need.min(pending.len()));
            push(now)?;
            (need, pending) = (need - now.len(), later);
        }
    }
    Some(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_pieces(image: &[u8], wire: usize) -> Vec<(segment::Repr, Vec<u8>)> {
        image
            .chunks(wire)
            .map(|p| {
                (
                    segment::Repr::parse(p).expect("a segment"),
                    p[segment::HEADER_LEN..].to_vec(),
                )
            })
            .collect()
    }

    /// The packets `gather` lays out: its gather list, joined.
    fn gathered(parts: &[&[u8]], wire: usize, unit: u32) -> Option<Vec<u8>> {
        let mut headers = [PieceHeader::default(); MAX_PIECES];
        let mut iov = [IoSlice::new(&[]); gather_len(4)];
        let used = gather(&mut headers, parts, wire, unit, &mut iov)?;
        Some(
            iov[..used]
                .iter()
                .flat_map(|slice| slice.iter().copied())
                .collect(),
        )
    }

    #[test]
    fn a_datagram_is_cut_into_numbered_pieces_that_join_back() {
        let header = [1u8; 16];
        let payload: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        // A part boundary inside the third piece, and an empty part.
        let image = gathered(&[&header, &payload[..3000], &[], &payload[3000..]], 1472, 9)
            .expect("laid out");
        let pieces = parse_pieces(&image, 1472);
        assert_eq!(pieces.len(), 4);
        for (index, (repr, _)) in pieces.iter().enumerate() {
            assert_eq!(
                (repr.count, usize::from(repr.index), repr.unit),
                (4, index, 9)
            );
        }
        let joined: Vec<u8> = pieces.into_iter().flat_map(|(_, body)| body).collect();
        assert_eq!(joined[..16], header);
        assert_eq!(joined[16..], payload[..]);
    }

    #[test]
    fn a_datagram_that_fits_one_packet_is_not_cut() {
        assert_eq!(gathered(&[&[0u8; 1000]], 1472, 1), None);
    }

    #[test]
    fn a_datagram_needing_more_pieces_or_entries_than_given_is_refused() {
        let long = vec![0u8; (MAX_PIECES + 1) * 1464];
        assert_eq!(gathered(&[&long], 1472, 1), None);
        let mut headers = [PieceHeader::default(); MAX_PIECES];
        let mut iov = [IoSlice::new(&[]); 3];
        let parts: [&[u8]; 1] = [&[0u8; 3000]];
        assert_eq!(gather(&mut headers, &parts, 1472, 1, &mut iov), None);
    }

    #[test]
    fn the_gather_bound_holds_for_parts_cut_at_every_piece() {
        // Parts of 1 000 bytes against pieces of 1 464: most pieces span two.
        let bytes = vec![7u8; 9 * 1000];
        let parts: Vec<&[u8]> = bytes.chunks(1000).collect();
        let mut headers = [PieceHeader::default(); MAX_PIECES];
        let mut iov = [IoSlice::new(&[]); gather_len(9)];
        let used = gather(&mut headers, &parts, 1472, 1, &mut iov).expect("laid out");
        assert!(used <= gather_len(9));
        let image: Vec<u8> = iov[..used].iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(image.len(), 9000 + 7 * segment::HEADER_LEN);
    }

    fn to(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// The GSO sends [`pieces_send_end`] groups a batch of cut datagrams
    /// into, as `start..end`.
    fn sends(dests: &[SocketAddr], sizes: &[usize], wire: usize) -> Vec<(usize, usize)> {
        let cut = vec![true; sizes.len()];
        let mut out = Vec::new();
        let mut start = 0;
        while start < sizes.len() {
            let end = pieces_send_end(dests, sizes, &cut, wire, start);
            out.push((start, end));
            start = end;
        }
        out
    }

    /// A datagram that fills 16 pieces of 1 472 bytes.
    const FULL: usize = 16 * (1472 - segment::HEADER_LEN);

    #[test]
    fn two_full_datagrams_share_a_send_at_mtu_1500() {
        let dests = [to(1); 5];
        assert_eq!(sends(&dests, &[FULL; 5], 1472), [(0, 2), (2, 4), (4, 5)]);
    }

    #[test]
    fn a_datagram_that_does_not_fill_its_last_piece_ends_a_send() {
        let dests = [to(1); 4];
        assert_eq!(
            sends(&dests, &[FULL - 1, FULL, 5000, FULL], 1472),
            [(0, 1), (1, 3), (3, 4)]
        );
    }

    #[test]
    fn a_send_keeps_to_one_destination_and_to_cut_datagrams() {
        let dests = [to(1), to(2), to(2), to(2)];
        assert_eq!(sends(&dests, &[FULL; 4], 1472), [(0, 1), (1, 3), (3, 4)]);
        let cut = [true, false, true];
        assert_eq!(pieces_send_end(&[to(1); 3], &[FULL; 3], &cut, 1472, 0), 1);
    }

    #[test]
    fn long_pieces_go_one_datagram_per_send() {
        let full = 7 * (8972 - segment::HEADER_LEN);
        assert_eq!(
            sends(&[to(1); 3], &[full; 3], 8972),
            [(0, 1), (1, 2), (2, 3)]
        );
    }

    proptest::proptest! {
        /// Sends cover the batch in order, and each is one the kernel
        /// takes: one destination, every datagram but the last filling its
        /// pieces, within the packet and payload limits.
        #[test]
        fn sends_are_sendable_and_cover_the_batch(
            batch in proptest::collection::vec(
                (0u16..2, proptest::sample::select(vec![1465usize, 2928, 5000, 11_712, FULL - 1, FULL])),
                1..100,
            ),
            wire in proptest::sample::select(vec![600usize, 1472, 4096]),
        ) {
            let dests: Vec<SocketAddr> = batch.iter().map(|(port, _)| to(*port)).collect();
            let sizes: Vec<usize> = batch.iter().map(|(_, size)| *size).collect();
            let chunk = wire - segment::HEADER_LEN;
            let mut next = 0;
            for (start, end) in sends(&dests, &sizes, wire) {
                proptest::prop_assert_eq!(start, next);
                proptest::prop_assert!(end > start && end <= sizes.len());
                next = end;
                let packets: usize = sizes[start..end].iter().map(|s| s.div_ceil(chunk)).sum();
                let bytes: usize = sizes[start..end].iter().map(|s| s + s.div_ceil(chunk) * segment::HEADER_LEN).sum();
                if end - start > 1 {
                    proptest::prop_assert!(dests[start..end].iter().all(|d| *d == dests[start]));
                    proptest::prop_assert!(sizes[start..end - 1].iter().all(|s| s % chunk == 0));
                    proptest::prop_assert!(packets <= MAX_GSO_SEGMENTS);
                    proptest::prop_assert!(bytes <= MAX_UDP_PAYLOAD_V4);
                }
            }
            proptest::prop_assert_eq!(next, sizes.len());
        }
    }

    #[test]
    fn one_gso_send_bounds_the_pieces() {
        assert_eq!(pieces_per_send(1472), Some(MAX_PIECES));
        assert_eq!(pieces_per_send(4096), Some(MAX_PIECES.min(15)));
        assert_eq!(pieces_per_send(8972), Some(7));
        assert_eq!(pieces_per_send(9001), None);
        assert_eq!(pieces_per_send(65_507), None);
    }
}
