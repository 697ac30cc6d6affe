//! The shared state of a simulated fabric: clock, ports, queue pair
//! registry, links and the datagrams in flight.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::link::LinkConfig;
use super::{SimDeviceSpec, SimProvider};
use crate::types::{PortState, QpAddr};
use crate::{FabricError, Result};

/// First queue pair number handed out. Low numbers are special in
/// InfiniBand (QP0 and QP1 are the management queue pairs), so the simulator
/// stays clear of them as hardware does.
const FIRST_QPN: u32 = 0x100;

/// Queue pair numbers are 24 bits on the wire in InfiniBand.
const MAX_QPN: u32 = 0x00ff_ffff;

/// Network-level datagram counters.
///
/// Every datagram handed to the network ([`sent`](Self::sent)) and every copy
/// the network made of one ([`duplicated`](Self::duplicated)) ends up in
/// exactly one place, so at any moment
///
/// `sent + duplicated == delivered + dropped() + in_flight`
///
/// where `in_flight` is [`SimNetwork::in_flight`]. "Delivered" means handed to
/// the destination queue pair; that queue pair may still drop it (no receive
/// posted, wrong queue key), which its context counts in
/// [`FabricStats`](crate::FabricStats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimNetStats {
    /// Datagrams handed to the network by `post_send`.
    pub sent: u64,
    /// Lost on the link.
    pub dropped_loss: u64,
    /// Extra copies made by the link.
    pub duplicated: u64,
    /// Datagrams given an extra reordering delay.
    pub reordered: u64,
    /// Datagrams with one bit of their payload flipped.
    pub corrupted: u64,
    /// Dropped: larger than the link MTU.
    pub dropped_mtu: u64,
    /// Dropped: sent during the link's blackout window.
    pub dropped_blackout: u64,
    /// Dropped: no such destination port or queue pair (or it was destroyed
    /// while the datagram was in flight).
    pub dropped_unknown_dest: u64,
    /// Dropped: the source or destination port was down when it was sent.
    pub dropped_port_down: u64,
    /// Handed to the destination queue pair.
    pub delivered: u64,
}

impl SimNetStats {
    /// Sum of every network-level drop.
    pub const fn dropped(&self) -> u64 {
        self.dropped_loss
            + self.dropped_mtu
            + self.dropped_blackout
            + self.dropped_unknown_dest
            + self.dropped_port_down
    }
}

/// A deterministic in-process fabric on virtual time.
///
/// The handle is cheap to clone; clones share one network. Nothing happens
/// on its own: time moves only through [`advance`](Self::advance) and
/// [`advance_to`](Self::advance_to), faults are drawn from one generator
/// seeded at [`new`](Self::new) in the order datagrams are sent, and a
/// datagram is delivered only while its destination context polls the
/// receive completion queue. Two runs that make the same calls in the same
/// order therefore see the same datagrams arrive in the same order.
#[derive(Clone)]
pub struct SimNetwork {
    state: Arc<Mutex<NetState>>,
}

