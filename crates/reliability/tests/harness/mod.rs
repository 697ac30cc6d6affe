//! A deterministic network of reliability states (one per process) on virtual time.
//!
//! Each node runs one `Reliability<u64, u64>`: fragments are message ids
//! (the node keeps the bytes), receive buffers are ids of datagrams the node
//! holds. Links between nodes apply seeded faults: loss, duplication,
//! reordering by extra delay, bit corruption (caught by a checksum, as the
//! BTL does on fabrics without one), and scripted outages.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use udbtl_reliability::{Config, Event, Instant, LossReason, PeerId, Receipt, Reliability, Room};
use udbtl_wire::rel;

/// Faults of one directed link.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    /// Extra delay of a reordered datagram.
    pub reorder_delay: Duration,
    pub corrupt: f64,
    /// Drop everything sent in [from, to).
    pub outage: Option<(Duration, Duration)>,
    /// Drop acknowledgement-only datagrams.
    pub drop_acks: bool,
    /// Drop the first `n` data datagrams carrying sequence number `seq`:
    /// `(seq, n)`; the count goes down as they are dropped.
    pub drop_seq: Option<(u32, u32)>,
}

#[derive(Debug, Clone)]
struct Datagram {
    from: usize,
    to: usize,
    header: rel::Repr,
    payload: Vec<u8>,
    checksum: u64,
}

fn checksum(header: &rel::Repr, payload: &[u8]) -> u64 {
    let mut bytes = [0u8; rel::HEADER_LEN];
    header.emit(&mut rel::Packet::new_unchecked(&mut bytes[..]));
    bytes
        .iter()
        .chain(payload)
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
}

pub struct Node {
    pub rel: Reliability<u64, u64>,
    /// Peer id on this node → node index, and back.
    pub peer_node: Vec<usize>,
    pub node_peer: HashMap<usize, PeerId>,
    /// Bytes of every message this node sent, by id.
    pub outbox: HashMap<u64, Vec<u8>>,
    next_msg: u64,
    /// Received datagrams held while buffered.
    held: HashMap<u64, Vec<u8>>,
    next_buf: u64,
    /// Delivered payloads, per source node, in delivery order.
    pub delivered: BTreeMap<usize, Vec<Vec<u8>>>,
    pub acked: Vec<u64>,
    pub failed: Vec<u64>,
    pub lost_peers: Vec<(usize, Instant)>,
    /// Why each of `lost_peers` was lost.
    pub loss_reasons: Vec<LossReason>,
    pub bad_checksums: u64,
    /// The room this node gives every received datagram.
    pub room: Room,
    /// Until then the node does not run (descheduled): what arrives for it
    /// waits, and its timers fire only once it runs again.
    pub asleep_until: Instant,
}

/// A datagram as it was handed to the network (before any fault).
#[derive(Debug, Clone)]
pub struct Sent {
    pub at: Instant,
    pub from: usize,
    pub to: usize,
    pub header: rel::Repr,
    pub data: bool,
}

pub struct Net {
    pub now: Instant,
    pub nodes: Vec<Node>,
    links: HashMap<(usize, usize), Faults>,
    /// Links with a bottleneck: the time one datagram takes to leave, and
    /// when the link is free again.
    bottlenecks: HashMap<(usize, usize), (Duration, Instant)>,
    pub latency: Duration,
    in_flight: BTreeMap<(Instant, u64), Datagram>,
    counter: u64,
    rng: fastrand::Rng,
    pub datagrams_sent: u64,
    /// Every datagram sent, when `record` is set.
    pub record: bool,
    pub log: Vec<Sent>,
}

impl Net {
    /// `n` nodes, fully connected, with `config` everywhere.
    pub fn new(n: usize, config: &Config, seed: u64) -> Self {
        let nodes = (0..n)
            .map(|me| {
                let mut rel = Reliability::new(config.clone()).unwrap();
                let mut peer_node = Vec::new();
                let mut node_peer = HashMap::new();
                for other in (0..n).filter(|o| *o != me) {
                    let id = rel.add_peer();
                    peer_node.push(other);
                    node_peer.insert(other, id);
                }
                Node {
                    rel,
                    peer_node,
                    node_peer,
                    outbox: HashMap::new(),
                    next_msg: 0,
                    held: HashMap::new(),
                    next_buf: 0,
                    delivered: BTreeMap::new(),
                    acked: Vec::new(),
                    failed: Vec::new(),
                    lost_peers: Vec::new(),
                    loss_reasons: Vec::new(),
                    bad_checksums: 0,
                    room: Room::ALL,
                    asleep_until: Instant::ZERO,
                }
            })
            .collect();
        Self {
            now: Instant::ZERO,
            nodes,
            links: HashMap::new(),
            bottlenecks: HashMap::new(),
            latency: Duration::from_micros(5),
            in_flight: BTreeMap::new(),
            counter: 0,
            rng: fastrand::Rng::with_seed(seed),
            datagrams_sent: 0,
            record: false,
            log: Vec::new(),
        }
    }

