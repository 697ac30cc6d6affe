//! Remote reads (`Module::read`): a peer's registered region copied into
//! the reader's memory, refusals that end a read instead of hanging it,
//! and a lost peer that fails its reads.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use udbtl_btl::*;
use udbtl_fabric::Provider;

use super::{Make, Peer, finalize_clean, pair, payload, progress_until, reliable};

/// A region of `Arc`'d bytes.
struct Bytes(Arc<[u8]>);

impl LentBytes for Bytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A read's destination, which hands its bytes to the test when the module
/// drops it (at the read's end), with the read's offset.
struct Target {
    offset: usize,
    bytes: Vec<u8>,
    out: Sender<(usize, Vec<u8>)>,
}

impl ReadTarget for Target {
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self
            .out
            .send((self.offset, std::mem::take(&mut self.bytes)));
    }
}

type Events = Arc<Mutex<Vec<ReadEvent>>>;

/// The contexts of reads meant to be refused start here; the others are
/// offsets into the region.
const REFUSED: u64 = 1 << 40;

fn read_events<P: Provider>(btl: &mut Component<P>) -> Events {
    let events: Events = Arc::default();
    let sink = events.clone();
    btl.modules_mut()[0].set_read_callback(Box::new(move |ev: &ReadEvent| {
        sink.lock().unwrap().push(ev.clone());
    }));
    events
}

fn target(offset: usize, len: usize, out: &Sender<(usize, Vec<u8>)>) -> Box<Target> {
    Box::new(Target {
        offset,
        // Not zeros: a byte the reply skipped cannot pass for a zero.
        bytes: vec![0xee; len],
        out: out.clone(),
    })
}

