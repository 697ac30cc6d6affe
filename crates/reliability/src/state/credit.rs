//! The credit this side advertises: how many datagrams past the
//! cumulative acknowledgement each peer may send.
//!
//! Credit is either one value for every peer ([`Reliability::set_credit`]),
//! or a receive pool shared by need ([`Reliability::share_credit`]):
//!
//! * A peer becomes *active* when its data arrives, and stays so while data
//!   flows either way within [`Config::credit_horizon`]. The active peers
//!   share half the pool, but at most two windows together: one window
//!   fills a path, and more would only queue here for longer than a
//!   retransmission timeout.
//! * The others keep a small even share of the other half, enough to
//!   start, and become active with their first datagram, which the
//!   acknowledgement answers with the larger credit. Splitting the pool
//!   evenly over every connected peer instead left one datagram per pair at
//!   5 744 peers, however few of them sent.
//! * What this side has in flight takes buffers too, for its
//!   acknowledgements: they are kept out of the pool shared.
//! * A credit is a promise: no peer is told more than the buffers promised
//!   to nobody else, so shares that move as peers come and go never add up
//!   to more than the pool. The only promise beyond it is the caller's
//!   floor (one datagram per peer while its application runs, whose
//!   in-order datagrams it takes whatever it holds).
//! * A peer told 0 is *starved*: it hears at once, by an acknowledgement,
//!   when its credit comes back, instead of at its next zero-window probe.
//!
//! [`Config::credit_horizon`]: crate::Config::credit_horizon

use crate::time::Instant;

use super::Reliability;
use super::peer::{CREDIT_ACTIVE, CREDIT_STARVED};

/// Windows' worth of credit the active peers share at most, together. One
/// window fills a path; more only lengthen the queue at this receiver, past
/// a retransmission timeout.
const ACTIVE_WINDOWS: usize = 2;

/// The most credit the active peers share, with `window`.
pub(super) const fn active_credit_max(window: u16) -> usize {
    ACTIVE_WINDOWS * window as usize
}

/// How the advertised credit is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Policy {
    /// This credit to every peer.
    Fixed(u16),
    /// `free` receive buffers shared by need; no peer gets less than
    /// `floor`.
    Shared { free: usize, floor: u16 },
}

/// The credit policy and who is active or starved under it.
#[derive(Debug)]
pub(super) struct Credit {
    policy: Policy,
    /// Peers marked [`CREDIT_ACTIVE`], in the order they became so.
    active: Vec<u32>,
    /// Peers marked [`CREDIT_STARVED`]: told 0.
    starved: Vec<u32>,
    /// When [`Credit::active`] is next swept for peers gone quiet.
    next_sweep: Instant,
    /// Buffers promised and not yet used: the sum over the peers of their
    /// advertised right edge less the next sequence number expected.
    promised: usize,
    /// Datagrams this side has in flight to all its peers: their
    /// acknowledgements will take receive buffers too.
    in_flight: usize,
    /// The shares and the buffers data may be promised, as of the last
    /// [`Credit::refresh`]: an acknowledgement reads them without a
    /// division.
    current: Current,
}

/// What [`Credit::refresh`] works out.
#[derive(Debug, Clone, Copy, Default)]
struct Current {
    active: u16,
    idle: u16,
    for_data: usize,
}

impl Credit {
    pub(super) const fn fixed(credit: u16) -> Self {
        Self {
            policy: Policy::Fixed(credit),
            active: Vec::new(),
            starved: Vec::new(),
            next_sweep: Instant::ZERO,
            promised: 0,
            in_flight: 0,
            current: Current {
                active: credit,
                idle: credit,
                for_data: 0,
            },
        }
    }

    /// Works the shares out again for `peers`, `window` and `ack_every`:
    /// after the policy, the peers or the active ones changed.
    pub(super) fn refresh(&mut self, peers: usize, window: u16, ack_every: u16) {
        let (active, idle) = self.shares(peers, window, ack_every);
        let for_data = match self.policy {
            Policy::Fixed(_) => 0,
            Policy::Shared { free, .. } => self.for_data(free, ack_every),
        };
        self.current = Current {
            active,
            idle,
            for_data,
        };
    }

