//! What leaves: a descriptor or an acknowledgement becomes a datagram here,
//! its headers stamped and, on a reliable module, sealed, then handed to the
//! transmit queue (`transmit.rs`), which posts it.

use udbtl_fabric::{Context, FabricError, Gather, PostError};
use udbtl_wire::datagram::Epochs;
use udbtl_wire::{btl, datagram, rel};

use super::Engine;
use super::integrity::seal;
use super::transmit::QueuedPost;
use crate::EndpointId;
use crate::error::SendFailure;
use crate::frag::{Descriptor, FragState};

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
                Some((header, epochs)) => self.transmit_data(waiting.des, header, epochs),
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
    /// once when that fills it).
    fn queue_post(&mut self, post: QueuedPost) {
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

    /// Writes the reliability header into a descriptor and posts it. A
    /// refusal is a loss to the protocol: the retransmission timer repairs
    /// it.
    pub(super) fn transmit_data(&mut self, des: Descriptor, mut header: rel::Repr, epochs: Epochs) {
        let Some(frag) = self.frags.get(des) else {
            return;
        };
        header.flags |= frag.msg_flags;
        let endpoint = EndpointId(frag.endpoint);
        let (Some(route), Some(peer)) =
            (self.endpoints.route(endpoint), self.endpoints.get(endpoint))
        else {
            self.stats.transmit_failures += 1;
            return;
        };
        let peer_key = peer.auth_key;
        let Some((mr, sge)) = self.frags.head(des, self.header_len + frag.seg_len) else {
            return;
        };
        let Ok(bytes) = self.ctx.mr_bytes_mut(mr.handle) else {
            return;
        };
        let head = &mut bytes[sge.offset..sge.offset + sge.len];
        let Ok(mut ext) = datagram::extension_mut(head) else {
            return;
        };
        header.emit(&mut ext);
        let user = self.frags.user_bytes(des);
        // Taken as the segment was written, if it still covers all of it.
        let payload_crc = frag
            .segment_crc
            .filter(|c| user.is_none() && c.len == frag.seg_len)
            .map(|c| c.crc);
        if !seal(
            head,
            &[user.map_or(&[][..], |(_, data)| data)],
            payload_crc,
            &header,
            peer_key,
            epochs,
        ) {
            self.stats.transmit_failures += 1;
            return;
        }
        let user = user.is_some().then_some(des);
        self.queue_post(QueuedPost {
            route,
            head: sge,
            user,
            wr_id: u64::from(des.raw()),
            signaled: true,
        });
    }

    /// Sends an acknowledgement-only datagram from the ack ring, unsignaled:
    /// it needs no completion and no send credit.
    pub(super) fn transmit_ack(&mut self, endpoint: EndpointId, header: rel::Repr, epochs: Epochs) {
        let (Some(route), Some(peer)) =
            (self.endpoints.route(endpoint), self.endpoints.get(endpoint))
        else {
            return;
        };
        let peer_key = peer.auth_key;
        let Some(reliable) = self.path.reliable_mut() else {
            return;
        };
        let (ring, slot) = reliable.next_ack_slot();
        let Ok(bytes) = self.ctx.mr_bytes_mut(ring) else {
            return;
        };
        let buf = &mut bytes[slot.offset..slot.offset + slot.len];
        btl::Repr {
            tag: 0,
            job_key: self.job_key,
            reliable: true,
        }
        .emit(&mut btl::Packet::new_unchecked(&mut *buf));
        let Ok(mut ext) = datagram::extension_mut(buf) else {
            return;
        };
        header.emit(&mut ext);
        if !seal(buf, &[], None, &header, peer_key, epochs) {
            self.stats.transmit_failures += 1;
            return;
        }
        self.queue_post(QueuedPost {
            route,
            head: slot,
            user: None,
            wr_id: u64::MAX,
            signaled: false,
        });
    }
}
