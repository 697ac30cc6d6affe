//! Remote reads: the BTL interface's `get`, emulated over the reliable
//! stream ([`udbtl_wire::read`]).
//!
//! A host lets its peers read memory it registered ([`Region`]); a reader
//! asks a peer for a range of it with a small request and names where the
//! bytes go ([`ReadTarget`]). The peer answers with one message whose
//! datagrams gather the bytes straight from the registered memory (a train,
//! as a fragment prepared from the caller's memory leaves), and the reader
//! copies each datagram's bytes straight into the target as it is
//! delivered, in order, right after its checksum was checked, while it is
//! still in the cache. Compared with sending the same bytes through the
//! host's fragments, nothing is copied on the sending side, nothing is
//! reassembled on the receiving side, and the host handles one request
//! per read instead of one fragment per `frag_size`.
//!
//! The reader may only be written by a reply to a read it asked for, from
//! the peer it asked, at most up to the length it asked; the owner serves
//! only ranges inside a region it registered, named by a key it drew.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use udbtl_wire::read::{self, ReplyHeader, Request};

use crate::EndpointId;
use crate::frag::LentBytes;
use crate::rcache::RegId;

mod copy;
mod engine;
pub(super) use engine::read_limit;

pub(super) use copy::TargetCopy;

/// Memory a host lets its peers read ([`Module::register_region`]).
///
/// The contract, which the BTL relies on: [`bytes`](LentBytes::bytes)
/// returns the same bytes from registration until the region is
/// deregistered and every reply sent from it is acknowledged. A host that
/// deregisters only once the reader said it has everything (as ob1 does,
/// on its FIN message, which the reader sends after the last reply
/// datagram arrived and which acknowledges it) meets the second half.
///
/// [`Module::register_region`]: super::Module::register_region
pub type Region = Arc<dyn LentBytes>;

/// Where a read's bytes go.
pub trait ReadTarget: Send + 'static {
    /// The bytes to fill: exactly as many as the read asks for. The BTL
    /// writes them, in order, between the read's start and its
    /// completion event, and nothing else does meanwhile.
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// A registered region's name, which a host passes to the peers that may
/// read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionKey(pub u64);

/// Where a read takes its bytes from: a region of the peer's, and the
/// address of the first byte in the peer's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRange {
    /// The region, as the peer registered it.
    pub key: RegionKey,
    /// The first byte wanted.
    pub addr: u64,
}

/// Why a read did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadFailure {
    /// The peer refused: the range is in no region it registered (or the
    /// region was deregistered), is too long, or the peer's fabric refused
    /// to register the region.
    #[error("the peer refused the read (status {status})")]
    Refused {
        /// The reply's status ([`udbtl_wire::read`]).
        status: u32,
    },
    /// The reply did not match the read: more or fewer bytes than asked
    /// for, or cut short by its sender.
    #[error("the reply was malformed: {0}")]
    Malformed(&'static str),
    /// The peer was lost (or deleted) before the reply was complete.
    #[error("the peer was lost before the read completed")]
    PeerLost,
}

/// What the read callback sees when a read is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadEvent {
    /// The peer read from.
    pub endpoint: EndpointId,
    /// The caller's value given with the read.
    pub context: u64,
    /// Whether every byte arrived.
    pub status: Result<(), ReadFailure>,
}

/// The read completion callback.
pub type ReadCallback = Box<dyn FnMut(&ReadEvent) + Send>;

/// Reads whose request is out and whose reply is not complete, at most:
/// the others wait their turn in the module. Each in flight holds a send
/// fragment until its request is acknowledged, and its reply a train at
/// the peer. 32 replies are 2 MiB in flight at MTU 1500 (64 KiB each) and
/// 8 MiB where replies are four fragments, well over the reliable window's
/// worth either way, and leave the fragment pool to the host, which cannot
/// tell that the module's own messages took it (a window of 64 gets of
/// 1 MiB through Open MPI, 1 024 reads at once, hung without this bound).
const READS_IN_FLIGHT: usize = 32;

/// Requests a peer may have waiting to be served: twice what a reader
/// keeps out, so a peer that asks for more (a broken or hostile one) has
/// the excess dropped, counted, instead of growing the queue without bound.
const WAITING_PER_PEER: usize = 2 * READS_IN_FLIGHT;