    /// A datagram went out for the first time.
    pub(super) fn sent(&mut self) {
        self.in_flight += 1;
    }

    /// `count` datagrams in flight were acknowledged, or will never be.
    pub(super) fn acknowledged(&mut self, count: usize) {
        self.in_flight = self.in_flight.saturating_sub(count);
    }

    /// `count` promised buffers were used by datagrams that arrived (or
    /// will not be: their peer ended).
    pub(super) fn used(&mut self, count: usize) {
        self.promised = self.promised.saturating_sub(count);
    }

    /// Peers that sent data within the horizon.
    pub(super) fn active_peers(&self) -> usize {
        self.active.len()
    }

    /// Of `free` buffers, those data may be promised: the others wait for
    /// the acknowledgements of what this side has in flight (one per
    /// `ack_every` datagrams; twice that, since a delayed acknowledgement
    /// may cover fewer).
    fn for_data(&self, free: usize, ack_every: u16) -> usize {
        free.saturating_sub(2 * self.in_flight / usize::from(ack_every.max(1)))
    }

    /// The credits an active and an idle peer get among `peers`, capped at
    /// `window`.
    fn shares(&self, peers: usize, window: u16, ack_every: u16) -> (u16, u16) {
        match self.policy {
            Policy::Fixed(credit) => (credit, credit),
            Policy::Shared { free, floor } => {
                let free = self.for_data(free, ack_every);
                let clamp = |n: usize| u16::try_from(n).unwrap_or(u16::MAX).clamp(floor, window);
                let active = self.active.len().max(1);
                let idle_peers = peers.saturating_sub(self.active.len());
                // An even share, but all idle peers together at most half.
                let idle = clamp((free / peers.max(1)).min(free / 2 / idle_peers.max(1)));
                // What the floor adds beyond that half is the overcommit
                // the floor allows, not taken from the active peers.
                let held_idle = (usize::from(idle) * idle_peers).min(free / 2);
                let for_active = (free - held_idle).min(active_credit_max(window));
                (clamp(for_active / active), idle)
            }
        }
    }
}

impl<F: Clone, R> Reliability<F, R> {
    /// The credit `peer` would be told now, and what it was promised
    /// before. Under a shared pool the credit is the peer's share, but no
    /// more than what is promised to nobody else: a receiver never promises
    /// more buffers than it has (beyond the floor), also while shares move
    /// as peers become active or idle.
    fn grant(&self, peer: u32) -> (u16, usize) {
        let Current {
            active,
            idle,
            for_data,
        } = self.credit.current;
        let p = &self.peers[peer as usize];
        let before = (p.rcv.granted - p.rcv.nxt).max(0) as usize;
        let share = if p.credit_flags & CREDIT_ACTIVE != 0 {
            active
        } else {
            idle
        };
        let credit = match self.credit.policy {
            Policy::Fixed(_) => share,
            Policy::Shared { floor, .. } => {
                let others = self.credit.promised.saturating_sub(before);
                let unpromised = for_data.saturating_sub(others);
                share
                    .min(u16::try_from(unpromised).unwrap_or(u16::MAX))
                    .max(floor)
            }
        };
        (credit, before)
    }

    /// The credit to advertise to `peer` now, which this side promises from
    /// here on. Marks the peer starved when that is 0.
    pub(super) fn credit_for(&mut self, peer: u32) -> u16 {
        let (credit, before) = self.grant(peer);
        self.credit.promised = self.credit.promised.saturating_sub(before) + usize::from(credit);
        let p = &mut self.peers[peer as usize];
        p.rcv.granted = p.rcv.nxt + u32::from(credit);
        if credit == 0 && p.credit_flags & CREDIT_STARVED == 0 {
            p.credit_flags |= CREDIT_STARVED;
            self.credit.starved.push(peer);
        }
        credit
    }

    /// Data arrived from `peer`: it is active from now on, for a horizon.
    pub(super) fn note_sender(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        if p.credit_flags & CREDIT_ACTIVE == 0 {
            p.credit_flags |= CREDIT_ACTIVE;
            self.credit.active.push(peer);
            self.refresh_credit();
        }
    }

