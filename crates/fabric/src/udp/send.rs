//! Posting sends: checking a batch of requests, then sending it with one
//! `sendmmsg`, equal-sized datagrams to one destination coalesced into UDP
//! GSO trains while the kernel takes them.
//!
//! [`Sender`] holds the one thing sending remembers across calls: whether
//! GSO is still in use. Which datagrams form a train is decided by
//! [`gso_train_end`], a pure function.

use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use udbtl_wire::ud;

use super::recv::UdpQp;
use super::segment::{self, MAX_PIECES, PieceHeader};
use super::{MAX_GSO_SEGMENTS, MAX_SEND_SGE, MAX_UDP_PAYLOAD_V4, sys};
use crate::bookkeeping::{QpEntry, Verbs};
use crate::{FabricError, PostError, QpHandle, Result, SendWr, WcOpcode, WcStatus, WorkCompletion};

/// The send side of a context.
#[derive(Debug)]
pub(super) struct Sender {
    /// GSO is used until the kernel refuses it once.
    gso: bool,
    /// The UDP payload of each piece of a long datagram, if the port
    /// segments (`segment/`).
    segment: Option<usize>,
    /// The segment headers of the long datagrams of a batch, [`MAX_PIECES`]
    /// per datagram, made with the sender of a port that segments: the
    /// pieces themselves are gathered from the caller's bytes.
    piece_headers: Box<[PieceHeader]>,
    /// The number of the next datagram sent in pieces.
    unit: u32,
}

/// Gather parts of one datagram: its UD header and its gather list.
const PARTS: usize = 1 + MAX_SEND_SGE as usize;
/// Gather entries of one datagram sent whole.
const SINGLE_IOV: usize = PARTS;
/// Gather entries of one datagram cut into pieces.
const PIECES_IOV: usize = segment::gather_len(PARTS);

impl Sender {
    /// A sender that coalesces datagrams with GSO if `gso`, and cuts
    /// those longer than `segment` bytes (UD header included) into pieces
    /// of that size, if set.
    pub(super) fn new(gso: bool, segment: Option<usize>) -> Self {
        let headers = if segment.is_some() {
            sys::MAX_BATCH * MAX_PIECES
        } else {
            0
        };
        Self {
            gso,
            segment,
            piece_headers: vec![PieceHeader::default(); headers].into_boxed_slice(),
            unit: 0,
        }
    }

    /// Posts sends, in order, as [`Context::post_send`](crate::Context::post_send)
    /// promises: each batch of up to [`sys::MAX_BATCH`] requests is checked,
    /// then sent with one `sendmmsg`.
    pub(super) fn post(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
    ) -> Result<(), PostError> {
        let mut posted = 0;
        while posted < wrs.len() {
            let mut lens = [0usize; sys::MAX_BATCH];
            let mut accepted = 0;
            let mut refusal = None;
            {
                let entry = verbs.qp(qp).map_err(|error| PostError { posted, error })?;
                for wr in wrs[posted..].iter().take(sys::MAX_BATCH) {
                    let checked = check_udp_send(verbs, entry, wr);
                    match checked {
                        Ok(len) => {
                            lens[accepted] = len;
                            accepted += 1;
                        }
                        Err(error) => {
                            refusal = Some(error);
                            break;
                        }
                    }
                }
                // Signaled sends of this batch must fit the send queue and
                // completion queue together, not only one by one.
                let signaled = wrs[posted..posted + accepted]
                    .iter()
                    .filter(|wr| wr.flags.contains(crate::SendFlags::SIGNALED))
                    .count();
                let sq_room = (entry.cap.max_send_wr
                    - entry.sends_outstanding.min(entry.cap.max_send_wr))
                    as usize;
                let room = sq_room.min(verbs.cq_room(entry.send_cq));
                if signaled > room {
                    let mut seen = 0;
                    let cut = wrs[posted..posted + accepted]
                        .iter()
                        .position(|wr| {
                            seen += usize::from(wr.flags.contains(crate::SendFlags::SIGNALED));
                            seen > room
                        })
                        .unwrap_or(accepted);
                    accepted = cut;
                    refusal = Some(FabricError::QueueFull {
                        queue: if sq_room <= room {
                            "send queue"
                        } else {
                            "completion queue"
                        },
                        capacity: entry.cap.max_send_wr as usize,
                    });
                }
            }
            if accepted > 0 {
                const BATCH: usize = sys::MAX_BATCH;
                let chunk = &wrs[posted..posted + accepted];
                let lens = &lens[..accepted];
                // Gather space for pieces only where a datagram is cut: the
                // entries are initialised on every call.
                let cuts = self
                    .cut_len()
                    .is_some_and(|wire| lens.iter().any(|&len| len + ud::HEADER_LEN > wire));
                match (accepted, cuts) {
                    (1, false) => self.transmit::<1, SINGLE_IOV>(verbs, qp, chunk, lens),
                    (1, true) => self.transmit::<1, PIECES_IOV>(verbs, qp, chunk, lens),
                    (_, false) => {
                        self.transmit::<BATCH, { BATCH * SINGLE_IOV }>(verbs, qp, chunk, lens)
                    }
                    (_, true) => {
                        self.transmit::<BATCH, { BATCH * PIECES_IOV }>(verbs, qp, chunk, lens)
                    }
                }
                .map_err(|error| PostError { posted, error })?;
                posted += accepted;
            }
            if let Some(error) = refusal {
                return Err(PostError { posted, error });
            }
        }
        Ok(())
    }

