//! What leaves: a descriptor or an acknowledgement becomes a datagram here,
//! its headers stamped and, on a reliable module, sealed, then handed to the
//! transmit queue (`transmit.rs`), which posts it.

use udbtl_fabric::{Context, FabricError, Gather, MrHandle, PostError, Sge};
use udbtl_wire::datagram::Epochs;
use udbtl_wire::seal::{Protection, SEALED_HEADER_LEN, Sender, TAG_LEN};
use udbtl_wire::{btl, datagram, rel};

use super::Engine;
use super::endpoints::{Endpoints, Route};
use super::integrity::{checksum, payload_offset};
use super::seal::{PairSeal, Unsealed};
use super::transmit::QueuedPost;
use crate::EndpointId;
use crate::error::SendFailure;
use crate::frag::{Descriptor, FragState, Leaving};

impl<C: Context> Engine<C> {
    /// Posts one descriptor on its endpoint's route, taking a send credit.
    /// On failure no credit is taken and the descriptor's state is
    /// unchanged.
    pub(super) fn post_descriptor(&mut self, des: Descriptor) -> Result<(), PostError> {
        let refused = |kind| PostError {
            posted: 0,
            error: FabricError::InvalidHandle { kind },
        };
        let frag = self.frags.get(des).ok_or_else(|| refused("descriptor"))?;
        let route = self
            .endpoints
            .route(EndpointId(frag.endpoint))
            .ok_or_else(|| refused("endpoint"))?;
        let (_, head) = self
            .frags
            .head(des, self.header_len + frag.seg_len)
            .ok_or_else(|| refused("descriptor"))?;
        let user = self.frags.user_bytes(des);
        let gathers = [
            Gather::Registered(head),
            match user {
                Some((lkey, data)) => Gather::User { lkey, data },
                None => Gather::Registered(head),
            },
        ];
        let sg_list = &gathers[..if user.is_some() { 2 } else { 1 }];
        self.tx
            .post_now(&mut self.ctx, &route, sg_list, u64::from(des.raw()))?;
        self.stats.sends_posted += 1;
        if let Some(frag) = self.frags.get_mut(des) {
            frag.state = FragState::Posted;
        }
        Ok(())
    }

    /// Posts waiting sends while credits last. An unreliable send the
    /// fabric refuses completes through the send callback with the error; a
    /// reliable one is a loss that retransmission repairs.
    pub(super) fn post_waiting(&mut self) {
        while let Some(waiting) = self.tx.sends.pop_ready() {
            match waiting.header {
                Some((header, epochs)) => {
                    if let Some(frag) = self.frags.get_mut(waiting.des) {
                        frag.leaving = Leaving::No;
                    }
                    self.transmit_data(waiting.des, header, epochs, waiting.resend);
                }
                None => {
                    if let Some(frag) = self.frags.get_mut(waiting.des) {
                        frag.state = FragState::Allocated;
                    }
                    if let Err(err) = self.post_descriptor(waiting.des) {
                        self.complete_send(waiting.des, Err(SendFailure::Refused(err.to_string())));
                    }
                }
            }
        }
    }

    /// Queues a datagram for the batch `post_batch` posts (which posts at
    /// once when that fills it). A descriptor's datagram is marked as in
    /// that batch (see [`Leaving`]).
    fn queue_post(&mut self, post: QueuedPost) {
        if post.signaled {
            let batch = self.tx.batch_number();
            if let Some(frag) = self.frags.get_mut(Descriptor::from_raw(post.wr_id as u32)) {
                frag.leaving = Leaving::InBatch(batch);
            }
        }
        if let Some(outcome) = self.tx.queue(&mut self.ctx, &self.frags, post) {
            self.stats.note_batch(outcome);
        }
    }

    /// Posts the queued datagrams. A refused one is a loss to the protocol,
    /// which retransmission repairs.
    pub(super) fn post_batch(&mut self) {
        let outcome = self.tx.flush(&mut self.ctx, &self.frags);
        self.stats.note_batch(outcome);
    }

