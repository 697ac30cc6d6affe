//! Remote reads (`Module::read`) on the seeded `sim` fabric, whose
//! datagrams are small (2 KiB), so that each reply is a train of many:
//! every byte of a peer's region arrives, in place, once, through loss,
//! duplication, reordering and corruption, and every read ends exactly
//! once; a read whose peer is lost mid-reply fails, once.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Btl, Role, Stop, drive, drive_roles, mesh, node};

use udbtl_btl::*;
use udbtl_fabric::sim::{LinkConfig, SimNetwork};

struct Bytes(Arc<[u8]>);

impl LentBytes for Bytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A destination that hands its bytes back, with its offset, when the
/// module drops it (at the read's end).
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

fn region(len: usize) -> Arc<[u8]> {
    (0..len).map(|i| (i * 13 + i / 509) as u8).collect()
}

fn read_events(btl: &mut Btl) -> Arc<Mutex<Vec<ReadEvent>>> {
    let events: Arc<Mutex<Vec<ReadEvent>>> = Arc::default();
    let sink = events.clone();
    btl.modules_mut()[0].set_read_callback(Box::new(move |ev: &ReadEvent| {
        sink.lock().unwrap().push(ev.clone());
    }));
    events
}

fn config() -> BtlConfig {
    BtlConfig {
        rd_num: Some(512),
        ..BtlConfig::default()
    }
}

#[test]
fn reads_arrive_whole_through_loss_duplication_reordering_and_corruption() {
    reads_arrive_whole(config());
}

/// The same with the replies copied into the targets by streaming stores.
#[test]
fn streamed_reads_arrive_whole_through_loss_duplication_reordering_and_corruption() {
    reads_arrive_whole(BtlConfig {
        read_copy: Some("streaming".into()),
        ..config()
    });
}

fn reads_arrive_whole(config: BtlConfig) {
    let net = SimNetwork::new(27);
    net.set_default_link(LinkConfig {
        loss: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
        reorder_delay: (Duration::from_micros(5), Duration::from_micros(200)),
        corrupt: 0.05,
        latency: Duration::from_micros(2),
        ..LinkConfig::default()
    })
    .unwrap();
    let mut nodes = vec![node(&net, "a", &config), node(&net, "b", &config)];
    let eps = mesh(&mut nodes);
    let ab = eps[0][1].unwrap();
    let events = read_events(&mut nodes[0]);
    let data = region(1 << 20);
    let base = data.as_ptr() as u64;
    let key = nodes[1].modules()[0].register_region(Arc::new(Bytes(data.clone())));
    let limit = nodes[0].modules()[0].limits().read_limit();
    assert!(
        limit > 4 * nodes[0].modules()[0].limits().eager_limit,
        "replies are trains"
    );

    let (out, arrived) = channel();
    let mut at = 0;
    let mut reads = 0;
    for len in [limit, 1, 3000, limit - 1].into_iter().cycle() {
        if at == data.len() {
            break;
        }
        let len = len.min(data.len() - at);
        let target = Box::new(Target {
            offset: at,
            bytes: vec![0xee; len],
            out: out.clone(),
        });
        let from = RemoteRange {
            key,
            addr: base + at as u64,
        };
        nodes[0].modules()[0]
            .read(ab, target, from, at as u64)
            .unwrap();
        at += len;
        reads += 1;
    }
    let stop = drive(&net, &mut nodes, Duration::from_secs(60), |_| {
        events.lock().unwrap().len() >= reads
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    // Late duplicates change nothing.
    drive(&net, &mut nodes, Duration::from_millis(50), |_| false);
    let events = events.lock().unwrap();
    assert_eq!(events.len(), reads, "each read ends once");
    assert!(events.iter().all(|ev| ev.status.is_ok()), "{events:?}");
    let mut copy = vec![0u8; data.len()];
    let mut filled = 0;
    for (offset, bytes) in arrived.try_iter() {
        copy[offset..offset + bytes.len()].copy_from_slice(&bytes);
        filled += bytes.len();
    }
    assert_eq!(filled, data.len(), "each byte once");
    assert!(copy[..] == data[..], "the region arrived intact");
    let r = nodes[0].modules()[0].reliability_stats().unwrap();
    let rb = nodes[1].modules()[0].reliability_stats().unwrap();
    assert!(rb.retransmitted > 0, "losses were repaired: {rb:?}");
    assert!(
        nodes[0].modules()[0].stats().recv_bad_checksum > 0,
        "corruption was caught: {r:?}"
    );
    assert_eq!(nodes[1].modules()[0].stats().reads_served, reads as u64);
}

#[test]
fn a_read_whose_peer_is_lost_mid_reply_fails_once() {
    let net = SimNetwork::new(5);
    let mut nodes = vec![node(&net, "a", &config()), node(&net, "b", &config())];
    let eps = mesh(&mut nodes);
    let ab = eps[0][1].unwrap();
    let events = read_events(&mut nodes[0]);
    let data = region(256 << 10);
    let key = nodes[1].modules()[0].register_region(Arc::new(Bytes(data.clone())));
    let limit = nodes[0].modules()[0].limits().read_limit();
    let (out, _arrived) = channel();
    let target = Box::new(Target {
        offset: 0,
        bytes: vec![0; limit],
        out,
    });
    let from = RemoteRange {
        key,
        addr: data.as_ptr() as u64,
    };
    nodes[0].modules()[0].read(ab, target, from, 7).unwrap();
    // b serves the request, its reply leaves, and the link dies under it;
    // b stops too, and a waits out its loss.
    let stop = drive(&net, &mut nodes, Duration::from_secs(1), |nodes| {
        nodes[1].modules()[0].stats().reads_served == 1
    });
    assert_eq!(stop, Stop::Done);
    assert!(
        events.lock().unwrap().is_empty(),
        "the reply is not complete yet"
    );
    net.set_default_link(LinkConfig {
        loss: 1.0,
        ..LinkConfig::default()
    })
    .unwrap();
    let stop = drive_roles(
        &net,
        &mut nodes,
        &[Role::Active, Role::Dead],
        Duration::from_secs(120),
        |_| !events.lock().unwrap().is_empty(),
    );
    assert_eq!(stop, Stop::Done, "the read never ended");
    drive(&net, &mut nodes, Duration::from_millis(10), |_| false);
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].context, 7);
    assert_eq!(events[0].status, Err(ReadFailure::PeerLost));
}
