//! Firing timers: the state's heap of per-peer deadlines, and what each
//! timer does when it is due.

use std::cmp::Reverse;

use super::Reliability;
use super::peer::NIL;
use super::timer_table::{Timer, earliest};
use super::types::Mode;
use super::types::{Event, LossReason, PeerId};
use crate::time::Instant;

impl<F: Clone, R> Reliability<F, R> {
    /// When [`handle_timeout`](Self::handle_timeout) should next be called.
    /// A peer that stopped needing a timer keeps the deadline it armed last
    /// until that deadline fires (for nothing), so after the last work this
    /// may report one deadline more before it is `None`.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        // Drop entries a peer replaced with an earlier one, or left behind
        // when it ended. The entry of a peer that merely stopped needing a
        // timer is still live (see `schedule`) and is reported.
        while let Some(Reverse((at, peer))) = self.timers.peek().copied() {
            if self.peers[peer as usize].scheduled == Some(at) {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    /// Fires every timer due at `now`: retransmission timeouts and
    /// zero-window probes, delayed acknowledgements, peer failure detection
    /// and the end of lingering.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.fire(now, false);
    }

    /// Fires every timer due at `now` as [`handle_timeout`](Self::handle_timeout)
    /// does, except that no peer is declared lost: the caller has not read
    /// everything the fabric holds, and an acknowledgement may wait there.
    /// A peer whose failure deadline passed keeps a deadline (in the past)
    /// in [`poll_timeout`](Self::poll_timeout) and is examined again by the
    /// next call of either method. So a caller must not call this method
    /// again merely because that deadline is past: it reads its input
    /// first, then calls [`handle_timeout`](Self::handle_timeout).
    pub fn handle_timeout_deferring_failures(&mut self, now: Instant) {
        self.fire(now, true);
    }

    pub(super) fn fire(&mut self, now: Instant, defer_failures: bool) {
        // Peers whose failure was deferred: their deadline is in the past,
        // so they are pushed back only after the loop, or it would pop them
        // again and again.
        let mut deferred = Vec::new();
        while let Some(Reverse((at, peer))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if self.peers[peer as usize].scheduled != Some(at) {
                continue;
            }
            self.peers[peer as usize].scheduled = None;
            if self.expire(now, peer, defer_failures) {
                deferred.push(peer);
            } else {
                self.reschedule(peer);
            }
        }
        for peer in deferred {
            let p = &self.peers[peer as usize];
            let next = earliest(p.next_deadline(&self.config), p.fail_at(&self.config));
            self.schedule(peer, next);
        }
    }

    /// Handles the peer's due timers. Returns `true` if its failure was due
    /// but deferred.
    pub(super) fn expire(&mut self, now: Instant, peer: u32, defer_failure: bool) -> bool {
        let p = &mut self.peers[peer as usize];
        let mut deferred = false;
        if p.fail_at(&self.config).is_some_and(|at| at <= now) {
            if !defer_failure {
                self.declare_lost(peer, LossReason::Timeout);
                return false;
            }
            deferred = true;
        }
        if let Mode::Lingering(until) = p.mode {
            if until <= now {
                // Done lingering. What the peer never acknowledged fails:
                // the caller closed it, and waiting longer would keep a
                // deadline in the past.
                self.end_peer(peer);
                self.events
                    .push_back(Event::PeerClosed { peer: PeerId(peer) });
                return deferred;
            }
        }
        if p.timers.expired(Timer::Ack, now) {
            p.timers.stop(Timer::Ack);
            self.queue_ack(peer);
        }
        let p = &mut self.peers[peer as usize];
        if !p.timers.is_set(Timer::Rto) && p.keepalive_at(&self.config).is_some_and(|at| at <= now)
        {
            p.last_keepalive = now;
            self.stats.keepalives += 1;
            self.queue_probe(peer);
        }
        if self.peers[peer as usize].timers.expired(Timer::Loss, now) {
            self.detect_losses(now, peer);
        }
        let p = &mut self.peers[peer as usize];
        if p.timers.expired(Timer::Pto, now) {
            p.timers.stop(Timer::Pto);
            self.probe_tail(peer);
        }
        if self.peers[peer as usize].timers.expired(Timer::Rto, now) {
            self.on_rto(now, peer);
        }
        deferred
    }

    /// The caller did not run for a while (its process was stopped or
    /// starved, and its clock jumped): that is no evidence against any
    /// peer. Every peer's failure clock restarts at `now`; a peer with data
    /// waiting gets its retransmission timer due at `now`, so its state
    /// refreshes at once (retransmission or probe) with a normal timeout
    /// afterwards, not a backed-off one; every timer is rescheduled.
    pub fn resume(&mut self, now: Instant) {
        self.stats.resumes += 1;
        self.timers.clear();
        for p in self.peers.iter_awake_mut() {
            p.scheduled = None;
            p.last_heard = now;
            // Probe and loss timers count from sends made before the gap:
            // the refresh below replaces them.
            p.timers.stop(Timer::Pto);
            p.timers.stop(Timer::Loss);
            p.probed = false;
            if !p.mode.is_lost() && (p.head != NIL || p.backlog_head != NIL) {
                p.rtt.end_backoff();
                p.timers.set(Timer::Rto, now);
                p.resumed = true;
            }
        }
        // Every peer that woke (a pass over all: a resume is rare).
        for id in 0..self.peers.len() {
            if self.peers.get(id).is_some() {
                self.reschedule(id as u32);
            }
        }
    }

    /// Makes sure the timer heap has an entry for the peer's next deadline.
    pub(super) fn reschedule(&mut self, peer: u32) {
        let next = self.peers[peer as usize].next_deadline(&self.config);
        self.schedule(peer, next);
    }

    /// Makes sure the timer heap has an entry no later than `next`.
    pub(super) fn schedule(&mut self, peer: u32, next: Option<Instant>) {
        let p = &mut self.peers[peer as usize];
        // With nothing due, an existing entry is left to fire and find
        // nothing: cheaper than removing it now and pushing another at the
        // next send.
        let Some(next) = next else {
            return;
        };
        // An existing entry that fires no later is enough: when it fires
        // early the deadline is recomputed and pushed again.
        if p.scheduled.is_some_and(|at| at <= next) {
            return;
        }
        p.scheduled = Some(next);
        // Entries a peer replaced with an earlier one stay in the heap until
        // they come up (a keepalive's a quarter of peer_timeout away): drop
        // them before the heap would grow, so that it holds about one entry
        // per peer and stops allocating once warm, instead of growing with
        // the sends of the last peer_timeout.
        if self.timers.len() == self.timers.capacity() {
            let peers = &self.peers;
            self.timers
                .retain(|&Reverse((at, peer))| peers[peer as usize].scheduled == Some(at));
        }
        self.timers.push(Reverse((next, peer)));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Config, Instant, Reliability};

    #[test]
    fn replaced_timer_entries_do_not_pile_up() {
        let mut r: Reliability<u32, u32> = Reliability::new(Config::default()).expect("config");
        let peer = r.add_peer();
        r.wake(Instant::ZERO, peer.0);
        for i in 0..10_000u64 {
            let now = Instant::from_duration(Duration::from_millis(i));
            // The peer turns idle (a keepalive, far away), then busy again
            // (a retransmission timeout, sooner): the keepalive's entry is
            // replaced, and stays in the heap until it comes up.
            r.peers[peer.0 as usize].scheduled = None;
            r.schedule(peer.0, Some(now + Duration::from_secs(7)));
            r.schedule(peer.0, Some(now + Duration::from_millis(5)));
        }
        assert!(r.timers.len() <= 8, "{} entries", r.timers.len());
        assert!(
            r.timers.capacity() <= 16,
            "capacity {}",
            r.timers.capacity()
        );
        let at = r.poll_timeout().expect("a deadline");
        assert_eq!(at, Instant::from_duration(Duration::from_millis(9_999 + 5)));
    }
}