    /// Writes the reliability header into a descriptor and posts it; a
    /// `resend` on a device that may not have read the first post yet goes
    /// from a copy instead (see `RingLayout`). A refusal is a loss to the
    /// protocol: the retransmission timer repairs it.
    pub(super) fn transmit_data(
        &mut self,
        des: Descriptor,
        mut header: rel::Repr,
        epochs: Epochs,
        resend: bool,
    ) {
        let Some(frag) = self.frags.get(des) else {
            return;
        };
        header.flags |= frag.msg_flags;
        let endpoint = EndpointId(frag.endpoint);
        let seg_len = frag.seg_len;
        // Taken as the segment was written, if it still covers all of it.
        let segment_crc = frag.segment_crc.filter(|c| c.len == seg_len).map(|c| c.crc);
        let Some(route) = self.endpoints.route(endpoint) else {
            self.stats.transmit_failures += 1;
            return;
        };
        let Some((mr, sge)) = self.frags.head(des, self.header_len + seg_len) else {
            return;
        };
        let in_copy = resend && self.path.reliable().is_some_and(|r| r.resends_copied());
        let whole = self.frags.user_bytes(des).is_none();
        match self.protection() {
            // Authenticated where it is when it is whole in the fragment.
            Some(Protection::Authenticate) if !in_copy && whole => {
                return self.seal_in_place(des, endpoint, route, header, epochs, (mr.handle, sge));
            }
            None if !in_copy => {}
            _ => {
                return self.transmit_from_ring(
                    des,
                    endpoint,
                    route,
                    header,
                    epochs,
                    (mr.handle, sge),
                );
            }
        }
        let Ok(bytes) = self.ctx.mr_bytes_mut(mr.handle) else {
            return;
        };
        let head = &mut bytes[sge.offset..sge.offset + sge.len];
        let Ok(mut ext) = datagram::extension_mut(head) else {
            return;
        };
        header.emit(&mut ext);
        let user = self.frags.user_bytes(des);
        let payload_crc = segment_crc.filter(|_| user.is_none());
        checksum(
            head,
            &[user.map_or(&[][..], |(_, data)| data)],
            payload_crc,
            &header,
        );
        let with_user = user.is_some();
        self.queue_post(QueuedPost::data(route, des, sge, with_user));
    }

    /// Who this module's datagrams say they are from.
    const fn sender(&self) -> Sender {
        Sender {
            job_key: self.job_key,
            id: self.proc_id,
        }
    }

    /// How this module seals its datagrams, if it does.
    fn protection(&self) -> Option<Protection> {
        self.path.reliable().and_then(|r| r.integrity.protection())
    }

    /// [`transmit_data`](Self::transmit_data) on a module that
    /// authenticates, for a datagram whole in its fragment (`head`): sealed
    /// where it is, since authenticating writes only the headers; a resend
    /// seals it again.
    fn seal_in_place(
        &mut self,
        des: Descriptor,
        endpoint: EndpointId,
        route: Route,
        header: rel::Repr,
        epochs: Epochs,
        (head_mr, head): (MrHandle, Sge),
    ) {
        let sealer = (self.protection(), self.sender());
        let Ok(bytes) = self.ctx.mr_bytes_mut(head_mr) else {
            return;
        };
        let unsealed = Unsealed::InPlace(&mut bytes[head.offset..head.offset + head.len]);
        if !seal_to(
            &mut self.endpoints,
            sealer,
            endpoint,
            unsealed,
            &header,
            epochs,
        ) {
            self.stats.transmit_failures += 1;
            return;
        }
        self.queue_post(QueuedPost::data(route, des, head, false));
    }

    /// [`transmit_data`](Self::transmit_data) from a seal buffer instead of
    /// the fragment: on a module that encrypts (the fragment keeps its
    /// payload in clear for a resend, which goes under a new packet
    /// number), for an authenticated datagram whose payload goes on in the
    /// caller's memory (its tag is over the datagram as one piece), and for
    /// a resend the device may not have read the first post of.
    /// Encryption reads the payload where it is and writes the ciphertext
    /// there, in one pass; otherwise the datagram is copied there, then
    /// sealed or checksummed.
    fn transmit_from_ring(
        &mut self,
        des: Descriptor,
        endpoint: EndpointId,
        route: Route,
        header: rel::Repr,
        epochs: Epochs,
        (head_mr, head): (MrHandle, Sge),
    ) {
        let user = self.frags.user_bytes(des).map_or(&[][..], |(_, data)| data);
        let len = head.len + user.len();
        let Some(slot) = self
            .path
            .reliable_mut()
            .and_then(|r| r.next_seal_slot(len + TAG_LEN))
        else {
            self.stats.transmit_failures += 1;
            return;
        };
        let (ring, mut slot) = slot;
        slot.len = len;
        let held = (des, endpoint, (head_mr, head));
        let sealed = if self.protection() == Some(Protection::Encrypt) {
            self.encrypt_into_slot(held, (ring, slot), &header, epochs)
        } else {
            self.copy_and_seal(held, (ring, slot), &header, epochs)
        };
        if !sealed {
            self.stats.transmit_failures += 1;
            return;
        }
        self.queue_post(QueuedPost::data(route, des, slot, false));
    }

    /// Encrypts the datagram of `des` to `endpoint`, held as `head` and its
    /// caller's bytes, into `slot` (a tag longer than the datagram), reading
    /// the payload where it is; `false` if it could not be.
    fn encrypt_into_slot(
        &mut self,
        (des, endpoint, (head_mr, head)): (Descriptor, EndpointId, (MrHandle, Sge)),
        (ring, slot): (MrHandle, Sge),
        header: &rel::Repr,
        epochs: Epochs,
    ) -> bool {
        let sealer = (self.protection(), self.sender());
        let user = self.frags.user_bytes(des).map_or(&[][..], |(_, data)| data);
        let Some((head, out)) =
            head_and_slot(&mut self.ctx, (head_mr, head), (ring, slot), TAG_LEN)
        else {
            return false;
        };
        let Some((headers, payload)) = head.split_at_checked(SEALED_HEADER_LEN) else {
            return false;
        };
        out[..SEALED_HEADER_LEN].copy_from_slice(headers);
        let unsealed = Unsealed::Into {
            out,
            payload: (payload, user),
        };
        seal_to(
            &mut self.endpoints,
            sealer,
            endpoint,
            unsealed,
            header,
            epochs,
        )
    }