/// A read this module asked for.
struct Pending {
    endpoint: EndpointId,
    target: Box<dyn ReadTarget>,
    len: usize,
    from: RemoteRange,
    context: u64,
    /// Its request is out.
    sent: bool,
}

/// The reply a peer is sending: its read, taken out of `pending` for the
/// reply's duration so that each datagram costs one lookup, and the bytes
/// written so far.
struct Incoming {
    id: u32,
    read: Pending,
    at: usize,
}

/// A reply's bytes: a range of a registered region, lent to a send.
struct RegionSlice {
    region: Region,
    start: usize,
    len: usize,
}

impl LentBytes for RegionSlice {
    fn bytes(&self) -> &[u8] {
        // In range: checked against the region when the request was served.
        self.region
            .bytes()
            .get(self.start..self.start + self.len)
            .unwrap_or_default()
    }
}

/// A request served, as the engine sends it: the region's bytes (or why
/// none) for the reply to `endpoint`.
pub(super) enum Reply {
    /// The bytes, and the reply's header.
    Bytes(ReplyHeader, Box<dyn LentBytes>),
    /// No bytes: the header says why.
    Refusal(ReplyHeader),
}

/// A module's remote reads: the regions it serves, the reads it asked for,
/// and the requests waiting for fragments.
#[derive(Default)]
pub(super) struct Reads {
    /// Registered regions by key, with the registration-cache reference
    /// each holds over its whole length (so that every reply from it hits
    /// the cache), if the fabric took it.
    regions: HashMap<u64, (Region, Option<RegId>)>,
    next_key: u64,
    pending: HashMap<u32, Pending>,
    next_id: u32,
    /// Reads whose request is not out yet, oldest first.
    unsent: VecDeque<u32>,
    /// Reads whose request is out and whose reply is not complete.
    in_flight: usize,
    /// The reply in progress from each peer, by endpoint.
    incoming: HashMap<u32, Incoming>,
    /// Reads over, for the engine to report, oldest first.
    finished: VecDeque<ReadEvent>,
    /// Requests not served yet (no fragment was free), oldest first.
    waiting: VecDeque<(EndpointId, Request)>,
    /// How many of them each peer has, by endpoint.
    waiting_from: HashMap<u32, usize>,
    /// How reads copy into their targets (the `read_copy` parameter).
    copy: TargetCopy,
}