impl SimNetwork {
    /// Creates an empty network whose clock reads zero.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(NetState {
                now: Duration::ZERO,
                rng: fastrand::Rng::with_seed(seed),
                next_seq: 0,
                next_qpn: FIRST_QPN,
                next_provider: 0,
                default_link: LinkConfig::default(),
                links: HashMap::new(),
                devices: Vec::new(),
                ports: Vec::new(),
                qps: BTreeMap::new(),
                stats: SimNetStats::default(),
                sends_held: false,
            })),
        }
    }

    /// A new provider (think: a host) on this network, owning no devices yet.
    pub fn provider(&self) -> SimProvider {
        let id = {
            let mut state = self.lock();
            let id = state.next_provider;
            state.next_provider += 1;
            id
        };
        SimProvider::new(self.clone(), id)
    }

    /// A new provider owning one device with `ports` ports and default
    /// attributes.
    ///
    /// # Errors
    /// As [`SimProvider::add_device`].
    pub fn add_device(&self, name: &str, ports: u8) -> Result<SimProvider> {
        let provider = self.provider();
        provider.add_device(SimDeviceSpec::new(name, ports))?;
        Ok(provider)
    }

    /// Virtual time since the network was created.
    pub fn now(&self) -> Duration {
        self.lock().now
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut state = self.lock();
        state.now = state.now.saturating_add(by);
    }

    /// Moves the clock to `to`. The clock never runs backwards, so a time in
    /// the past leaves it where it is.
    pub fn advance_to(&self, to: Duration) {
        let mut state = self.lock();
        state.now = state.now.max(to);
    }

    /// Arrival time of the earliest datagram in flight, so a test can jump
    /// the clock straight to it.
    pub fn next_arrival(&self) -> Option<Duration> {
        self.lock()
            .qps
            .values()
            .filter_map(|qp| qp.inbox.first_key_value().map(|(key, _)| key.arrival))
            .min()
    }

    /// Datagrams in flight: sent, not yet delivered, not dropped.
    pub fn in_flight(&self) -> usize {
        self.lock().qps.values().map(|qp| qp.inbox.len()).sum()
    }

    /// Sets the configuration of every link without one of its own.
    ///
    /// # Errors
    /// An invalid configuration ([`LinkConfig::validate`]).
    pub fn set_default_link(&self, config: LinkConfig) -> Result<()> {
        config.validate()?;
        self.lock().default_link = config;
        Ok(())
    }

    /// Sets the configuration of the directed link from port `src` to port
    /// `dst` (port ids, as in [`NodeAddr::Sim`](crate::NodeAddr::Sim)).
    ///
    /// # Errors
    /// An invalid configuration ([`LinkConfig::validate`]).
    pub fn set_link(&self, src: u32, dst: u32, config: LinkConfig) -> Result<()> {
        config.validate()?;
        self.lock().links.insert((src, dst), config);
        Ok(())
    }

    /// The configuration in force on the directed link from `src` to `dst`.
    pub fn link(&self, src: u32, dst: u32) -> LinkConfig {
        self.lock().link(src, dst)
    }

    /// Brings a port up or down. Datagrams sent from or to a port that is
    /// down are dropped and counted in
    /// [`SimNetStats::dropped_port_down`]; datagrams already in flight are
    /// not affected.
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] if no port has that id.
    pub fn set_port_state(&self, port: u32, port_state: PortState) -> Result<()> {
        let mut state = self.lock();
        let record = state.port_mut(port).ok_or_else(|| unknown_port(port))?;
        record.state = port_state;
        Ok(())
    }

    /// Holds or lets go what is posted to devices with late send reads
    /// ([`SimDeviceSpec::late_send_reads`]): while held, a send is checked
    /// when posted but its bytes are not read, it is not sent and it does
    /// not complete, as in an adapter's deep send queue; let go, each
    /// device reads and sends what it holds, in order, at its next post or
    /// poll. Devices that read at post time are not affected.
    pub fn hold_sends(&self, hold: bool) {
        self.lock().sends_held = hold;
    }

    /// The state of a port, or `None` if no port has that id.
    pub fn port_state(&self, port: u32) -> Option<PortState> {
        self.lock().port(port).map(|p| p.state)
    }

    /// Network-level counters.
    pub fn stats(&self) -> SimNetStats {
        self.lock().stats
    }

    /// Locks the shared state.
    ///
    /// A panic while the lock is held cannot leave the state half-updated in
    /// a way later calls would trip over (every update is a few field
    /// writes), so a poisoned lock is simply taken over.
    pub(crate) fn lock(&self) -> MutexGuard<'_, NetState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for SimNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("SimNetwork");
        // `try_lock`, so that formatting while the state is locked (say, in
        // a log line) cannot deadlock.
        match self.state.try_lock() {
            Ok(state) => out
                .field("now", &state.now)
                .field("devices", &state.devices.len())
                .field("ports", &state.ports.len())
                .field("qps", &state.qps.len())
                .field("stats", &state.stats),
            Err(_) => out.field("state", &"<locked>"),
        };
        out.finish_non_exhaustive()
    }
}

fn unknown_port(port: u32) -> FabricError {
    FabricError::InvalidArgument {
        what: "simulated port",
        detail: format!("no port has id {port}"),
    }
}

/// A device of the network.
#[derive(Debug)]
pub(crate) struct DeviceRecord {
    /// The provider that owns it.
    pub(crate) provider: u32,
    pub(crate) spec: SimDeviceSpec,
    /// Id of port 1; the device's ports have consecutive ids.
    pub(crate) first_port: u32,
}

impl DeviceRecord {
    /// Ids of the device's ports, in port order.
    pub(crate) fn port_ids(&self) -> Vec<u32> {
        (0..u32::from(self.spec.ports))
            .map(|i| self.first_port + i)
            .collect()
    }
}

#[derive(Debug)]
pub(crate) struct PortRecord {
    /// Index of the owning device in [`NetState::devices`].
    device: usize,
    state: PortState,
}

/// Orders the datagrams of an inbox: by arrival time, then by the order in
/// which the network accepted them, so ties stay first-in first-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ArrivalKey {
    arrival: Duration,
    seq: u64,
}

