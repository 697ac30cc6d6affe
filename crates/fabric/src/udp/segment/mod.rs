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
//! the same peer behind it where they fit ([`pieces_send_end`], the last
//! piece padded where it is short). Receiving ([`receive`]): a datagram whose
//! pieces all came in one receive, what GRO makes of a GSO send, is read
//! in place ([`in_place`]) or put together in the front posted buffer;
//! pieces that came apart (no GRO, or a train GRO split) wait in a small
//! table of partial datagrams, one per sender ([`Partials`]), and a
//! datagram missing a piece is dropped whole, as a lost datagram, and
//! counted.

use std::io::IoSlice;
use std::net::SocketAddr;

use udbtl_wire::segment;

use super::sys::MAX_BATCH;
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
/// whose pieces one send can carry, within [`MAX_GSO_SEGMENTS`] packets and
/// one IPv4 UDP payload, each before the last either filling its last
/// piece or padded to ([`padding`]).
///
/// Datagram `i` is `sizes[i]` bytes, UD header included. At MTU 1500 two
/// full datagrams share a send (32 packets of 1 472 bytes), and three of a
/// 16 KiB message's: fewer sends, and fewer packets the kernel handles one
/// by one on the way, for the same bytes. A receiver tells the datagrams
/// apart by their segment headers, as it does where GRO joins two sends.
pub(super) fn pieces_send_end(
    dests: &[SocketAddr],
    sizes: &[usize],
    cut: &[bool],
    wire: usize,
    start: usize,
) -> usize {
    let count = sizes.len().min(dests.len()).min(cut.len());
    let Some((first, _)) = sizes.get(start).and_then(|&size| cut_shape(size, wire)) else {
        return start + 1;
    };
    let mut end = start + 1;
    // Packets so far; once all of them are full, their bytes are
    // `packets * wire`.
    let mut packets = first;
    while end < count
        && cut[end]
        && dests[end] == dests[start]
        && padding(sizes[end - 1], wire).is_some()
    {
        let Some((more, last)) = cut_shape(sizes[end], wire) else {
            break;
        };
        let bytes = packets * wire + (more - 1) * wire + segment::HEADER_LEN + last;
        if packets + more > MAX_GSO_SEGMENTS || bytes > MAX_UDP_PAYLOAD_V4 {
            break;
        }
        packets += more;
        end += 1;
    }
    end
}

/// Plans the GSO sends of a batch whose datagrams longer than `wire` bytes
/// are cut ([`pieces_send_end`]): `send_end[i]` is where datagram `i`'s
/// send ends (`i + 1` for one sent whole) and `padded[i]` whether its
/// last piece is to be padded, which every member of a send but its last
/// is. A batch is at most [`MAX_BATCH`] datagrams: those past it, or past
/// the shortest slice, are not planned.
pub(super) fn plan_sends(
    dests: &[SocketAddr],
    sizes: &[usize],
    wire: usize,
    send_end: &mut [usize],
    padded: &mut [bool],
) {
    let count = sizes
        .len()
        .min(dests.len())
        .min(send_end.len())
        .min(padded.len())
        .min(MAX_BATCH);
    let mut cut = [false; MAX_BATCH];
    for (cut, &size) in cut.iter_mut().zip(sizes) {
        *cut = size > wire;
    }
    let mut i = 0;
    while i < count {
        let end = if cut[i] {
            pieces_send_end(dests, sizes, &cut[..count], wire, i)
        } else {
            i + 1
        };
        for j in i..end {
            send_end[j] = end;
            padded[j] = j + 1 < end;
        }
        i = end;
    }
}

/// How a datagram of `size` bytes is cut for `wire`-byte packets: its
/// pieces, and the body of the last.
fn cut_shape(size: usize, wire: usize) -> Option<(usize, usize)> {
    let chunk = wire.checked_sub(segment::HEADER_LEN).filter(|&c| c > 0)?;
    let count = size.div_ceil(chunk);
    (count >= 1).then(|| (count, size - (count - 1) * chunk))
}

