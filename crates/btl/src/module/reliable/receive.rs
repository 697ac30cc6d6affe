//! The reliable receive path: a datagram's integrity is checked, its sender
//! recognised, and its reliability header handed to the state, which says
//! whether to deliver it now, hold its buffer until an earlier one arrives,
//! or drop it; what becomes deliverable is queued for the caller in order.

use udbtl_fabric::{Context, QpAddr};
use udbtl_reliability::{Instant, PeerId, Receipt, Room};
use udbtl_wire::datagram::{AuthKey, Epochs};
use udbtl_wire::seal::{Protection, Sender};
use udbtl_wire::{btl, datagram, rel};

use super::super::Engine;
use super::super::delivery::{Delivery, Held};
use super::super::endpoints::Endpoint;
use super::super::integrity::{Check, Integrity, payload_offset};
use super::super::seal::{self, PairSeal};
use super::UNKNOWN_PEERS_MAX;
use crate::{EndpointId, Tag};

impl<C: Context> Engine<C> {
    /// A received reliable datagram from `src`, carrying `job_key` (one the
    /// module accepts).
    pub(in crate::module) fn on_reliable_receive(
        &mut self,
        held: Held,
        src: QpAddr,
        job_key: u32,
        now: Instant,
    ) {
        // An unreliable module never gets here; Fabric checks nothing.
        let integrity = self
            .path
            .reliable()
            .map_or(Integrity::Fabric, |r| r.integrity);
        let endpoint = self.endpoints.lookup(src);
        let parsed = self.recv.datagram(&self.ctx, held).and_then(|bytes| {
            let tag = btl::Packet::new_checked(bytes).ok()?.tag();
            let header = rel::Repr::parse(&datagram::extension(bytes).ok()?).ok()?;
            let check = integrity.check_unsealed(bytes, &header);
            Some((tag, header, check))
        });
        let Some((tag, header, unsealed)) = parsed else {
            self.stats.recv_malformed += 1;
            self.recv.repost(held.slot);
            return;
        };
        let known = endpoint
            .and_then(|ep| self.endpoints.get(ep))
            .map(|e| (e.proc_id, e.job_key));
        let recognised = endpoint.filter(|_| known == Some((header.src, job_key)));
        let check = match integrity {
            Integrity::Sealed {
                own,
                own_qpn,
                protection,
                ..
            } => {
                let sender = Sender {
                    job_key,
                    id: header.src,
                };
                self.open_sealed(
                    held,
                    (&header, sender),
                    recognised,
                    (own, own_qpn, protection),
                )
            }
            _ => unsealed,
        };
        let counter = match check {
            Check::Intact => None,
            Check::BadChecksum => Some(&mut self.stats.recv_bad_checksum),
            Check::Unauthenticated => Some(&mut self.stats.recv_unauthenticated),
            Check::Replayed => Some(&mut self.stats.recv_replayed),
        };
        if let Some(counter) = counter {
            *counter += 1;
            self.recv.repost(held.slot);
            return;
        }
        let (Some(endpoint), Some(reliable)) = (recognised, self.path.reliable_mut()) else {
            self.stats.recv_unknown_peer += 1;
            // A process of this job that knows us before we know it
            // (addresses fetched lazily): the caller can look it up by the
            // id it carries; the sender retransmits once it is connected.
            // Processes of other jobs are only ever added by the caller.
            if let Some(reliable) = self.path.reliable_mut() {
                if endpoint.is_none()
                    && job_key == self.job_key
                    && reliable.unknown_peers.len() < UNKNOWN_PEERS_MAX
                    && !reliable.unknown_peers.contains(&header.src)
                {
                    reliable.unknown_peers.push(header.src);
                }
            }
            self.recv.repost(held.slot);
            return;
        };
        let can_hold = self.recv.may_hold(self.held_for_app, self.app_present);
        let room = Room {
            // While the application runs, an in-order datagram is delivered
            // before this progress call returns; while it is away, its
            // buffer is kept until it comes back.
            in_order: self.app_present || can_hold,
            early: can_hold,
        };
        match reliable
            .core
            .on_datagram(now, PeerId(endpoint.0), &header, held, room)
        {
            Receipt::Deliver(held) => {
                self.deliver_in_order(held, endpoint, Tag(tag), header.flags);
                while let Some((peer, held)) =
                    self.path.reliable_mut().and_then(|r| r.core.poll_deliver())
                {
                    self.recv.early_held -= 1;
                    self.deliver_held(held, EndpointId(peer.0));
                }
            }
            Receipt::Buffered => self.recv.early_held += 1,
            Receipt::Discard(held, _) => self.recv.repost(held.slot),
        }
    }

