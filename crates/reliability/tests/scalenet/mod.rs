//! A network of reliability states at scale, on virtual time: only the
//! pairs that talk are connected (plus, on chosen nodes, idle peers that
//! never send, as a job's full address exchange leaves them), so thousands
//! of peers fit.
//!
//! Each node has a receive pool of `pool` buffers behind an ingress link
//! that takes one datagram per `per_datagram`: a datagram waits in the pool
//! until the link has carried it, then the node's state handles it; one
//! that arrives at a full pool is dropped (`dropped_no_buffer`), as a NIC
//! or a socket drops it. Datagrams held early keep their buffers. Every
//! node also sends through an egress link of the same rate, behind a send
//! ring of [`SEND_RING`] datagrams: a node takes its next datagram from its
//! state only when the ring has room, as a NIC takes work requests, so a
//! datagram's timers start when it leaves, not while it waits behind a
//! thousand others. The
//! application takes every delivery at once, checking that each pair's
//! messages arrive once and in order.
//!
//! The credit each node advertises is decided as the BTL decides it:
//! [`CreditPolicy::Shared`] (`Reliability::share_credit` over the free
//! buffers), or [`CreditPolicy::Even`], the free buffers split evenly over
//! every peer with a floor of 1 (before receiver-driven credit).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use udbtl_reliability::{Config, Event, Instant, PeerId, Receipt, Reliability, Room};
use udbtl_wire::rel;

/// Datagrams a node's egress link queues (the BTL's default `sd_num`).
pub const SEND_RING: u32 = 128;

/// Link time of an acknowledgement-only datagram against a data datagram:
/// 80 bytes (headers) of 1 500.
pub const ACK_SHARE: f64 = 80.0 / 1500.0;

/// Link time of a datagram with `header` on a link taking `per_datagram`
/// per data datagram.
fn link_time(per_datagram: Duration, header: &rel::Repr) -> Duration {
    if header.has(rel::FLAG_ACK_ONLY) {
        per_datagram.mul_f64(ACK_SHARE)
    } else {
        per_datagram
    }
}

/// How a node's credit is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditPolicy {
    /// By need (`share_credit`).
    Shared,
    /// Evenly over every peer, at least 1.
    Even,
}

/// The network's shape and settings.
#[derive(Debug, Clone)]
pub struct Setup {
    pub nodes: usize,
    pub config: Config,
    pub policy: CreditPolicy,
    /// Receive buffers per node, and how many of them no credit promises.
    pub pool: usize,
    pub reserve: usize,
    /// One-way propagation delay.
    pub latency: Duration,
    /// Time a data datagram takes on a link; an acknowledgement-only one
    /// takes [`ACK_SHARE`] of it (its bytes against a 1 500-byte datagram's).
    pub per_datagram: Duration,
    /// Probability that a datagram is lost on the way.
    pub loss: f64,
    pub seed: u64,
}

impl Setup {
    /// `nodes` nodes with the BTL's defaults at MTU 1500 (window 740, 6 000
    /// buffers of which 256 reserved), 10 µs apart, on 1.2 µs-per-datagram
    /// links (1 500 bytes at 10 Gb/s), without loss.
    pub fn new(nodes: usize, policy: CreditPolicy) -> Self {
        Self {
            nodes,
            config: Config {
                window: 740,
                rto_min: Duration::from_millis(5),
                rto_initial: Duration::from_millis(20),
                ..Config::default()
            },
            policy,
            pool: 6_000,
            reserve: 256,
            latency: Duration::from_micros(10),
            per_datagram: Duration::from_nanos(1_200),
            loss: 0.0,
            seed: 1,
        }
    }
}

struct Node {
    rel: Reliability<u64, u64>,
    peer_of: HashMap<usize, PeerId>,
    /// Peer id → node (`usize::MAX` for an idle peer that is no node).
    node_of: Vec<usize>,
    /// Buffers taken: waiting for the ingress link, or held early.
    waiting: usize,
    early: usize,
    ingress_free_at: Instant,
    egress_free_at: Instant,
    /// The timer event queued for this node, if any.
    timer_at: Option<Instant>,
    /// The send-room event queued for this node, if any.
    send_room_at: Option<Instant>,
    /// Messages sent to each node so far, and the next expected from each.
    next_to: HashMap<usize, u64>,
    next_from: HashMap<usize, u64>,
    /// When the last message from each node was delivered.
    last_delivery: HashMap<usize, Instant>,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    /// A datagram reaches `to`'s pool.
    Arrive {
        from: usize,
        to: usize,
        header: rel::Repr,
        msg: Option<u64>,
    },
    /// The ingress link has carried it: `to`'s state handles it.
    Handle {
        from: usize,
        to: usize,
        header: rel::Repr,
        msg: Option<u64>,
    },
    /// A node's timer.
    Timer(usize),
    /// A node's send ring has room again.
    SendRoom(usize),
}

