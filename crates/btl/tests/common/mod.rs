//! Helpers shared by the simulated-fabric tests `reliable.rs`, `pool.rs` and
//! `busy.rs`:
//! nodes on one seeded `sim` network, a full mesh, inboxes, and a driver on
//! virtual time in which each node plays an active rank (`progress`), a busy
//! one (`service` only: what its progress helper thread would do) or a dead
//! one (not driven at all).
//!
//! Nothing here sleeps or reads the wall clock.

// Each test crate uses part of this module.
#![allow(dead_code, clippy::unwrap_used)]

pub(crate) mod host;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use udbtl_btl::*;
use udbtl_fabric::sim::{SimDeviceSpec, SimNetwork, SimProvider};

pub(crate) type Btl = Component<SimProvider>;
/// What a node received, in order: sender's endpoint, payload.
pub(crate) type Inbox = Arc<Mutex<Vec<(Option<EndpointId>, Vec<u8>)>>>;
/// Error events with the virtual time each was reported at.
pub(crate) type Errors = Arc<Mutex<Vec<(ErrorEvent, Duration)>>>;
/// Send completions with the virtual time each was reported at.
pub(crate) type Completions = Arc<Mutex<Vec<(SendEvent, Duration)>>>;

/// A node on `net` with one port whose datagrams are at most 2048 bytes.
pub(crate) fn node(net: &SimNetwork, name: &str, config: &BtlConfig) -> Btl {
    node_on(net, node_device(name), config)
}

/// The device of [`node`]: one port, datagrams of at most 2048 bytes.
pub(crate) fn node_device(name: &str) -> SimDeviceSpec {
    SimDeviceSpec::new(name, 1).with_max_msg_size(2048)
}

/// A node on `net` with the device `spec`.
pub(crate) fn node_on(net: &SimNetwork, spec: SimDeviceSpec, config: &BtlConfig) -> Btl {
    let provider = net.provider();
    provider.add_device(spec).unwrap();
    let params = Params::load_from(config, |_| None).unwrap();
    Component::init(provider, params).unwrap()
}

/// Connects every node to every other; `eps[i][j]` is i's endpoint for j.
pub(crate) fn mesh(nodes: &mut [Btl]) -> Vec<Vec<Option<EndpointId>>> {
    let blobs: Vec<Vec<u8>> = nodes.iter().map(Component::modex).collect();
    let views: Vec<Option<&[u8]>> = blobs.iter().map(|b| Some(b.as_slice())).collect();
    nodes
        .iter_mut()
        .map(|n| n.add_procs(&views).unwrap()[0].endpoints.clone())
        .collect()
}

pub(crate) fn inbox(btl: &mut Btl, tag: Tag) -> Inbox {
    let inbox: Inbox = Arc::default();
    let sink = inbox.clone();
    btl.modules_mut()[0].register(
        tag,
        Box::new(move |ev: &RecvEvent<'_>| {
            sink.lock()
                .unwrap()
                .push((ev.endpoint, ev.payload.to_vec()))
        }),
    );
    inbox
}

pub(crate) fn errors(net: &SimNetwork, btl: &mut Btl) -> Errors {
    let seen: Errors = Arc::default();
    let sink = seen.clone();
    let net = net.clone();
    btl.modules_mut()[0].register_error(Box::new(move |ev: &ErrorEvent| {
        sink.lock().unwrap().push((ev.clone(), net.now()))
    }));
    seen
}

pub(crate) fn completions(net: &SimNetwork, btl: &mut Btl) -> Completions {
    let seen: Completions = Arc::default();
    let sink = seen.clone();
    let net = net.clone();
    btl.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push((ev.clone(), net.now()))
    }));
    seen
}

/// Message `index` from `from` to `to`, `len` bytes: every byte depends on
/// all four, so a misplaced or mixed-up message cannot pass for another.
pub(crate) fn payload(from: usize, to: usize, index: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + index * 7 + from * 13 + to * 101 + i / 251) as u8)
        .collect()
}