/// The padding a datagram of `size` bytes needs for its last piece to fill
/// a `wire`-byte packet, so that another datagram's pieces can follow in
/// the same GSO send: `Some(0)` where it fills it already, `None` where
/// the padding would not hold the trailer or would add more than an eighth
/// to the datagram (on a path that the wire limits, padding costs
/// bandwidth; a few hundred bytes on a 16 KiB message cost less than a
/// send of their own).
pub(super) fn padding(size: usize, wire: usize) -> Option<usize> {
    let (_, last) = cut_shape(size, wire)?;
    let pad = wire - segment::HEADER_LEN - last;
    (pad == 0 || (pad >= segment::TRAILER_LEN && pad <= size / 8)).then_some(pad)
}

/// A piece's segment header, as it goes on the wire.
pub(super) type PieceHeader = [u8; segment::HEADER_LEN];

/// Gather entries one datagram of `parts` gather parts may need when it is
/// cut into pieces: a header per piece, per piece the parts it spans,
/// which add up to at most the pieces plus the parts, and the padding and
/// trailer of a padded last piece.
pub(super) const fn gather_len(parts: usize) -> usize {
    2 * MAX_PIECES + parts + 2
}

/// Zeros that pad a short last piece ([`padding`]).
static ZEROS: [u8; WIRE_MAX] = [0; WIRE_MAX];