struct Scheduled {
    at: Instant,
    order: u64,
    action: Action,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Earliest first (the heap is a max-heap).
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// What happened, for the assertions.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub data_sent: u64,
    pub delivered: u64,
    pub dropped_no_buffer: u64,
    pub dropped_on_the_way: u64,
    pub timeouts: u64,
    pub probes: u64,
    pub peers_lost: u64,
    /// Virtual time when everything sent was delivered and acknowledged.
    pub finished: Duration,
}

pub struct ScaleNet {
    pub setup: Setup,
    now: Instant,
    nodes: Vec<Node>,
    queue: BinaryHeap<Scheduled>,
    order: u64,
    rng: fastrand::Rng,
    outcome: Outcome,
}

impl ScaleNet {
    pub fn new(setup: Setup) -> Self {
        let nodes = (0..setup.nodes)
            .map(|_| Node {
                rel: Reliability::new(setup.config.clone()).unwrap(),
                peer_of: HashMap::new(),
                node_of: Vec::new(),
                waiting: 0,
                early: 0,
                ingress_free_at: Instant::ZERO,
                egress_free_at: Instant::ZERO,
                timer_at: None,
                send_room_at: None,
                next_to: HashMap::new(),
                next_from: HashMap::new(),
                last_delivery: HashMap::new(),
            })
            .collect();
        let rng = fastrand::Rng::with_seed(setup.seed);
        Self {
            setup,
            now: Instant::ZERO,
            nodes,
            queue: BinaryHeap::new(),
            order: 0,
            rng,
            outcome: Outcome::default(),
        }
    }

    /// Connects `a` and `b` (both ways).
    pub fn connect(&mut self, a: usize, b: usize) {
        for (me, other) in [(a, b), (b, a)] {
            let node = &mut self.nodes[me];
            if node.peer_of.contains_key(&other) {
                continue;
            }
            let id = node.rel.add_peer();
            node.peer_of.insert(other, id);
            node.node_of.push(other);
        }
    }

    /// Gives node `at` `count` more peers that never send.
    pub fn add_idle_peers(&mut self, at: usize, count: usize) {
        let node = &mut self.nodes[at];
        node.rel.reserve_peers(count);
        for _ in 0..count {
            node.rel.add_peer();
            node.node_of.push(usize::MAX);
        }
    }

    /// Peers node `at` has.
    pub fn peers(&self, at: usize) -> usize {
        self.nodes[at].rel.peer_count()
    }

    /// Queues `count` one-datagram messages from `from` to `to` (connected).
    pub fn send(&mut self, from: usize, to: usize, count: u64) {
        let now = self.now;
        let node = &mut self.nodes[from];
        let peer = node.peer_of[&to];
        let next = node.next_to.entry(to).or_insert(0);
        for _ in 0..count {
            node.rel.send(now, peer, *next).unwrap();
            *next += 1;
        }
        self.outcome.data_sent += count;
    }

    fn schedule(&mut self, at: Instant, action: Action) {
        self.order += 1;
        self.queue.push(Scheduled {
            at,
            order: self.order,
            action,
        });
    }

    /// Tells node `i`'s state its credit, then sends what it has to send
    /// and queues its timer.
    fn settle(&mut self, i: usize) {
        let now = self.now;
        let setup = &self.setup;
        let node = &mut self.nodes[i];
        let free = setup.pool.saturating_sub(setup.reserve + node.early);
        match setup.policy {
            CreditPolicy::Shared => node.rel.share_credit(now, free, 1),
            CreditPolicy::Even => {
                let share = free / node.rel.peer_count().max(1);
                node.rel
                    .set_credit(u16::try_from(share).unwrap_or(u16::MAX).max(1));
            }
        }
        let mut sends = Vec::new();
        // The ring holds what leaves within `ring` from now.
        let ring = setup.per_datagram * SEND_RING;
        let mut ring_full = false;
        loop {
            let queued_until = node.egress_free_at.max(now);
            if queued_until >= now + ring {
                ring_full = true;
                break;
            }
            let Some(tx) = node.rel.poll_transmit(now) else {
                break;
            };
            node.egress_free_at = queued_until + link_time(setup.per_datagram, &tx.header);
            let to = node.node_of[tx.peer.0 as usize];
            sends.push((node.egress_free_at + setup.latency, to, tx.header, tx.frag));
        }
        let room_at = Instant::ZERO
            + ((node.egress_free_at - Instant::ZERO) + setup.per_datagram).saturating_sub(ring);
        while let Some(event) = node.rel.poll_event() {
            if matches!(event, Event::PeerLost { .. }) {
                self.outcome.peers_lost += 1;
            }
        }
        let timer = node
            .rel
            .poll_timeout()
            .filter(|t| node.timer_at != Some(*t));
        if timer.is_some() {
            node.timer_at = timer;
        }
        let send_room = (ring_full && node.send_room_at.is_none()).then_some(room_at);
        if send_room.is_some() {
            node.send_room_at = send_room;
        }
        if let Some(at) = timer {
            self.schedule(at, Action::Timer(i));
        }
        if let Some(at) = send_room {
            self.schedule(at, Action::SendRoom(i));
        }
        for (at, to, header, msg) in sends {
            if self.rng.f64() < self.setup.loss {
                self.outcome.dropped_on_the_way += 1;
                continue;
            }
            self.schedule(
                at,
                Action::Arrive {
                    from: i,
                    to,
                    header,
                    msg,
                },
            );
        }
    }