    /// The packet payload datagrams are cut for, if longer: only while GSO
    /// is in use, since without it a long datagram leaves whole and IP
    /// fragments it.
    fn cut_len(&self) -> Option<usize> {
        self.segment.filter(|_| self.gso)
    }

    /// Sends a run of accepted work requests, `chunk`, whose lengths are
    /// `lens`, as one `sendmmsg` batch, and completes them.
    ///
    /// `N` bounds the batch and `IOV` its gather entries: `N` times
    /// [`SINGLE_IOV`], or [`PIECES_IOV`] where a datagram is cut into
    /// pieces. The caller picks the smallest bounds that fit, so a single
    /// small send prepares one message of a few entries, not a full batch.
    fn transmit<const N: usize, const IOV: usize>(
        &mut self,
        verbs: &mut Verbs<UdpQp, IpAddr>,
        qp: QpHandle,
        chunk: &[SendWr<'_>],
        lens: &[usize],
    ) -> Result<()> {
        let mut outcome = [Outcome::Sent; N];
        let (trains, segmented) = {
            let entry = verbs.qp(qp)?;
            let (qp_qkey, pkey) = (entry.qkey, entry.pkey);
            let mut headers = [[0u8; ud::HEADER_LEN]; N];
            let mut dests = [SocketAddr::from(([0, 0, 0, 0], 0)); N];
            for (i, wr) in chunk.iter().enumerate() {
                let qkey = if wr.remote_qkey & 0x8000_0000 != 0 {
                    qp_qkey
                } else {
                    wr.remote_qkey
                };
                headers[i] = ud::Repr {
                    pkey,
                    qkey,
                    imm: wr.imm,
                }
                .to_bytes();
                let ip = verbs.ah(wr.ah)?.route;
                dests[i] = SocketAddr::new(ip, wr.remote_qpn as u16);
            }
            let mut sizes = [0usize; N];
            for (size, len) in sizes.iter_mut().zip(lens) {
                *size = len + ud::HEADER_LEN;
            }
            // Which datagrams share a GSO send, and which are padded for
            // that, where the port cuts them.
            let n = chunk.len();
            let cut_len = self.cut_len();
            let mut send_end = [0usize; N];
            let mut padded = [false; N];
            if let Some(wire) = cut_len {
                segment::plan_sends(&dests[..n], &sizes[..n], wire, &mut send_end, &mut padded);
            }
            // Each datagram's gather entries, `spans[i]` of `iov`: its UD
            // header and gather list, or those cut into pieces (`cut[i]`),
            // each behind its segment header.
            let empty: &[u8] = &[];
            let mut trailers = [[0u8; udbtl_wire::segment::TRAILER_LEN]; N];
            let mut iov = [IoSlice::new(empty); IOV];
            let mut spans = [(0usize, 0usize); N];
            let mut cut = [false; N];
            let mut used = 0;
            let mut piece_headers = self.piece_headers.chunks_exact_mut(MAX_PIECES);
            for ((i, wr), trailer) in chunk.iter().enumerate().zip(&mut trailers) {
                let start = used;
                let mut parts = [empty; PARTS];
                parts[0] = &headers[i];
                for (part, gather) in parts[1..].iter_mut().zip(wr.sg_list) {
                    *part = verbs.gather_bytes(gather);
                }
                let parts = &parts[..1 + wr.sg_list.len()];
                if let Some(wire) = cut_len.filter(|&wire| sizes[i] > wire) {
                    self.unit = self.unit.wrapping_add(1);
                    // The port's limit keeps every datagram within one GSO
                    // send; one that is not goes whole, and IP fragments it.
                    let trailer = padded[i].then_some(trailer);
                    let laid_out = piece_headers.next().and_then(|space| {
                        segment::gather(space, parts, wire, self.unit, trailer, &mut iov[used..])
                    });
                    if let Some(entries) = laid_out {
                        used += entries;
                        cut[i] = true;
                        spans[i] = (start, used);
                        continue;
                    }
                }
                for part in parts {
                    iov[used] = IoSlice::new(part);
                    used += 1;
                }
                spans[i] = (start, used);
            }
            // Group datagrams into messages, each a GSO train or a single
            // datagram.
            let mut msgs = [sys::OutMsg {
                dest: dests[0],
                iov: &[],
                segment_size: None,
            }; N];
            let mut members = [(0usize, 0usize); N];
            let mut msg_count = 0;
            let mut i = 0;
            while i < chunk.len() {
                let size = sizes[i];
                if cut[i] {
                    // One GSO send of its pieces and those of the next
                    // datagrams planned into it, up to one that was not cut
                    // after all (its layout failed): padded pieces before
                    // the end of a send are as good as full ones.
                    let wire = self.segment.unwrap_or(size);
                    let planned = send_end[i].clamp(i + 1, n);
                    let end = (i + 1..planned).find(|&j| !cut[j]).unwrap_or(planned);
                    msgs[msg_count] = sys::OutMsg {
                        dest: dests[i],
                        iov: &iov[spans[i].0..spans[end - 1].1],
                        segment_size: Some(wire as u16),
                    };
                    members[msg_count] = (i, end);
                    msg_count += 1;
                    i = end;
                    continue;
                }
                let end = if self.gso {
                    gso_train_end(&dests[..chunk.len()], lens, i)
                } else {
                    i + 1
                };
                // A datagram in pieces joins no train.
                let end = (i + 1..end).find(|&j| cut[j]).unwrap_or(end);
                msgs[msg_count] = sys::OutMsg {
                    dest: dests[i],
                    iov: &iov[spans[i].0..spans[end - 1].1],
                    segment_size: (end - i > 1).then_some(size as u16),
                };
                members[msg_count] = (i, end);
                msg_count += 1;
                i = end;
            }
            let socket = &entry.transport.socket;
            let mut next = 0;
            // Trains the kernel took as trains: a refused one went singly.
            let mut trains = 0;
            while next < msg_count {
                match sys::send_batch::<N>(socket.as_fd(), &msgs[next..msg_count]) {
                    Ok(0) => break,
                    Ok(sent) => {
                        trains += msgs[next..next + sent]
                            .iter()
                            .filter(|m| m.segment_size.is_some())
                            .count();
                        next += sent;
                    }
                    Err(err) => {
                        let (first, end) = members[next];
                        let verdict = classify_send_error(&err, msgs[next].segment_size.is_some());
                        if verdict == Outcome::GsoRefused {
                            // Resend this train one datagram at a time.
                            self.gso = false;
                            for j in first..end {
                                if cut[j] {
                                    // Its pieces need GSO: lost this once,
                                    // it is resent whole.
                                    outcome[j] = Outcome::Lost;
                                    continue;
                                }
                                let single = sys::OutMsg {
                                    dest: dests[j],
                                    iov: &iov[spans[j].0..spans[j].1],
                                    segment_size: None,
                                };
                                outcome[j] = match sys::send_batch::<1>(socket.as_fd(), &[single]) {
                                    Ok(_) => Outcome::Sent,
                                    Err(err) => classify_send_error(&err, false),
                                };
                            }
                            tracing::warn!(%err, "UDP GSO refused by the kernel; sending datagrams singly");
                        } else {
                            tracing::trace!(%err, "datagram refused by the kernel");
                            outcome[first..end].fill(verdict);
                        }
                        next += 1;
                    }
                }
            }
            (trains, cut.iter().filter(|&&cut| cut).count())
        };
        verbs.stats.tx_gso_trains += trains as u64;
        verbs.stats.tx_segmented += segmented as u64;
        for (i, wr) in chunk.iter().enumerate() {
            match outcome[i] {
                Outcome::Sent => {}
                Outcome::Lost => verbs.stats.tx_kernel_drops += 1,
                Outcome::Failed | Outcome::GsoRefused => {
                    complete_failed_send(verbs, qp, wr);
                    continue;
                }
            }
            verbs.complete_send(qp, (wr.wr_id, wr.flags), lens[i]);
        }
        Ok(())
    }
}

/// Completes a send the kernel refused for a reason that is not a loss: a
/// signaled one with an error, as a UD send that never left would.
fn complete_failed_send(verbs: &mut Verbs<UdpQp, IpAddr>, qp: QpHandle, wr: &SendWr<'_>) {
    if !wr.flags.contains(crate::SendFlags::SIGNALED) {
        return;
    }
    let Ok(entry) = verbs.qp_mut(qp) else {
        return;
    };
    entry.sends_outstanding += 1;
    let (cq, qp_num) = (entry.send_cq, entry.qp_num);
    verbs.push_completion(
        cq,
        qp,
        WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::GeneralError,
            opcode: WcOpcode::Send,
            byte_len: 0,
            qp_num,
            src: None,
            imm: None,
        },
    );
}

