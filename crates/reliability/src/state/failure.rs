//! Peer failure by time (nothing heard for `peer_timeout` while data
//! waits), keepalives, resets, closing and lingering, and ending a peer's
//! streams.

use super::peer::{NIL, Peer, QUEUED, RELEASED};
use super::types::Mode;
use super::types::{Event, LossReason, PeerId};
use super::{Pending, Reliability};
use crate::config::Config;
use crate::time::Instant;

impl Peer {
    pub(super) fn fail_at(&self, config: &Config) -> Option<Instant> {
        (!self.idle() || self.watched(config)).then(|| self.last_heard + config.peer_timeout)
    }

    /// Under the keepalive watch: data flowed, and the peer has not been
    /// heard from for a whole `peer_timeout` since.
    pub(super) fn watched(&self, config: &Config) -> bool {
        config.keepalive
            && self.mode == Mode::Active
            && self
                .last_data
                .is_some_and(|data| self.last_heard < data + config.peer_timeout)
    }

    /// When the next keepalive probe is due: a quarter of `peer_timeout`
    /// after the peer was last heard from or probed, while idle and watched.
    pub(super) fn keepalive_at(&self, config: &Config) -> Option<Instant> {
        (self.idle() && self.watched(config)).then(|| {
            let since = self.last_keepalive.max(self.last_heard);
            since + config.peer_timeout / 4
        })
    }
}

impl<F: Clone, R> Reliability<F, R> {
    pub(super) fn declare_lost(&mut self, peer: u32, reason: LossReason) {
        self.stats.peers_lost += 1;
        self.end_peer(peer);
        if reason == LossReason::Timeout {
            // Tell the peer, in case it still hears us: it must not wait
            // for a stream this side abandoned. Had everything sent
            // arrived, it expects `snd_nxt`; if not, it challenges, and the
            // answer carries the number it expects.
            self.transmits.push_back(Pending::Reset(peer));
        }
        self.events.push_back(Event::PeerLost {
            peer: PeerId(peer),
            reason,
        });
    }

    /// Ends a peer's streams: it becomes [`Mode::Lost`], its timers stop,
    /// every fragment not yet reported fails, and the buffers held for it
    /// are taken back.
    pub(super) fn end_peer(&mut self, peer: u32) {
        let p = &mut self.peers[peer as usize];
        // What was promised to it is free for the others.
        self.credit
            .used((p.rcv.granted - p.rcv.nxt).max(0) as usize);
        p.rcv.granted = p.rcv.nxt;
        p.mode = Mode::Lost(p.snd_nxt);
        p.timers.stop_all();
        p.resumed = false;
        // Its timer entry, if any, is left to be dropped as stale.
        p.scheduled = None;
        for list in [(p.head, true), (p.backlog_head, false)] {
            let mut at = list.0;
            while at != NIL {
                let slot = &mut self.slots[at as usize];
                slot.flags &= !QUEUED;
                if slot.flags & RELEASED == 0 {
                    self.events.push_back(Event::Failed {
                        peer: PeerId(peer),
                        frag: slot.frag.clone(),
                    });
                }
                self.free_slots.push(at);
                at = slot.next;
            }
        }
        let p = &mut self.peers[peer as usize];
        p.head = NIL;
        p.tail = NIL;
        p.backlog_head = NIL;
        p.backlog_tail = NIL;
        p.backlog_len = 0;
        self.credit.acknowledged(usize::from(p.in_flight));
        p.in_flight = 0;
        p.sacked = 0;
        p.lost = 0;
        self.reclaim_early(peer);
    }

    /// Takes back the buffers held for a peer whose gap will never fill.
    pub(super) fn reclaim_early(&mut self, peer: u32) {
        let keys: Vec<(u32, u32)> = self
            .early
            .keys()
            .filter(|(owner, _)| *owner == peer)
            .copied()
            .collect();
        for key in keys {
            if let Some(buf) = self.early.remove(&key) {
                self.reclaimed.push(buf);
            }
        }
        let rcv = &mut self.peers[peer as usize].rcv;
        rcv.sack = 0;
        rcv.beyond_sack = 0;
    }

    /// A buffer the state no longer holds (its peer was lost or closed
    /// with a gap): the caller reuses it.
    pub fn poll_reclaim(&mut self) -> Option<R> {
        self.reclaimed.pop()
    }

    /// Stops sending to a peer. It lingers for the configured time, still
    /// acknowledging late retransmissions, delivering what arrives and
    /// retransmitting what it was sent, and then an [`Event::PeerClosed`]
    /// reports it gone; a fragment it had still not acknowledged by then
    /// fails ([`Event::Failed`]) first.
    pub fn close_peer(&mut self, now: Instant, peer: PeerId) {
        let linger = self.config.linger;
        // A dormant peer wakes to linger too: its first datagrams may be
        // on their way.
        if self.wake(now, peer.0) {
            let p = &mut self.peers[peer.0 as usize];
            if p.mode == Mode::Active {
                p.mode = Mode::Lingering(now + linger);
                self.reschedule(peer.0);
            }
        }
    }
}