/// Reads a 300 KiB region of a peer's in pieces of every awkward size (one
/// byte, a datagram and one byte, the read limit) and puts it back
/// together: every byte arrives, in place, once; each read completes
/// exactly once. Reads outside the region, of a key never registered, of a
/// deregistered region, or from an unknown endpoint end refused or are
/// refused at once; one longer than the read limit is refused at once.
pub(crate) fn remote_reads_copy_a_peers_region<P: Provider>(make: Make<'_, P>)
where
    Component<P>: Send + 'static,
{
    let (mut a, b, ab, _) = pair(make, reliable());
    let events = read_events(&mut a);
    let region: Arc<[u8]> = payload(9, 300 << 10).into();
    let base = region.as_ptr() as u64;
    let key = b.modules()[0].register_region(Arc::new(Bytes(region.clone())));
    let gone = b.modules()[0].register_region(Arc::new(Bytes(region.clone())));
    assert!(b.modules()[0].deregister_region(gone));
    assert!(!b.modules()[0].deregister_region(gone), "deregistered once");
    let peer = Peer::spawn(b, &[]);

    let limits = a.modules()[0].limits();
    let limit = limits.read_limit();
    assert!(limit + 64 >= limits.frag_limit, "{limits:?}");
    let (out, arrived): (_, Receiver<(usize, Vec<u8>)>) = channel();
    let mut pieces = Vec::new();
    let mut at = 0;
    for len in [1, (limits.eager_limit + 1).min(limit), limit]
        .into_iter()
        .cycle()
    {
        if at == region.len() {
            break;
        }
        let len = len.min(region.len() - at);
        pieces.push((at, len));
        at += len;
    }
    for &(offset, len) in &pieces {
        let from = RemoteRange {
            key,
            addr: base + offset as u64,
        };
        module_read(&mut a, ab, target(offset, len, &out), from, offset as u64);
    }
    let refused = [
        (
            RemoteRange {
                key,
                addr: base + region.len() as u64 - 10,
            },
            11,
            "past the end",
        ),
        (
            RemoteRange {
                key,
                addr: base - 1,
            },
            2,
            "before the start",
        ),
        (
            RemoteRange {
                key: RegionKey(key.0 ^ 0x5555),
                addr: base,
            },
            8,
            "a key never drawn",
        ),
        (
            RemoteRange {
                key: gone,
                addr: base,
            },
            8,
            "a deregistered region",
        ),
    ];
    for (i, (from, len, _)) in refused.iter().enumerate() {
        module_read(
            &mut a,
            ab,
            target(usize::MAX, *len, &out),
            *from,
            REFUSED + i as u64,
        );
    }
    let too_long = a.modules()[0].read(
        ab,
        target(usize::MAX, limit + 1, &out),
        RemoteRange { key, addr: base },
        0,
    );
    assert!(
        matches!(too_long, Err(BtlError::BadRead(_))),
        "{too_long:?}"
    );
    let unknown = a.modules()[0].read(
        EndpointId::from_raw(77),
        target(usize::MAX, 8, &out),
        RemoteRange { key, addr: base },
        0,
    );
    assert!(
        matches!(unknown, Err(BtlError::BadEndpoint { .. })),
        "{unknown:?}"
    );

    let expected = pieces.len() + refused.len();
    let finished = progress_until(&mut a, |_| events.lock().unwrap().len() >= expected);
    let b = peer.join();
    assert!(
        finished,
        "{} of {expected} reads ended",
        events.lock().unwrap().len()
    );
    let events = events.lock().unwrap();
    assert_eq!(events.len(), expected, "each read ends once: {events:?}");
    for ev in events.iter() {
        assert_eq!(ev.endpoint, ab);
        if ev.context >= REFUSED {
            let why = refused[(ev.context - REFUSED) as usize].2;
            assert!(
                matches!(ev.status, Err(ReadFailure::Refused { .. })),
                "{why}: {ev:?}"
            );
        } else {
            assert_eq!(ev.status, Ok(()), "{ev:?}");
        }
    }
    let mut copy = vec![0u8; region.len()];
    let mut filled = 0;
    for (offset, bytes) in arrived
        .try_iter()
        .filter(|(offset, _)| *offset != usize::MAX)
    {
        copy[offset..offset + bytes.len()].copy_from_slice(&bytes);
        filled += bytes.len();
    }
    assert_eq!(filled, region.len(), "each byte once");
    assert!(copy[..] == region[..], "the region arrived intact");
    let stats = a.modules()[0].stats();
    assert_eq!(stats.reads_started, expected as u64);
    let served = b.modules()[0].stats();
    assert_eq!(served.reads_served, pieces.len() as u64);
    assert_eq!(served.reads_refused, refused.len() as u64);
    assert_eq!(
        b.modules()[0].rcache_stats().misses,
        1,
        "the region was registered once, whole; every reply found it"
    );
    assert!(b.modules()[0].deregister_region(key));
    finalize_clean(a);
    finalize_clean(b);
}

/// Starts a read, progressing while no fragment is free for its request.
fn module_read<P: Provider>(
    a: &mut Component<P>,
    endpoint: EndpointId,
    target: Box<Target>,
    from: RemoteRange,
    context: u64,
) {
    let mut target = Some(target);
    let ok = progress_until(a, |a| match target.take() {
        Some(t) => a.modules()[0].read(endpoint, t, from, context).is_ok(),
        None => true,
    });
    assert!(ok, "a read never started");
}

/// A read from a peer that is deleted before it answers fails, once, with
/// the peer; nothing is written.
pub(crate) fn reads_of_a_deleted_peer_fail<P: Provider>(make: Make<'_, P>) {
    let (mut a, b, ab, _) = pair(make, reliable());
    let events = read_events(&mut a);
    let (out, arrived) = channel();
    // Nobody progresses `b`: the request is never answered.
    a.modules()[0]
        .read(
            ab,
            target(5, 64, &out),
            RemoteRange {
                key: RegionKey(1),
                addr: 4096,
            },
            42,
        )
        .unwrap();
    a.progress();
    a.modules_mut()[0].del_procs(&[ab]).unwrap();
    let ended = progress_until(&mut a, |_| !events.lock().unwrap().is_empty());
    assert!(ended, "the read never ended");
    a.progress();
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].context, 42);
    assert_eq!(events[0].status, Err(ReadFailure::PeerLost));
    let (_, bytes) = arrived.try_recv().expect("the target was given back");
    assert!(bytes.iter().all(|&b| b == 0xee), "nothing was written");
    drop(events);
    finalize_clean(a);
    finalize_clean(b);
}