/// The verbs checks of a send, plus this provider's own: the remote QP
/// number is a UDP port.
pub(super) fn check_udp_send(
    verbs: &Verbs<UdpQp, IpAddr>,
    entry: &QpEntry<UdpQp>,
    wr: &SendWr<'_>,
) -> Result<usize> {
    let len = verbs.check_send(entry, wr)?;
    if wr.remote_qpn == 0 || wr.remote_qpn > u32::from(u16::MAX) {
        return Err(FabricError::InvalidArgument {
            what: "remote queue pair number",
            detail: format!("{} is not a UDP port", wr.remote_qpn),
        });
    }
    Ok(len)
}

/// Where the GSO train that begins with datagram `start` ends (exclusive).
///
/// Datagram `i` goes to `dests[i]` and carries `lens[i]` payload bytes
/// behind a UD header. A train is a run to one destination in which every
/// datagram but the last has the size of the first and the last is not
/// longer nor empty, of at most [`MAX_GSO_SEGMENTS`] datagrams and at most
/// one IPv4 UDP payload in all. A datagram that starts no longer run is a
/// train of one: the result is always greater than `start` when `start` is
/// in range.
pub(super) fn gso_train_end(dests: &[SocketAddr], lens: &[usize], start: usize) -> usize {
    let count = lens.len().min(dests.len());
    let i = start;
    let mut end = i + 1;
    let mut total = lens.get(i).map_or(0, |len| len + ud::HEADER_LEN);
    while end < count
        && end - i < MAX_GSO_SEGMENTS
        && dests[end] == dests[i]
        && lens[end - 1] == lens[i]
        && lens[end] <= lens[i]
        && lens[end] > 0
        && total + lens[end] + ud::HEADER_LEN <= MAX_UDP_PAYLOAD_V4
    {
        total += lens[end] + ud::HEADER_LEN;
        end += 1;
    }
    end
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Sent,
    /// Dropped by the kernel: to the peer it is a lost datagram.
    Lost,
    /// The kernel refused a GSO train; resend singly.
    GsoRefused,
    /// A local failure that is not a loss.
    Failed,
}