    pub fn set_faults(&mut self, from: usize, to: usize, faults: Faults) {
        self.links.insert((from, to), faults);
    }

    /// Gives the link `from` → `to` a bottleneck that sends one datagram
    /// every `per_datagram`, whatever its size, behind an unbounded FIFO
    /// queue. Faults apply after the queue, so a lost datagram used the link.
    pub fn set_bottleneck(&mut self, from: usize, to: usize, per_datagram: Duration) {
        self.bottlenecks
            .insert((from, to), (per_datagram, Instant::ZERO));
    }

    /// Queues `payload` from `from` to `to`.
    pub fn send(&mut self, from: usize, to: usize, payload: Vec<u8>) {
        let node = &mut self.nodes[from];
        let id = node.next_msg;
        node.next_msg += 1;
        node.outbox.insert(id, payload);
        let peer = node.node_peer[&to];
        node.rel.send(self.now, peer, id).unwrap();
        self.flush(from);
    }

    /// Puts everything node `i` wants to transmit on the wire.
    fn flush(&mut self, i: usize) {
        while let Some(tx) = self.nodes[i].rel.poll_transmit(self.now) {
            let to = self.nodes[i].peer_node[tx.peer.0 as usize];
            let payload = tx
                .frag
                .map(|id| self.nodes[i].outbox[&id].clone())
                .unwrap_or_default();
            let datagram = Datagram {
                from: i,
                to,
                checksum: checksum(&tx.header, &payload),
                header: tx.header,
                payload,
            };
            self.transmit(datagram);
        }
        let node = &mut self.nodes[i];
        while let Some(event) = node.rel.poll_event() {
            match event {
                Event::Acked { frag, .. } => node.acked.push(frag),
                Event::Failed { frag, .. } => node.failed.push(frag),
                Event::PeerLost { peer, reason } => {
                    node.lost_peers
                        .push((node.peer_node[peer.0 as usize], self.now));
                    node.loss_reasons.push(reason);
                }
                Event::PeerClosed { .. } => {}
            }
        }
    }

    fn transmit(&mut self, mut datagram: Datagram) {
        self.datagrams_sent += 1;
        if self.record {
            self.log.push(Sent {
                at: self.now,
                from: datagram.from,
                to: datagram.to,
                header: datagram.header,
                data: !datagram.header.has(rel::FLAG_ACK_ONLY),
            });
        }
        let faults = self
            .links
            .get(&(datagram.from, datagram.to))
            .cloned()
            .unwrap_or_default();
        let mut departure = self.now;
        if let Some((per_datagram, free_at)) =
            self.bottlenecks.get_mut(&(datagram.from, datagram.to))
        {
            departure = departure.max(*free_at) + *per_datagram;
            *free_at = departure;
        }
        let since_start = self.now - Instant::ZERO;
        if faults
            .outage
            .is_some_and(|(from, to)| from <= since_start && since_start < to)
        {
            return;
        }
        if faults.drop_acks && datagram.header.has(rel::FLAG_ACK_ONLY) {
            return;
        }
        if let Some((seq, left)) = faults.drop_seq {
            if left > 0 && !datagram.header.has(rel::FLAG_ACK_ONLY) && datagram.header.seq.0 == seq
            {
                if let Some(link) = self.links.get_mut(&(datagram.from, datagram.to)) {
                    link.drop_seq = Some((seq, left - 1));
                }
                return;
            }
        }
        if self.rng.f64() < faults.loss {
            return;
        }
        if self.rng.f64() < faults.corrupt {
            // Flip one bit of the payload or the header's fields.
            if datagram.payload.is_empty() || self.rng.bool() {
                datagram.header.seq += 1 << self.rng.u32(0..31);
            } else {
                let at = self.rng.usize(0..datagram.payload.len());
                datagram.payload[at] ^= 1 << self.rng.u32(0..8);
            }
        }
        let mut arrival = departure + self.latency;
        if self.rng.f64() < faults.reorder {
            arrival = arrival + faults.reorder_delay.mul_f64(self.rng.f64() + 0.5);
        }
        let copies = if self.rng.f64() < faults.duplicate {
            2
        } else {
            1
        };
        for copy in 0..copies {
            self.counter += 1;
            self.in_flight.insert(
                (arrival + Duration::from_nanos(copy), self.counter),
                datagram.clone(),
            );
        }
    }