/// A datagram on the wire, with what the receiving HCA checks.
#[derive(Debug, Clone)]
pub(crate) struct Datagram {
    pub(crate) src: QpAddr,
    pub(crate) pkey: u16,
    pub(crate) qkey: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) payload: Vec<u8>,
}

/// A live queue pair, as the network sees it.
#[derive(Debug)]
struct QpRecord {
    /// Index of the owning device; datagrams must arrive on one of its ports.
    device: usize,
    /// Datagrams in flight to this queue pair.
    inbox: BTreeMap<ArrivalKey, Datagram>,
}

/// Everything the [`SimNetwork`] handle shares.
#[derive(Debug)]
pub(crate) struct NetState {
    now: Duration,
    rng: fastrand::Rng,
    next_seq: u64,
    next_qpn: u32,
    next_provider: u32,
    default_link: LinkConfig,
    links: HashMap<(u32, u32), LinkConfig>,
    pub(crate) devices: Vec<DeviceRecord>,
    /// Port `id` lives at index `id - 1`: ids start at 1 because LID 0 is
    /// reserved in InfiniBand.
    ports: Vec<PortRecord>,
    /// Live queue pairs by number. A `BTreeMap` so that nothing about the
    /// simulation depends on hash order.
    qps: BTreeMap<u32, QpRecord>,
    stats: SimNetStats,
    /// Whether devices with late send reads keep what is posted unread
    /// ([`SimNetwork::hold_sends`]).
    pub(crate) sends_held: bool,
}

impl NetState {
    fn link(&self, src: u32, dst: u32) -> LinkConfig {
        self.links
            .get(&(src, dst))
            .copied()
            .unwrap_or(self.default_link)
    }

    fn port(&self, id: u32) -> Option<&PortRecord> {
        self.ports.get(usize::try_from(id).ok()?.checked_sub(1)?)
    }

    fn port_mut(&mut self, id: u32) -> Option<&mut PortRecord> {
        self.ports
            .get_mut(usize::try_from(id).ok()?.checked_sub(1)?)
    }

    /// Adds a device owned by `provider` and numbers its ports.
    pub(crate) fn add_device(&mut self, provider: u32, spec: SimDeviceSpec) -> Result<Vec<u32>> {
        if spec.name.is_empty() {
            return Err(FabricError::InvalidArgument {
                what: "simulated device",
                detail: "the name is empty".into(),
            });
        }
        if spec.ports == 0 {
            return Err(FabricError::InvalidArgument {
                what: "simulated device",
                detail: format!("{} needs at least one port", spec.name),
            });
        }
        if spec.max_msg_size == 0 {
            return Err(FabricError::InvalidArgument {
                what: "simulated device",
                detail: format!("{} needs a nonzero max_msg_size", spec.name),
            });
        }
        if self
            .devices
            .iter()
            .any(|d| d.provider == provider && d.spec.name == spec.name)
        {
            return Err(FabricError::InvalidArgument {
                what: "simulated device",
                detail: format!("the provider already has a device named {}", spec.name),
            });
        }
        let first_port =
            u32::try_from(self.ports.len() + 1).map_err(|_| FabricError::ResourceExhausted {
                what: "simulated ports",
                limit: u32::MAX,
            })?;
        let device = self.devices.len();
        for _ in 0..spec.ports {
            self.ports.push(PortRecord {
                device,
                state: PortState::Active,
            });
        }
        let record = DeviceRecord {
            provider,
            spec,
            first_port,
        };
        let ids = record.port_ids();
        self.devices.push(record);
        Ok(ids)
    }

    /// The current state of a port (`Down` for an unknown id).
    pub(crate) fn port_state(&self, id: u32) -> PortState {
        self.port(id).map_or(PortState::Down, |p| p.state)
    }

    /// Allocates a queue pair number on `device`. Numbers are never reused,
    /// so a datagram in flight to a destroyed queue pair cannot reach a new
    /// one.
    pub(crate) fn register_qp(&mut self, device: usize) -> Result<u32> {
        if self.next_qpn > MAX_QPN {
            return Err(FabricError::ResourceExhausted {
                what: "simulated queue pair numbers",
                limit: MAX_QPN - FIRST_QPN + 1,
            });
        }
        let qpn = self.next_qpn;
        self.next_qpn += 1;
        self.qps.insert(
            qpn,
            QpRecord {
                device,
                inbox: BTreeMap::new(),
            },
        );
        Ok(qpn)
    }

