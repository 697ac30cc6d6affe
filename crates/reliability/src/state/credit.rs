//! The credit this side advertises: how many datagrams past the cumulative
//! acknowledgement each peer may send.
//!
//! Either one value for every peer ([`Reliability::set_credit`]), or a
//! receive pool shared by need ([`Reliability::share_credit`]): a peer
//! becomes *active* when its data arrives, and stays so while data flows
//! either way within [`Config::credit_horizon`]; the active peers share at
//! least half the pool. The others keep a small even share, enough to
//! start, and become active with their first datagram, which the
//! acknowledgement answers with the larger credit. Splitting the pool
//! evenly over every connected peer instead left one datagram per pair at
//! 5 744 peers, however few of them sent.
//!
//! Idle peers together hold at most half the pool, so the active ones
//! always share the other half. The only promise beyond the pool is the
//! caller's floor (one datagram per peer while its application runs,
//! whose in-order datagrams it takes whatever it holds). A peer told 0 is
//! *starved*: it hears at once, by an acknowledgement, when its credit
//! comes back, instead of at its next zero-window probe.
//!
//! [`Config::credit_horizon`]: crate::Config::credit_horizon

use crate::time::Instant;

use super::Reliability;
use super::peer::{CREDIT_ACTIVE, CREDIT_STARVED};

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
}

impl Credit {
    pub(super) const fn fixed(credit: u16) -> Self {
        Self {
            policy: Policy::Fixed(credit),
            active: Vec::new(),
            starved: Vec::new(),
            next_sweep: Instant::ZERO,
        }
    }

    /// Peers that sent data within the horizon.
    pub(super) fn active_peers(&self) -> usize {
        self.active.len()
    }

    /// The credits an active and an idle peer get among `peers`, capped at
    /// `window`.
    fn shares(&self, peers: usize, window: u16) -> (u16, u16) {
        match self.policy {
            Policy::Fixed(credit) => (credit, credit),
            Policy::Shared { free, floor } => {
                let clamp = |n: usize| u16::try_from(n).unwrap_or(u16::MAX).clamp(floor, window);
                let active = self.active.len().max(1);
                let idle_peers = peers.saturating_sub(self.active.len());
                // An even share, but all idle peers together at most half.
                let idle = clamp((free / peers.max(1)).min(free / 2 / idle_peers.max(1)));
                // What the floor adds beyond that half is the overcommit
                // the floor allows, not taken from the active peers.
                let held_idle = (usize::from(idle) * idle_peers).min(free / 2);
                (clamp((free - held_idle) / active), idle)
            }
        }
    }
}

impl<F: Clone, R> Reliability<F, R> {
    /// The credit to advertise to `peer` now. Marks it starved when that
    /// is 0.
    pub(super) fn credit_for(&mut self, peer: u32) -> u16 {
        let window = self.config.window;
        let (active, idle) = self.credit.shares(self.peers.len(), window);
        let p = &mut self.peers[peer as usize];
        let credit = if p.credit_flags & CREDIT_ACTIVE != 0 {
            active
        } else {
            idle
        };
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
        }
    }

    /// Sets the credit this side advertises to every peer (datagrams past
    /// the cumulative acknowledgement it will accept). Capped at the window;
    /// 0 stops the peers sending new data (they probe until credit
    /// returns). The new value rides on the next header sent to each peer;
    /// a peer that was told 0 is sent an acknowledgement at once when its
    /// credit comes back.
    pub fn set_credit(&mut self, credit: u16) {
        self.credit.policy = Policy::Fixed(credit.min(self.config.window));
        self.wake_starved();
    }

    /// Shares `free` receive buffers among the peers by need: the peers
    /// whose data arrived, while data flows with them within
    /// [`Config::credit_horizon`](crate::Config::credit_horizon), share at
    /// least half; the others get an even share of at most half;
    /// nobody gets less than `floor` or more than the window (module
    /// documentation). Call it as the free buffers change (every progress
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
        self.wake_starved();
    }

    /// Acknowledges at once every starved peer whose credit is above 0 now.
    fn wake_starved(&mut self) {
        if self.credit.starved.is_empty() {
            return;
        }
        let (active, idle) = self.credit.shares(self.peers.len(), self.config.window);
        let mut i = 0;
        while let Some(&peer) = self.credit.starved.get(i) {
            let p = &mut self.peers[peer as usize];
            let credit = if p.credit_flags & CREDIT_ACTIVE != 0 {
                active
            } else {
                idle
            };
            if credit == 0 {
                i += 1;
                continue;
            }
            p.credit_flags &= !CREDIT_STARVED;
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
                    let (per_active, per_idle) = credit.shares(peers, u16::MAX);
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
    fn the_active_peers_always_share_at_least_half() {
        let credit = shared(5_744, 1, 26);
        let (per_active, per_idle) = credit.shares(10_000, 1024);
        assert_eq!((per_active, per_idle), (110, 1));
        assert_eq!(Credit::fixed(9).shares(10_000, 1024), (9, 9));
    }
}