    fn receive(&mut self, datagram: Datagram) {
        let now = self.now;
        let node = &mut self.nodes[datagram.to];
        if checksum(&datagram.header, &datagram.payload) != datagram.checksum {
            node.bad_checksums += 1;
            return;
        }
        let peer = node.node_peer[&datagram.from];
        let buf = node.next_buf;
        node.next_buf += 1;
        node.held.insert(buf, datagram.payload);
        match node
            .rel
            .on_datagram(now, peer, &datagram.header, buf, node.room)
        {
            Receipt::Deliver(buf) => {
                let bytes = node.held.remove(&buf).unwrap();
                node.delivered.entry(datagram.from).or_default().push(bytes);
                while let Some((peer, buf)) = node.rel.poll_deliver() {
                    let bytes = node.held.remove(&buf).unwrap();
                    let from = node.peer_node[peer.0 as usize];
                    node.delivered.entry(from).or_default().push(bytes);
                }
            }
            Receipt::Buffered => {}
            Receipt::Discard(buf, _) => {
                node.held.remove(&buf);
            }
        }
        while let Some(buf) = node.rel.poll_reclaim() {
            node.held.remove(&buf);
        }
        self.flush(datagram.to);
    }

    /// Runs until nothing is in flight and no timer is armed, or `limit`.
    pub fn run_until_idle(&mut self, limit: Duration) {
        self.run_while(limit, |_| true);
    }

    /// Runs while `keep_going` says so, nothing is left to do, or `limit`.
    pub fn run_while(&mut self, limit: Duration, mut keep_going: impl FnMut(&Self) -> bool) {
        let end = Instant::ZERO + limit;
        loop {
            if !keep_going(self) {
                return;
            }
            let next_arrival = self.in_flight.keys().next().map(|(at, _)| *at);
            let next_timer = self
                .nodes
                .iter_mut()
                .filter_map(|n| n.rel.poll_timeout().map(|at| at.max(n.asleep_until)))
                .min();
            let Some(next) = [next_arrival, next_timer].into_iter().flatten().min() else {
                return;
            };
            if next > end {
                self.now = end;
                return;
            }
            self.now = self.now.max(next);
            while let Some(entry) = self.in_flight.first_entry() {
                if entry.key().0 > self.now {
                    break;
                }
                let datagram = entry.remove();
                let wakes = self.nodes[datagram.to].asleep_until;
                if wakes > self.now {
                    // Read when the node runs again, in arrival order.
                    self.counter += 1;
                    self.in_flight.insert((wakes, self.counter), datagram);
                    continue;
                }
                self.receive(datagram);
            }
            for i in 0..self.nodes.len() {
                if self.nodes[i].asleep_until > self.now {
                    continue;
                }
                self.nodes[i].rel.handle_timeout(self.now);
                self.flush(i);
            }
        }
    }

    /// Deschedules node `node` for `span` from now, as a process on a
    /// shared CPU is for a time slice.
    pub fn sleep(&mut self, node: usize, span: Duration) {
        self.nodes[node].asleep_until = self.now + span;
    }

    /// Advances the clock without events (for scripted pauses).
    pub fn advance(&mut self, by: Duration) {
        let end = self.now + by;
        self.run_while(end - Instant::ZERO, |_| true);
        self.now = self.now.max(end);
    }
}

/// A payload that names its message, so order and integrity can be checked.
pub fn payload(from: usize, index: u64, len: usize) -> Vec<u8> {
    let mut bytes = index.to_be_bytes().to_vec();
    bytes.extend(
        (0..len).map(|i| (i as u64).wrapping_mul(index + 1).wrapping_add(from as u64) as u8),
    );
    bytes
}