impl fmt::Debug for Reads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reads")
            .field("regions", &self.regions.len())
            .field("pending", &self.pending.len())
            .field("waiting", &self.waiting.len())
            .field("unsent", &self.unsent.len())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Reads {
    /// Reads whose keys start at `first_key` (drawn at random, so that keys
    /// of earlier runs and other modules do not name this one's regions),
    /// which copy into their targets as `copy` says.
    pub(super) fn new(first_key: u64, copy: TargetCopy) -> Self {
        Self {
            next_key: first_key,
            copy,
            ..Self::default()
        }
    }

    /// Whether requests wait to be served.
    pub(super) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Whether reads wait for their turn to send their request.
    pub(super) fn has_unsent(&self) -> bool {
        !self.unsent.is_empty()
    }

    /// The next read whose request may go now, with the request; it counts
    /// as in flight until [`request_unsent`](Self::request_unsent) takes it
    /// back or it finishes.
    pub(super) fn next_unsent(&mut self) -> Option<(EndpointId, Request)> {
        if self.in_flight >= READS_IN_FLIGHT {
            return None;
        }
        let id = self.unsent.pop_front()?;
        let read = self.pending.get_mut(&id)?;
        read.sent = true;
        self.in_flight += 1;
        let request = Request {
            id,
            key: read.from.key.0,
            addr: read.from.addr,
            len: read.len as u64,
        };
        Some((read.endpoint, request))
    }

    /// Puts back a read whose request could not be sent now (no free
    /// fragment); it stays first.
    pub(super) fn request_unsent(&mut self, id: u32) {
        if let Some(read) = self.pending.get_mut(&id) {
            read.sent = false;
            self.in_flight -= 1;
            self.unsent.push_front(id);
        }
    }

    /// Whether nothing is asked for or waiting to be served.
    pub(super) fn is_quiet(&self) -> bool {
        self.pending.is_empty() && self.incoming.is_empty() && self.waiting.is_empty()
    }

    /// The oldest read that is over, to be reported.
    pub(super) fn pop_finished(&mut self) -> Option<ReadEvent> {
        self.finished.pop_front()
    }

    /// Registers `region` and returns its key, never 0 (a host may use 0
    /// for "no region", as the Open MPI component does).
    pub(super) fn register(&mut self, region: Region, reg: Option<RegId>) -> RegionKey {
        if self.next_key == 0 {
            self.next_key = 1;
        }
        let key = self.next_key;
        self.next_key = self.next_key.wrapping_add(1);
        self.regions.insert(key, (region, reg));
        RegionKey(key)
    }

    /// Forgets a region: `None` if the key named none, else the
    /// registration-cache reference it held, for the caller to release.
    pub(super) fn deregister(&mut self, key: RegionKey) -> Option<Option<RegId>> {
        self.regions.remove(&key.0).map(|(_, reg)| reg)
    }

    /// Forgets every region (the module is closing); returns the
    /// registration-cache references they held.
    pub(super) fn deregister_all(&mut self) -> Vec<RegId> {
        self.regions
            .drain()
            .filter_map(|(_, (_, reg))| reg)
            .collect()
    }

    /// Queues a read of `len` bytes at `from` in `endpoint`'s memory into
    /// `target`, for its request to go when its turn comes.
    pub(super) fn start(
        &mut self,
        endpoint: EndpointId,
        target: Box<dyn ReadTarget>,
        (len, from): (usize, RemoteRange),
        context: u64,
    ) {
        let mut id = self.next_id;
        while self.pending.contains_key(&id) || self.incoming.values().any(|i| i.id == id) {
            id = id.wrapping_add(1);
        }
        self.next_id = id.wrapping_add(1);
        self.pending.insert(
            id,
            Pending {
                endpoint,
                target,
                len,
                from,
                context,
                sent: false,
            },
        );
        self.unsent.push_back(id);
    }

    /// Queues a request from `endpoint` to be served; `false`, with
    /// nothing queued, when that peer already has [`WAITING_PER_PEER`]
    /// waiting, which a reader that keeps to `READS_IN_FLIGHT` never has.
    pub(super) fn queue_request(&mut self, endpoint: EndpointId, request: Request) -> bool {
        let count = self.waiting_from.entry(endpoint.0).or_default();
        if *count >= WAITING_PER_PEER {
            return false;
        }
        *count += 1;
        self.waiting.push_back((endpoint, request));
        true
    }

    /// The oldest request waiting, if any.
    pub(super) fn next_request(&mut self) -> Option<(EndpointId, Request)> {
        let (endpoint, request) = self.waiting.pop_front()?;
        if let Some(count) = self.waiting_from.get_mut(&endpoint.0) {
            *count -= 1;
            if *count == 0 {
                self.waiting_from.remove(&endpoint.0);
            }
        }
        Some((endpoint, request))
    }

    /// Puts back a request that could not be served yet (it stays first).
    pub(super) fn requeue_request(&mut self, endpoint: EndpointId, request: Request) {
        *self.waiting_from.entry(endpoint.0).or_default() += 1;
        self.waiting.push_front((endpoint, request));
    }

    /// What to send for `request`: the bytes of a registered region, or a
    /// refusal when the range is in none or longer than `limit`.
    pub(super) fn serve(&self, request: &Request, limit: usize) -> Reply {
        let refuse = |status| {
            Reply::Refusal(ReplyHeader {
                id: request.id,
                status,
            })
        };
        let Ok(len) = usize::try_from(request.len) else {
            return refuse(read::STATUS_TOO_LONG);
        };
        if len > limit {
            return refuse(read::STATUS_TOO_LONG);
        }
        let Some((region, _)) = self.regions.get(&request.key) else {
            return refuse(read::STATUS_NO_REGION);
        };
        let base = region.bytes().as_ptr() as u64;
        let start = request
            .addr
            .checked_sub(base)
            .and_then(|s| usize::try_from(s).ok());
        let Some(start) = start.filter(|s| {
            s.checked_add(len)
                .is_some_and(|end| end <= region.bytes().len())
        }) else {
            return refuse(read::STATUS_NO_REGION);
        };
        let header = ReplyHeader {
            id: request.id,
            status: read::STATUS_OK,
        };
        Reply::Bytes(
            header,
            Box::new(RegionSlice {
                region: Arc::clone(region),
                start,
                len,
            }),
        )
    }

    /// One delivered datagram of a reply from `endpoint`, with its message
    /// bounds: copies its bytes into the read's target. A read it completes
    /// or fails goes to the finished ones. `Err` when it belongs to no read
    /// in progress (counted by the caller as an orphan).
    pub(super) fn on_reply(
        &mut self,
        endpoint: EndpointId,
        (first, last, abort): (bool, bool, bool),
        payload: &[u8],
    ) -> Result<(), ()> {
        let bytes = if first {
            // On an in-order stream a reply starts only after the last one
            // ended; one its sender never ended is over.
            if let Some(stale) = self.incoming.remove(&endpoint.0) {
                let failure = ReadFailure::Malformed("cut short by the next reply");
                self.finish(stale.read, Err(failure));
            }
            let header = ReplyHeader::parse(payload).map_err(|_| ())?;
            let ours = self
                .pending
                .get(&header.id)
                .is_some_and(|p| p.endpoint == endpoint && p.sent);
            let Some(read) = self.pending.remove(&header.id).filter(|_| ours) else {
                return Err(());
            };
            if header.status != read::STATUS_OK {
                let status = header.status;
                self.finish(read, Err(ReadFailure::Refused { status }));
                return Ok(());
            }
            let incoming = Incoming {
                id: header.id,
                read,
                at: 0,
            };
            self.incoming.insert(endpoint.0, incoming);
            &payload[read::REPLY_HEADER_LEN..]
        } else {
            payload
        };
        let Some(incoming) = self.incoming.get_mut(&endpoint.0) else {
            return Err(());
        };
        let at = incoming.at + bytes.len();
        let fits = !abort && at <= incoming.read.len;
        let dest = incoming
            .read
            .target
            .bytes_mut()
            .get_mut(incoming.at..at)
            .filter(|_| fits);
        let failure = match dest {
            Some(dest) => {
                self.copy.copy(dest, bytes);
                incoming.at = at;
                if !last {
                    return Ok(());
                }
                (at < incoming.read.len).then_some("fewer bytes than were asked for")
            }
            None if abort => Some("its sender gave up on it"),
            None => Some("more bytes than were asked for"),
        };
        if let Some(incoming) = self.incoming.remove(&endpoint.0) {
            self.finish(
                incoming.read,
                failure.map_or(Ok(()), |f| Err(ReadFailure::Malformed(f))),
            );
        }
        Ok(())
    }

    /// Ends `read` with `status`.
    fn finish(&mut self, read: Pending, status: Result<(), ReadFailure>) {
        if read.sent {
            self.in_flight -= 1;
        }
        self.finished.push_back(ReadEvent {
            endpoint: read.endpoint,
            context: read.context,
            status,
        });
    }

    /// Fails every read from `endpoint` and drops its waiting requests and
    /// its reply in progress: the peer is gone.
    pub(super) fn forget_peer(&mut self, endpoint: EndpointId) {
        if let Some(incoming) = self.incoming.remove(&endpoint.0) {
            self.finish(incoming.read, Err(ReadFailure::PeerLost));
        }
        self.waiting.retain(|(e, _)| *e != endpoint);
        self.waiting_from.remove(&endpoint.0);
        let pending = &self.pending;
        self.unsent
            .retain(|id| pending.get(id).is_some_and(|p| p.endpoint != endpoint));
        let ids: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.endpoint == endpoint)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(read) = self.pending.remove(&id) {
                self.finish(read, Err(ReadFailure::PeerLost));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bytes(Vec<u8>);

    impl LentBytes for Bytes {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }

    fn request(id: u32, key: RegionKey, addr: u64, len: u64) -> Request {
        Request {
            id,
            key: key.0,
            addr,
            len,
        }
    }

    #[test]
    fn a_peer_that_asks_for_more_than_a_reader_keeps_out_has_the_excess_dropped() {
        let mut reads = Reads::new(1, TargetCopy::Cached);
        let (a, b) = (EndpointId(1), EndpointId(2));
        for id in 0..WAITING_PER_PEER as u32 {
            assert!(reads.queue_request(a, request(id, RegionKey(1), 0, 1)));
        }
        assert!(!reads.queue_request(a, request(99, RegionKey(1), 0, 1)));
        assert!(reads.queue_request(b, request(0, RegionKey(1), 0, 1)));
        let (first, taken) = reads.next_request().unwrap();
        assert_eq!((first, taken.id), (a, 0));
        assert!(
            reads.queue_request(a, request(100, RegionKey(1), 0, 1)),
            "room again"
        );
        reads.requeue_request(first, taken);
        assert!(
            !reads.queue_request(a, request(101, RegionKey(1), 0, 1)),
            "full again"
        );
        reads.forget_peer(a);
        assert!(reads.queue_request(a, request(102, RegionKey(1), 0, 1)));
    }

    #[test]
    fn reads_are_one_to_four_fragments_of_whole_datagrams() {
        use super::engine::{READ_MAX, read_limit};
        let header = read::REPLY_HEADER_LEN;
        // Loopback: four 64 KiB datagrams.
        assert_eq!(read_limit(65_451, 65_451), 4 * 65_451 - header);
        // MTU 1500: one fragment of 46 datagrams.
        assert_eq!(read_limit(1_416, 46 * 1_416), 46 * 1_416 - header);
        // MTU 9000: 28 datagrams, four fragments of 7.
        assert_eq!(read_limit(8_948, 7 * 8_948), 28 * 8_948 - header);
        for datagram in [312, 1_416, 4_000, 8_948, 65_451] {
            for frags in [1, 2, 46, 200] {
                let frag = (datagram * frags).min(16 << 20);
                let limit = read_limit(datagram, frag) + header;
                assert_eq!(limit % datagram, 0, "{datagram} {frag}");
                assert!(limit <= READ_MAX, "{datagram} {frag}");
                assert!(
                    limit >= frag.min(READ_MAX / datagram * datagram),
                    "{datagram} {frag}"
                );
            }
        }
        assert_eq!(read_limit(0, 0), 0);
    }

    #[test]
    fn only_ranges_inside_a_registered_region_are_served() {
        let mut reads = Reads::new(u64::MAX, TargetCopy::Cached);
        let region: Region = Arc::new(Bytes(vec![7; 100]));
        let base = region.bytes().as_ptr() as u64;
        assert_eq!(
            reads.register(Arc::clone(&region), None),
            RegionKey(u64::MAX)
        );
        let key = reads.register(Arc::clone(&region), None);
        assert_eq!(key, RegionKey(1), "0 is skipped");
        let status = |reply: Reply| match reply {
            Reply::Bytes(header, bytes) => (header.status, bytes.bytes().len()),
            Reply::Refusal(header) => (header.status, 0),
        };
        assert_eq!(
            status(reads.serve(&request(1, key, base, 100), 1000)),
            (0, 100)
        );
        assert_eq!(
            status(reads.serve(&request(1, key, base + 99, 1), 1000)),
            (0, 1)
        );
        let no_region = read::STATUS_NO_REGION;
        for (addr, len) in [(base + 99, 2), (base - 1, 1), (base + 1, u64::MAX), (0, 1)] {
            let reply = reads.serve(&request(1, key, addr, len), usize::MAX);
            assert_eq!(status(reply), (no_region, 0), "{addr:#x} {len}");
        }
        let too_long = reads.serve(&request(1, key, base, 100), 99);
        assert_eq!(status(too_long), (read::STATUS_TOO_LONG, 0));
        let other = reads.serve(&request(1, RegionKey(key.0.wrapping_add(1)), base, 1), 99);
        assert_eq!(status(other), (no_region, 0));
        assert_eq!(reads.deregister(key), Some(None));
        assert_eq!(reads.deregister(key), None, "once");
        assert_eq!(
            status(reads.serve(&request(1, key, base, 1), 99)),
            (no_region, 0)
        );
    }
}