/// The messages `inbox` holds from `endpoint`, in order.
pub(crate) fn stream_from(inbox: &Inbox, endpoint: Option<EndpointId>) -> Vec<Vec<u8>> {
    inbox
        .lock()
        .unwrap()
        .iter()
        .filter(|(ep, _)| *ep == endpoint)
        .map(|(_, bytes)| bytes.clone())
        .collect()
}

/// The default peer_timeout.
pub(crate) fn peer_timeout_default() -> Duration {
    let params = Params::load_from(&BtlConfig::default(), |_| None).unwrap();
    Duration::from_millis(u64::from(params.peer_timeout))
}

/// The backoff ceiling of the retransmission timer: min(peer_timeout / 3,
/// 2 s).
pub(crate) fn rto_max(peer_timeout: Duration) -> Duration {
    (peer_timeout / 3).min(Duration::from_secs(2))
}

/// How the driver runs a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The application progresses: callbacks run.
    Active,
    /// The application computes; only its progress helper services the
    /// fabric (`Module::service`): no callback runs.
    Busy,
    /// Not driven at all.
    Dead,
}

/// Why [`drive`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `done` held.
    Done,
    /// `limit` of virtual time passed.
    Limit,
    /// Nothing will ever happen again: no datagram arrives later and no
    /// driven node has a timer armed.
    Idle,
}

/// Drives every node as [`Role::Active`]; see [`drive_roles`].
pub(crate) fn drive(
    net: &SimNetwork,
    nodes: &mut [Btl],
    limit: Duration,
    done: impl FnMut(&mut [Btl]) -> bool,
) -> Stop {
    let roles = vec![Role::Active; nodes.len()];
    drive_roles(net, nodes, &roles, limit, done)
}

/// Runs every node in `nodes` as its role says (`roles[i]` for node `i`);
/// when none handled anything, moves virtual time to the earliest of the
/// network's next arrival and every driven node's next deadline (never past
/// `limit` from the start). Stops when `done` holds, when `limit` has
/// passed, or when the scenario is idle.
pub(crate) fn drive_roles(
    net: &SimNetwork,
    nodes: &mut [Btl],
    roles: &[Role],
    limit: Duration,
    mut done: impl FnMut(&mut [Btl]) -> bool,
) -> Stop {
    assert_eq!(roles.len(), nodes.len());
    let end = net.now() + limit;
    loop {
        if done(nodes) {
            return Stop::Done;
        }
        if net.now() >= end {
            return Stop::Limit;
        }
        let sent = net.stats().sent;
        let handled: usize = nodes
            .iter_mut()
            .zip(roles)
            .map(|(n, role)| match role {
                Role::Active => n.progress(),
                Role::Busy => n.modules_mut().iter_mut().map(Module::service).sum(),
                Role::Dead => 0,
            })
            .sum();
        if handled > 0 || net.stats().sent != sent {
            continue;
        }
        let now = net.now();
        let deadline = nodes
            .iter_mut()
            .zip(roles)
            .filter(|(_, role)| **role != Role::Dead)
            .filter_map(|(n, _)| n.next_deadline())
            .min();
        if let Some(at) = deadline {
            assert!(
                at > now,
                "a timer due at {at:?} is still armed after progress at {now:?}"
            );
        }
        let arrival = net.next_arrival().filter(|&at| at > now);
        match [deadline, arrival].into_iter().flatten().min() {
            Some(at) => net.advance_to(at.min(end)),
            None if done(nodes) => return Stop::Done,
            None => return Stop::Idle,
        }
    }
}

/// Counters, fabric counters and dump of every node, for a failure message.
pub(crate) fn diagnostics(net: &SimNetwork, nodes: &[Btl]) -> String {
    use std::fmt::Write;
    let mut out = format!("at {:?}, network {:?}\n", net.now(), net.stats());
    for (i, n) in nodes.iter().enumerate() {
        let m = &n.modules()[0];
        let _ = writeln!(
            out,
            "node {i}: unacknowledged {}, pending {}, send credits {}\n  {:?}\n  {:?}\n{}",
            m.unacknowledged(),
            m.pending_len(),
            m.send_credits(),
            m.stats(),
            m.with_context(udbtl_fabric::Context::stats),
            m
        );
    }
    out
}