    /// Forgets a queue pair; whatever was in flight to it is dropped.
    pub(crate) fn unregister_qp(&mut self, qpn: u32) {
        if let Some(record) = self.qps.remove(&qpn) {
            let lost = record.inbox.len() as u64;
            if lost > 0 {
                tracing::trace!(
                    qpn,
                    lost,
                    "sim: queue pair destroyed with datagrams in flight"
                );
            }
            self.stats.dropped_unknown_dest += lost;
        }
    }

    /// Puts a datagram on the link from `src_port` to `dst_port`, applying
    /// the link's faults, and queues what survives for `dst_qpn`.
    pub(crate) fn transmit(
        &mut self,
        src_port: u32,
        dst_port: u32,
        dst_qpn: u32,
        mut datagram: Datagram,
    ) {
        self.stats.sent += 1;
        let link = self.link(src_port, dst_port);
        let len = datagram.payload.len();
        if self.port_state(src_port) == PortState::Down {
            tracing::trace!(src_port, "sim: dropped, source port down");
            self.stats.dropped_port_down += 1;
            return;
        }
        if link.blacked_out(self.now) {
            tracing::trace!(src_port, dst_port, "sim: dropped in blackout");
            self.stats.dropped_blackout += 1;
            return;
        }
        if link.mtu.is_some_and(|mtu| len > mtu) {
            tracing::trace!(src_port, dst_port, len, "sim: dropped, above link MTU");
            self.stats.dropped_mtu += 1;
            return;
        }
        if self.chance(link.loss) {
            tracing::trace!(src_port, dst_port, "sim: lost");
            self.stats.dropped_loss += 1;
            return;
        }
        // The destination HCA is looked up only for datagrams the link
        // carried, as a real fabric would only notice at the far end.
        let Some(dst_device) = self.port(dst_port).map(|p| (p.device, p.state)) else {
            tracing::trace!(dst_port, "sim: dropped, no such port");
            self.stats.dropped_unknown_dest += 1;
            return;
        };
        if dst_device.1 == PortState::Down {
            tracing::trace!(dst_port, "sim: dropped, destination port down");
            self.stats.dropped_port_down += 1;
            return;
        }
        if self
            .qps
            .get(&dst_qpn)
            .is_none_or(|qp| qp.device != dst_device.0)
        {
            tracing::trace!(dst_port, dst_qpn, "sim: dropped, no such queue pair");
            self.stats.dropped_unknown_dest += 1;
            return;
        }
        if len > 0 && self.chance(link.corrupt) {
            let bit = self.rng.usize(0..len * 8);
            if let Some(byte) = datagram.payload.get_mut(bit / 8) {
                *byte ^= 1 << (bit % 8);
            }
            self.stats.corrupted += 1;
        }
        let mut arrival = self.now.saturating_add(link.latency);
        if self.chance(link.reorder) {
            arrival = arrival.saturating_add(self.delay_in(link.reorder_delay));
            self.stats.reordered += 1;
        }
        let copy = self.chance(link.duplicate).then(|| datagram.clone());
        self.enqueue(dst_qpn, arrival, datagram);
        if let Some(copy) = copy {
            self.stats.duplicated += 1;
            self.enqueue(dst_qpn, arrival.saturating_add(link.duplicate_delay), copy);
        }
    }

    /// Draws from the generator only for a real probability, so that a
    /// perfect link consumes no randomness.
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.f64() < p
    }

    /// A delay drawn uniformly from the inclusive range.
    fn delay_in(&mut self, (min, max): (Duration, Duration)) -> Duration {
        let span = u64::try_from(max.saturating_sub(min).as_nanos()).unwrap_or(u64::MAX);
        min.saturating_add(Duration::from_nanos(self.rng.u64(0..=span)))
    }

    fn enqueue(&mut self, qpn: u32, arrival: Duration, datagram: Datagram) {
        let key = ArrivalKey {
            arrival,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.inbox.insert(key, datagram);
        }
    }

    /// Takes the earliest datagram that has arrived (arrival ≤ now) at any
    /// of `qpns`, with the number of the queue pair it is for.
    pub(crate) fn pop_arrived(
        &mut self,
        qpns: impl Iterator<Item = u32>,
    ) -> Option<(u32, Datagram)> {
        let now = self.now;
        let (qpn, _) = qpns
            .filter_map(|qpn| {
                let (key, _) = self.qps.get(&qpn)?.inbox.first_key_value()?;
                (key.arrival <= now).then_some((qpn, *key))
            })
            .min_by_key(|(_, key)| *key)?;
        let (_, datagram) = self.qps.get_mut(&qpn)?.inbox.pop_first()?;
        self.stats.delivered += 1;
        Some((qpn, datagram))
    }
}