    /// Copies the datagram of `des` to `endpoint`, held as `head` and its
    /// caller's bytes, into `slot` and authenticates or checksums it there;
    /// `false` if it could not be.
    fn copy_and_seal(
        &mut self,
        (des, endpoint, (head_mr, head)): (Descriptor, EndpointId, (MrHandle, Sge)),
        (ring, slot): (MrHandle, Sge),
        header: &rel::Repr,
        epochs: Epochs,
    ) -> bool {
        let sealer = (self.protection(), self.sender());
        let user = self.frags.user_bytes(des).map_or(&[][..], |(_, data)| data);
        let Some((head, datagram)) = head_and_slot(&mut self.ctx, (head_mr, head), (ring, slot), 0)
        else {
            return false;
        };
        let Some((in_head, in_user)) = datagram.split_at_mut_checked(head.len()) else {
            return false;
        };
        if in_user.len() != user.len() {
            return false;
        }
        in_head.copy_from_slice(head);
        in_user.copy_from_slice(user);
        let unsealed = Unsealed::InPlace(&mut *datagram);
        if !seal_to(
            &mut self.endpoints,
            sealer,
            endpoint,
            unsealed,
            header,
            epochs,
        ) {
            return false;
        }
        checksum(datagram, &[], None, header);
        true
    }

    /// Sends an acknowledgement-only datagram from the ack ring, unsignaled:
    /// it needs no completion and no send credit.
    pub(super) fn transmit_ack(&mut self, endpoint: EndpointId, header: rel::Repr, epochs: Epochs) {
        let Some(route) = self.endpoints.route(endpoint) else {
            return;
        };
        let sealer = (self.protection(), self.sender());
        let Some(reliable) = self.path.reliable_mut() else {
            return;
        };
        let (ring, mut slot) = reliable.next_ack_slot();
        slot.len = payload_offset(header.flags);
        let Ok(bytes) = self.ctx.mr_bytes_mut(ring) else {
            return;
        };
        let buf = &mut bytes[slot.offset..slot.offset + slot.len];
        btl::Repr {
            tag: 0,
            job_key: route.header_job_key,
            reliable: true,
        }
        .emit(&mut btl::Packet::new_unchecked(&mut *buf));
        let unsealed = Unsealed::InPlace(&mut *buf);
        if !seal_to(
            &mut self.endpoints,
            sealer,
            endpoint,
            unsealed,
            &header,
            epochs,
        ) {
            self.stats.transmit_failures += 1;
            return;
        }
        checksum(buf, &[], None, &header);
        self.queue_post(QueuedPost {
            route,
            head: slot,
            user: None,
            wr_id: u64::MAX,
            signaled: false,
        });
    }
}

/// Writes `header` into `datagram`'s headers and, with `protection`, seals
/// it to `endpoint` as `own`; `false` if it must not be sent as it is
/// held.
fn seal_to(
    endpoints: &mut Endpoints,
    (protection, own): (Option<Protection>, Sender),
    endpoint: EndpointId,
    mut datagram: Unsealed<'_>,
    header: &rel::Repr,
    epochs: Epochs,
) -> bool {
    let Ok(mut ext) = datagram::extension_mut(datagram.headers()) else {
        return false;
    };
    header.emit(&mut ext);
    let Some(protection) = protection else {
        return true;
    };
    // `add_procs` never pairs a sealing module with a peer without a key.
    let Some(peer) = endpoints.get_mut(endpoint) else {
        return false;
    };
    let Some(peer_key) = peer.auth_key.as_deref().copied() else {
        return false;
    };
    let peer_qpn = peer.remote_qpn;
    let Some(pair) = PairSeal::of(&mut peer.seal) else {
        return false;
    };
    pair.seal(datagram, (&peer_key, peer_qpn), own, epochs, protection)
}

/// A datagram's head in its fragment's registration and its seal buffer in
/// the ring's, `extra` bytes longer than the slot, lent at once; `None` if
/// either range is not there.
fn head_and_slot<C: Context>(
    ctx: &mut C,
    (head_mr, head): (MrHandle, Sge),
    (ring, slot): (MrHandle, Sge),
    extra: usize,
) -> Option<(&[u8], &mut [u8])> {
    let (from, to) = ctx.mr_bytes_pair(head_mr, ring).ok()?;
    let head = from.get(head.offset..head.offset + head.len)?;
    let out = to.get_mut(slot.offset..slot.offset + slot.len + extra)?;
    Some((head, out))
}