fn classify_send_error(err: &io::Error, gso: bool) -> Outcome {
    match err.raw_os_error() {
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT) if gso => Outcome::GsoRefused,
        Some(
            libc::EAGAIN
            | libc::ENOBUFS
            | libc::ENOMEM
            | libc::EPERM
            | libc::EACCES
            | libc::ECONNREFUSED
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::ENETDOWN
            | libc::EHOSTDOWN
            | libc::EMSGSIZE,
        ) => Outcome::Lost,
        _ => Outcome::Failed,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn to(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// The trains [`gso_train_end`] cuts a batch into, as `start..end`.
    fn trains(dests: &[SocketAddr], lens: &[usize]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = 0;
        while start < lens.len() {
            let end = gso_train_end(dests, lens, start);
            out.push((start, end));
            start = end;
        }
        out
    }

    #[test]
    fn equal_sizes_to_one_destination_form_one_train() {
        let dests = [to(1); 5];
        assert_eq!(trains(&dests, &[1000; 5]), [(0, 5)]);
    }

    #[test]
    fn a_single_datagram_is_a_train_of_one() {
        assert_eq!(trains(&[to(1)], &[1000]), [(0, 1)]);
    }

    #[test]
    fn a_shorter_datagram_joins_as_the_last() {
        let dests = [to(1); 5];
        assert_eq!(
            trains(&dests, &[1000, 1000, 400, 1000, 1000]),
            [(0, 3), (3, 5)]
        );
    }

    #[test]
    fn a_longer_datagram_starts_a_new_train() {
        let dests = [to(1); 4];
        assert_eq!(trains(&dests, &[400, 400, 1000, 1000]), [(0, 2), (2, 4)]);
    }

    #[test]
    fn a_new_destination_starts_a_new_train() {
        let dests = [to(1), to(1), to(2), to(2), to(1)];
        assert_eq!(trains(&dests, &[100; 5]), [(0, 2), (2, 4), (4, 5)]);
    }

    #[test]
    fn an_empty_datagram_never_joins_a_train() {
        let dests = [to(1); 4];
        assert_eq!(
            trains(&dests, &[100, 0, 0, 100]),
            [(0, 1), (1, 2), (2, 3), (3, 4)]
        );
    }

    #[test]
    fn a_train_stops_at_the_segment_limit() {
        let dests = [to(1); 130];
        assert_eq!(
            trains(&dests, &[100; 130]),
            [(0, 64), (64, 128), (128, 130)]
        );
    }

    #[test]
    fn a_train_stops_at_one_udp_payload() {
        let len = 1400;
        let fit = MAX_UDP_PAYLOAD_V4 / (len + ud::HEADER_LEN);
        assert!(fit < MAX_GSO_SEGMENTS);
        let dests = [to(1); 60];
        let lens = [len; 60];
        assert_eq!(gso_train_end(&dests, &lens, 0), fit);
        assert_eq!(gso_train_end(&dests, &lens, fit), 60);
    }

    #[test]
    fn a_train_may_start_inside_the_batch() {
        let dests = [to(1), to(2), to(2), to(2), to(3)];
        assert_eq!(gso_train_end(&dests, &[9, 500, 500, 200, 500], 1), 4);
    }

    proptest! {
        /// Trains cover the batch in order, and each is one GSO send the
        /// kernel takes: one destination, all but the last of the first's
        /// size, the last no longer and not empty, within the segment and
        /// payload limits.
        #[test]
        fn trains_are_sendable_and_cover_the_batch(
            batch in prop::collection::vec((0u16..3, prop::sample::select(vec![0usize, 1, 700, 1400, 9000])), 1..200)
        ) {
            let dests: Vec<SocketAddr> = batch.iter().map(|(port, _)| to(*port)).collect();
            let lens: Vec<usize> = batch.iter().map(|(_, len)| *len).collect();
            let mut next = 0;
            for (start, end) in trains(&dests, &lens) {
                prop_assert_eq!(start, next);
                prop_assert!(end > start && end <= lens.len());
                next = end;
                if end - start == 1 {
                    continue;
                }
                let train = start..end;
                prop_assert!(end - start <= MAX_GSO_SEGMENTS);
                prop_assert!(dests[train.clone()].iter().all(|d| *d == dests[start]));
                prop_assert!(lens[start..end - 1].iter().all(|l| *l == lens[start]));
                prop_assert!(lens[end - 1] <= lens[start] && lens[end - 1] > 0);
                let total: usize = lens[train].iter().map(|l| l + ud::HEADER_LEN).sum();
                prop_assert!(total <= MAX_UDP_PAYLOAD_V4);
            }
            prop_assert_eq!(next, lens.len());
        }
    }
}