/// Lays out the datagram `parts` (UD header, then payload) as pieces for
/// `wire`-byte packets without copying it: writes each piece's segment
/// header, naming `unit`, into `headers`, and fills `iov` with the headers
/// and the slices of `parts` in the order the packets carry them. With
/// `trailer`, a short last piece is padded to a full packet, its length
/// written there ([`udbtl_wire::segment`]); the caller checked with
/// [`padding`] that it may be. Returns the entries of `iov` used, or
/// `None` if the datagram fits one packet, needs more pieces than
/// `headers` hold or a header can count, or `iov` is too short
/// ([`gather_len`] is enough).
pub(super) fn gather<'a>(
    headers: &'a mut [PieceHeader],
    parts: &[&'a [u8]],
    wire: usize,
    unit: u32,
    trailer: Option<&'a mut [u8; segment::TRAILER_LEN]>,
    iov: &mut [IoSlice<'a>],
) -> Option<usize> {
    let chunk = wire.checked_sub(segment::HEADER_LEN).filter(|&c| c > 0)?;
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let count = u8::try_from(total.div_ceil(chunk)).ok()?;
    if !(2..=segment::MAX_COUNT).contains(&count) || usize::from(count) > headers.len() {
        return None;
    }
    let last = total - (usize::from(count) - 1) * chunk;
    // The zeros and the trailer after a padded last piece's body.
    let pad = match trailer {
        Some(space) if last < chunk => {
            let zeros = chunk.checked_sub(last + segment::TRAILER_LEN)?;
            *space = segment::trailer(last)?;
            let space: &'a [u8] = space;
            Some((ZEROS.get(..zeros)?, space))
        }
        _ => None,
    };
    let headers = &mut headers[..usize::from(count)];
    for (index, header) in (0..count).zip(headers.iter_mut()) {
        let padded = pad.is_some() && index + 1 == count;
        segment::Repr {
            count,
            index,
            unit,
            padded,
        }
        .emit(header);
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
    if let Some((zeros, trailer)) = pad {
        push(zeros)?;
        push(trailer)?;
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
        let used = gather(&mut headers, parts, wire, unit, None, &mut iov)?;
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
        assert_eq!(gather(&mut headers, &parts, 1472, 1, None, &mut iov), None);
    }

    #[test]
    fn the_gather_bound_holds_for_parts_cut_at_every_piece() {
        // Parts of 1 000 bytes against pieces of 1 464: most pieces span two.
        let bytes = vec![7u8; 9 * 1000];
        let parts: Vec<&[u8]> = bytes.chunks(1000).collect();
        let mut headers = [PieceHeader::default(); MAX_PIECES];
        let mut iov = [IoSlice::new(&[]); gather_len(9)];
        let used = gather(&mut headers, &parts, 1472, 1, None, &mut iov).expect("laid out");
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
        /// The planned sends cover the batch in order, and each, laid out,
        /// is one the kernel takes (one destination, all packets `wire`
        /// bytes but the last, within the packet and payload limits) and
        /// one a receiver takes apart into the datagrams sent.
        #[test]
        fn planned_sends_are_sendable_and_come_apart_into_the_datagrams(
            batch in proptest::collection::vec(
                (0u16..2, 2usize..=MAX_PIECES, proptest::sample::select(vec![0usize, 1, 2, 3, 100, 300, 700])),
                1..MAX_BATCH,
            ),
            wire in proptest::sample::select(vec![600usize, 1472, 4096]),
        ) {
            let chunk = wire - segment::HEADER_LEN;
            let dests: Vec<SocketAddr> = batch.iter().map(|(port, _, _)| to(*port)).collect();
            let sizes: Vec<usize> = batch
                .iter()
                .map(|&(_, pieces, short)| {
                    // As the port's limit keeps them: within one GSO send.
                    let pieces = pieces.min(pieces_per_send(wire).unwrap_or(2));
                    (pieces * chunk).saturating_sub(short).max(chunk + 1)
                })
                .collect();
            let datagrams: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| (0..size).map(|b| (b * 7 + i * 13) as u8).collect())
                .collect();
            let mut send_end = vec![0; sizes.len()];
            let mut padded = vec![false; sizes.len()];
            plan_sends(&dests, &sizes, wire, &mut send_end, &mut padded);
            let mut start = 0;
            while start < sizes.len() {
                let end = send_end[start];
                proptest::prop_assert!(end > start && end <= sizes.len());
                proptest::prop_assert!(dests[start..end].iter().all(|d| *d == dests[start]));
                let mut image = Vec::new();
                for i in start..end {
                    proptest::prop_assert_eq!(send_end[i], end);
                    proptest::prop_assert_eq!(padded[i], i + 1 < end);
                    let mut headers = [PieceHeader::default(); MAX_PIECES];
                    let mut trailer = [0u8; segment::TRAILER_LEN];
                    let mut iov = [IoSlice::new(&[]); gather_len(1)];
                    let used = gather(&mut headers, &[&datagrams[i]], wire, i as u32, padded[i].then_some(&mut trailer), &mut iov);
                    let used = used.expect("laid out");
                    image.extend(iov[..used].iter().flat_map(|s| s.iter().copied()));
                }
                let packets: Vec<&[u8]> = image.chunks(wire).collect();
                proptest::prop_assert!(packets.len() <= MAX_GSO_SEGMENTS);
                proptest::prop_assert!(image.len() <= MAX_UDP_PAYLOAD_V4);
                proptest::prop_assert!(packets[..packets.len() - 1].iter().all(|p| p.len() == wire));
                let mut bodies = packets.iter().map(|p| segment::body(p).expect("a piece"));
                for datagram in &datagrams[start..end] {
                    let count = datagram.len().div_ceil(chunk);
                    let joined: Vec<u8> = bodies.by_ref().take(count).flatten().copied().collect();
                    proptest::prop_assert_eq!(&joined, datagram);
                }
                start = end;
            }
        }
    }

    #[test]
    fn a_16_kib_message_is_padded_to_share_a_send_with_two_more() {
        // 16 KiB and ob1's and the BTL's headers, cut into 12 pieces: the
        // last 288 bytes padded by 1 176, under an eighth.
        let size = 16_384 + 64;
        assert_eq!(padding(size, 1472), Some(12 * 1464 - size));
        assert_eq!(
            sends(&[to(1); 7], &[size; 7], 1472),
            [(0, 3), (3, 6), (6, 7)]
        );
        // Padding more than an eighth is not worth a send.
        assert_eq!(padding(2000, 1472), None);
        assert_eq!(padding(FULL, 1472), Some(0));
        assert_eq!(padding(FULL - 1, 1472), None);
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