    fn arrive(&mut self, from: usize, to: usize, header: rel::Repr, msg: Option<u64>) {
        let per_datagram = self.setup.per_datagram;
        let node = &mut self.nodes[to];
        if node.waiting + node.early >= self.setup.pool {
            self.outcome.dropped_no_buffer += 1;
            return;
        }
        node.waiting += 1;
        node.ingress_free_at =
            node.ingress_free_at.max(self.now) + link_time(per_datagram, &header);
        let at = node.ingress_free_at;
        self.schedule(
            at,
            Action::Handle {
                from,
                to,
                header,
                msg,
            },
        );
    }

    fn handle(&mut self, from: usize, to: usize, header: rel::Repr, msg: Option<u64>) {
        let now = self.now;
        let node = &mut self.nodes[to];
        node.waiting -= 1;
        let peer = node.peer_of[&from];
        let buf = msg.unwrap_or(u64::MAX);
        let mut deliveries = Vec::new();
        match node.rel.on_datagram(now, peer, &header, buf, Room::ALL) {
            Receipt::Deliver(buf) => deliveries.push((peer, buf)),
            Receipt::Buffered => node.early += 1,
            Receipt::Discard(..) => {}
        }
        while let Some((peer, buf)) = node.rel.poll_deliver() {
            node.early -= 1;
            deliveries.push((peer, buf));
        }
        while node.rel.poll_reclaim().is_some() {
            node.early -= 1;
        }
        for (peer, buf) in deliveries {
            let source = node.node_of[peer.0 as usize];
            let next = node.next_from.entry(source).or_insert(0);
            assert_eq!(
                buf, *next,
                "node {to}: from {source}, out of order or twice"
            );
            *next += 1;
            node.last_delivery.insert(source, now);
            self.outcome.delivered += 1;
        }
        self.settle(to);
    }

    /// Runs until everything sent was delivered and acknowledged, or
    /// `limit` of virtual time passed; returns what happened.
    pub fn run(&mut self, limit: Duration) -> Outcome {
        for i in 0..self.nodes.len() {
            self.settle(i);
        }
        let end = Instant::ZERO + limit;
        while self.outcome.delivered < self.outcome.data_sent {
            let Some(next) = self.queue.pop() else {
                break;
            };
            if next.at > end {
                break;
            }
            self.now = self.now.max(next.at);
            match next.action {
                Action::Arrive {
                    from,
                    to,
                    header,
                    msg,
                } => self.arrive(from, to, header, msg),
                Action::Handle {
                    from,
                    to,
                    header,
                    msg,
                } => self.handle(from, to, header, msg),
                Action::SendRoom(i) => {
                    self.nodes[i].send_room_at = None;
                    self.settle(i);
                }
                Action::Timer(i) => {
                    if self.nodes[i].timer_at == Some(next.at) {
                        self.nodes[i].timer_at = None;
                        self.nodes[i].rel.handle_timeout(self.now);
                        self.settle(i);
                    }
                }
            }
        }
        let mut outcome = self.outcome.clone();
        outcome.finished = self.now - Instant::ZERO;
        for node in &self.nodes {
            outcome.timeouts += node.rel.stats().timeouts;
            outcome.probes += node.rel.stats().probes;
        }
        outcome
    }

    /// When node `at` got the last message from each of `sources`, since
    /// the start.
    pub fn last_deliveries(&self, at: usize, sources: &[usize]) -> Vec<Duration> {
        sources
            .iter()
            .map(|s| self.nodes[at].last_delivery[s] - Instant::ZERO)
            .collect()
    }
}

/// Jain's fairness index of `rates`: 1 when all are equal, 1/n when one
/// has everything.
pub fn jain(rates: &[f64]) -> f64 {
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|r| r * r).sum();
    sum * sum / (rates.len() as f64 * squares)
}