    /// Opens the sealed datagram in `held`, with header `header`, from
    /// `sender`, on a module whose key is `own`, whose receiving queue pair
    /// is `own_qpn` and which seals with `protection`: with the state of its
    /// sender's endpoint, if `recognised`, else as a stranger's.
    fn open_sealed(
        &mut self,
        held: Held,
        (header, sender): (&rel::Repr, Sender),
        recognised: Option<EndpointId>,
        (own, own_qpn, protection): (AuthKey, u32, Protection),
    ) -> Check {
        if !seal::sealed_as(header.flags, protection) {
            // From a peer of this job: it was started with another `auth`.
            if let Some(reliable) = self.path.reliable_mut().filter(|_| recognised.is_some()) {
                if !reliable.warned_protection {
                    reliable.warned_protection = true;
                    tracing::warn!(
                        peer = header.src,
                        sealed = header.has(rel::FLAG_SEALED),
                        "a peer sends datagrams not sealed as this module seals them \
                         (UDBTL_AUTH={}); they are dropped: set UDBTL_AUTH alike on \
                         every process",
                        if protection == Protection::Encrypt {
                            "encrypt"
                        } else {
                            "on"
                        }
                    );
                }
            }
            return Check::Unauthenticated;
        }
        // The tag covers the epochs of `seq` and `ack`, which only the
        // stream's state knows.
        let epochs = recognised
            .zip(self.path.reliable())
            .map_or(Epochs::default(), |(ep, r)| {
                r.core.epochs_of(PeerId(ep.0), header)
            });
        let Some(bytes) = self.recv.datagram_mut(&mut self.ctx, held) else {
            return Check::Unauthenticated;
        };
        let Some(peer) = recognised.and_then(|ep| self.endpoints.get_mut(ep)) else {
            return seal::open_from_stranger(bytes, (&own, own_qpn), sender, protection);
        };
        let Some(pair) = PairSeal::of(&mut peer.seal) else {
            return Check::Unauthenticated;
        };
        pair.open(bytes, (&own, own_qpn), sender, epochs, protection)
    }

    /// Delivers a datagram that waited for an earlier one: its headers are
    /// read again from its buffer.
    fn deliver_held(&mut self, held: Held, endpoint: EndpointId) {
        let headers = self.recv.datagram(&self.ctx, held).and_then(|bytes| {
            let tag = btl::Packet::new_checked(bytes).ok()?.tag();
            Some((tag, datagram::extension(bytes).ok()?.flags()))
        });
        match headers {
            Some((tag, flags)) => self.deliver_in_order(held, endpoint, Tag(tag), flags),
            None => {
                self.stats.recv_malformed += 1;
                self.recv.repost(held.slot);
            }
        }
    }

    /// Hands one in-order datagram to the application's next progress.
    fn deliver_in_order(&mut self, held: Held, endpoint: EndpointId, tag: Tag, flags: u16) {
        if flags & rel::FLAG_READ != 0 {
            self.on_read_datagram(held, endpoint, tag, (payload_offset(flags), flags));
            return;
        }
        let Some(src) = self.endpoints.get(endpoint).map(Endpoint::remote) else {
            // Held for a peer whose endpoint the caller deleted since.
            self.stats.recv_unknown_peer += 1;
            self.recv.repost(held.slot);
            return;
        };
        self.hold_for_app(Delivery {
            held,
            header_len: payload_offset(flags),
            tag,
            endpoint: Some(endpoint),
            src,
            flags,
        });
    }
}