    /// [`Credit::refresh`] with this side's peers and configuration.
    pub(super) fn refresh_credit(&mut self) {
        self.credit
            .refresh(self.peers.len(), self.config.window, self.config.ack_every);
    }

    /// Sets the credit this side advertises to every peer (datagrams past
    /// the cumulative acknowledgement it will accept). Capped at the window;
    /// 0 stops the peers sending new data (they probe until credit
    /// returns). The new value rides on the next header sent to each peer;
    /// a peer that was told 0 is sent an acknowledgement at once when its
    /// credit comes back.
    pub fn set_credit(&mut self, credit: u16) {
        self.credit.policy = Policy::Fixed(credit.min(self.config.window));
        self.refresh_credit();
        self.wake_starved();
    }

    /// Shares `free` receive buffers among the peers by need: the peers
    /// whose data arrived, while data flows with them within
    /// [`Config::credit_horizon`](crate::Config::credit_horizon), share
    /// half (two windows at most); the others get an even share of the
    /// other half; nobody gets less than `floor` or more than the window,
    /// nor more than is promised to nobody else (module documentation). Call it as the free buffers change (every progress
    /// call will do: it costs a comparison, and a pass over the active
    /// peers once per horizon).
    pub fn share_credit(&mut self, now: Instant, free: usize, floor: u16) {
        self.credit.policy = Policy::Shared { free, floor };
        if now >= self.credit.next_sweep {
            self.credit.next_sweep = now + self.config.credit_horizon;
            let horizon = self.config.credit_horizon;
            let peers = &mut self.peers;
            self.credit.active.retain(|&peer| {
                let p = &mut peers[peer as usize];
                // Data arrived when the peer became active, so `last_data`
                // is set; it also moves when data goes to the peer, which
                // keeps a pair that exchanges both ways active.
                let quiet = p.last_data.is_none_or(|at| now >= at + horizon);
                if quiet {
                    p.credit_flags &= !CREDIT_ACTIVE;
                }
                !quiet
            });
        }
        self.refresh_credit();
        self.wake_starved();
    }

    /// Acknowledges at once every starved peer whose credit is above 0 now.
    fn wake_starved(&mut self) {
        let mut i = 0;
        while let Some(&peer) = self.credit.starved.get(i) {
            if self.grant(peer).0 == 0 {
                i += 1;
                continue;
            }
            self.peers[peer as usize].credit_flags &= !CREDIT_STARVED;
            self.credit.starved.swap_remove(i);
            self.stats.credit_updates += 1;
            self.queue_ack(peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared policy over `free` buffers with `active` of the peers
    /// active.
    fn shared(free: usize, floor: u16, active: u32) -> Credit {
        Credit {
            policy: Policy::Shared { free, floor },
            active: (0..active).collect(),
            ..Credit::fixed(0)
        }
    }

    #[test]
    fn without_a_floor_the_promises_never_exceed_the_pool() {
        for peers in [1usize, 2, 7, 64, 1_000, 5_744, 10_000] {
            for active in [0, 1, 2, 26, 100, 1_000, 10_000] {
                let active = active.min(peers);
                for free in [0usize, 1, 10, 255, 5_744, 100_000] {
                    let credit = shared(free, 0, active as u32);
                    let (per_active, per_idle) = credit.shares(peers, u16::MAX, 16);
                    let promised =
                        usize::from(per_active) * active + usize::from(per_idle) * (peers - active);
                    assert!(
                        promised <= free,
                        "{peers} peers, {active} active, {free} free: {promised} promised"
                    );
                }
            }
        }
    }

    #[test]
    fn the_active_peers_share_half_the_pool_up_to_two_windows() {
        let (per_active, per_idle) = shared(5_744, 1, 26).shares(10_000, 1024, 16);
        assert_eq!((per_active, per_idle), (2 * 1024 / 26, 1));
        let (per_active, _) = shared(1_000, 1, 10).shares(10_000, 1024, 16);
        assert_eq!(per_active, 500 / 10);
        assert_eq!(Credit::fixed(9).shares(10_000, 1024, 16), (9, 9));
    }
}
