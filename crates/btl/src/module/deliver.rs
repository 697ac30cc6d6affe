//! The one delivery path: what the caller's callbacks must hear, handed out
//! one event at a time.
//!
//! Every caller drives it the same way: [`Module::poll`], then a loop of
//! [`Module::next_event`] → callback → [`Module::finish`], which releases
//! what the event held. [`Module::progress`] runs that loop itself with the
//! callbacks registered on the module; a host that runs its callbacks
//! itself, with the module unlocked (a C MPI library, whose callbacks call
//! back into the module: ob1 sends from inside its receive and completion
//! callbacks), runs it through the three calls.

use udbtl_fabric::{Context, QpAddr};
use udbtl_wire::coalesced;

#[cfg(doc)]
use super::Module;
use super::delivery::{Delivery, Held};
use super::events::Notice;
use super::read::ReadEvent;
use super::{Engine, ErrorEvent, SendEvent};
use crate::error::SendFailure;
use crate::frag::{DesFlags, Descriptor, FragState};
use crate::{EndpointId, Tag};

/// What one [`Module::poll`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    /// Completions handled and events waiting for the host.
    pub handled: usize,
    /// Nothing arrived, no event waits, and the module holds no descriptor
    /// (so nothing is in flight or waiting to be sent): until the host
    /// sends again, only a peer can make work, and a host may poll such a
    /// module less often.
    pub idle: bool,
}

/// What a host's callbacks must hear, oldest first. Hand every event back to
/// [`Module::finish`](super::Module::finish): a received message's buffer
/// stays out of the receive pool, and an owned sent descriptor stays
/// allocated, until then.
#[derive(Debug)]
#[must_use = "an event holds a buffer or descriptor until it is handed to Module::finish"]
pub enum HostEvent {
    /// A message arrived.
    Received(Received),
    /// A descriptor's send is over. If `owned` (it carried
    /// [`DesFlags::BTL_OWNERSHIP`](crate::DesFlags::BTL_OWNERSHIP)),
    /// `finish` frees it.
    Sent {
        /// What the send callback would see.
        event: SendEvent,
        /// Whether the BTL frees the descriptor.
        owned: bool,
    },
    /// An error for the error callback.
    Error(ErrorEvent),
    /// A remote read ([`Module::read`](super::Module::read)) is over.
    ReadDone(ReadEvent),
}

/// A received message, whose bytes stay put until the event is finished.
#[derive(Debug)]
pub struct Received {
    /// The tag the sender used.
    pub tag: Tag,
    /// The sender's endpoint on this module, if the sender was added.
    pub endpoint: Option<EndpointId>,
    /// The value attached to that endpoint with
    /// [`Module::set_endpoint_context`](super::Module::set_endpoint_context).
    pub endpoint_context: Option<u64>,
    /// The sender's queue pair.
    pub src: QpAddr,
    payload: *const u8,
    len: usize,
    /// Where the payload starts in the held datagram (after the GRH).
    offset: usize,
    hold: Hold,
}

impl Received {
    /// The first byte after the BTL header. The `len` bytes from it stay
    /// valid and unchanged until this event is handed to
    /// [`Module::finish`](super::Module::finish) (the module never writes
    /// a held buffer, and a reassembled message is owned by the event), so a
    /// host may read them with the module unlocked, from its callback.
    pub const fn payload_ptr(&self) -> *const u8 {
        self.payload
    }

    /// The payload's length in bytes.
    pub const fn payload_len(&self) -> usize {
        self.len
    }
}

/// What a received message keeps from the module until it is finished.
#[derive(Debug)]
enum Hold {
    /// A receive buffer, out of the pool.
    Buffer(Held),
    /// One message of a coalesced datagram: a share of its receive buffer,
    /// which goes back to the pool with the last share.
    Record(Held),
    /// A message reassembled from several datagrams; its bytes.
    Message {
        endpoint: EndpointId,
        bytes: Vec<u8>,
    },
}

impl<C: Context> Engine<C> {
    /// Whether the module has nothing to do until a peer sends or the host
    /// does (see [`Polled::idle`]): no event waits and no descriptor is
    /// held, so no send is in flight, queued, or held back to carry others.
    pub(super) fn is_idle(&self) -> bool {
        self.notices.is_empty()
            && self.host_split.is_none()
            && self.frags.send.in_use() == 0
            && self.frags.user.in_use() == 0
            && self.reads.is_quiet()
    }

    /// The engine's side of `Module::next_event`, whose documentation is the
    /// contract.
    pub(super) fn next_host_event(&mut self) -> Option<HostEvent> {
        loop {
            if self.host_split.is_some() {
                if let Some(received) = self.next_record_for_host() {
                    return Some(HostEvent::Received(received));
                }
                continue;
            }
            match self.notices.pop_front()? {
                Notice::Datagram(delivery) if delivery.is_coalesced() => {
                    self.split_for_host(delivery);
                }
                Notice::Datagram(delivery) => {
                    if let Some(received) = self.receive_for_host(delivery) {
                        return Some(HostEvent::Received(received));
                    }
                }
                Notice::Sent { event, owned } => return Some(HostEvent::Sent { event, owned }),
                Notice::Error(event) => return Some(HostEvent::Error(event)),
                Notice::ReadDone(event) => return Some(HostEvent::ReadDone(event)),
            }
        }
    }

    /// A delivered datagram as a host event: itself when it is a whole
    /// message, the message it completes when it is a piece, or nothing
    /// (its buffer then goes back to the pool at once).
    fn receive_for_host(&mut self, delivery: Delivery) -> Option<Received> {
        let Delivery {
            held,
            header_len,
            tag,
            endpoint,
            src,
            flags,
        } = delivery;
        let endpoint_context = self.endpoints.context(endpoint);
        if delivery.is_whole() {
            if let Some(payload) = self
                .recv
                .datagram(&self.ctx, held)
                .and_then(|d| d.get(header_len..))
            {
                return Some(Received {
                    tag,
                    endpoint,
                    endpoint_context,
                    src,
                    payload: payload.as_ptr(),
                    len: payload.len(),
                    offset: header_len,
                    hold: Hold::Buffer(held),
                });
            }
            self.stats.recv_malformed += 1;
            self.return_buffer(held);
            return None;
        }
        let Some(endpoint) = endpoint else {
            self.stats.recv_orphan_pieces += 1;
            self.return_buffer(held);
            return None;
        };
        let message = self.add_piece(held, endpoint, tag, flags);
        self.return_buffer(held);
        let (tag, bytes) = message?;
        Some(Received {
            tag,
            endpoint: Some(endpoint),
            endpoint_context,
            src,
            payload: bytes.as_ptr(),
            len: bytes.len(),
            offset: 0,
            hold: Hold::Message { endpoint, bytes },
        })
    }

    /// Starts handing a host the messages of a coalesced datagram, one event
    /// each, from its buffer, which stays held until the last is finished.
    /// The record list is checked whole first: a malformed one is counted
    /// and dropped, none of it delivered.
    fn split_for_host(&mut self, delivery: Delivery) {
        let count = self
            .recv
            .datagram(&self.ctx, delivery.held)
            .and_then(|d| d.get(delivery.header_len..))
            .filter(|_| delivery.is_whole())
            .and_then(|p| coalesced::validate(p).ok());
        let slot = delivery.held.slot as usize;
        match (count, self.recv.shares.get_mut(slot)) {
            (Some(count), Some(shares)) => {
                *shares = count as u32;
                self.host_split = Some((delivery, 0, count));
            }
            _ => {
                self.stats.recv_malformed += 1;
                self.return_buffer(delivery.held);
            }
        }
    }

    /// The next message of the coalesced datagram being split, as a host
    /// event holding a share of its buffer.
    fn next_record_for_host(&mut self) -> Option<Received> {
        let (delivery, offset, remaining) = self.host_split.take()?;
        let record = self
            .recv
            .datagram(&self.ctx, delivery.held)
            .and_then(|d| d.get(delivery.header_len + offset..))
            .and_then(|rest| coalesced::Records::new(rest).next())
            .and_then(Result::ok);
        let Some(record) = record else {
            // Checked whole before the split began, so never; if it were,
            // the shares not handed out are given up.
            for _ in 0..remaining {
                self.release_share(delivery.held);
            }
            return None;
        };
        let record_offset = delivery.header_len + offset + coalesced::RECORD_HEADER_LEN;
        if remaining > 1 {
            let next = offset + coalesced::record_len(record.bytes.len());
            self.host_split = Some((delivery, next, remaining - 1));
        }
        Some(Received {
            tag: Tag(record.tag),
            endpoint: delivery.endpoint,
            endpoint_context: self.endpoints.context(delivery.endpoint),
            src: delivery.src,
            payload: record.bytes.as_ptr(),
            len: record.bytes.len(),
            offset: record_offset,
            hold: Hold::Record(delivery.held),
        })
    }

    /// Gives up one share of a coalesced datagram's buffer; the last one
    /// returns the buffer to the pool.
    fn release_share(&mut self, held: Held) {
        let Some(shares) = self.recv.shares.get_mut(held.slot as usize) else {
            return;
        };
        *shares = shares.saturating_sub(1);
        if *shares == 0 {
            self.return_buffer(held);
        }
    }

    /// The bytes of a received message, as [`Received::payload_ptr`] points
    /// at them: borrowed here, for a caller that holds the module.
    pub(super) fn payload<'a>(&'a self, received: &'a Received) -> &'a [u8] {
        match &received.hold {
            Hold::Message { bytes, .. } => bytes,
            // The event was made from these very bytes, and its buffer stays
            // held until `finish`: the lookup cannot miss.
            Hold::Buffer(held) | Hold::Record(held) => self
                .recv
                .datagram(&self.ctx, *held)
                .and_then(|d| d.get(received.offset..received.offset + received.len))
                .unwrap_or_default(),
        }
    }

    /// The engine's side of `Module::finish`, whose documentation is the
    /// contract.
    pub(super) fn finish_host_event(&mut self, event: HostEvent, claimed: bool) {
        match event {
            HostEvent::Received(Received { hold, .. }) => {
                if claimed {
                    self.stats.recvs_delivered += 1;
                } else {
                    self.stats.recv_no_callback += 1;
                }
                match hold {
                    Hold::Buffer(held) => self.return_buffer(held),
                    Hold::Record(held) => self.release_share(held),
                    Hold::Message { endpoint, bytes } => self.recycle_message(endpoint, bytes),
                }
            }
            HostEvent::Sent { event, owned } => {
                if owned {
                    self.release(event.descriptor);
                }
            }
            HostEvent::Error(_) | HostEvent::ReadDone(_) => {}
        }
    }

    /// Queues a delivered buffer for reposting (the next progress posts it).
    pub(super) fn return_buffer(&mut self, held: Held) {
        self.recv.repost(held.slot);
        self.held_for_app = self.held_for_app.saturating_sub(1);
    }
}

/// What the caller must hear, queued: deliveries, finished sends, errors.
impl<C: Context> Engine<C> {
    /// Runs the send callback for a descriptor the BTL is done with, then
    /// frees it if the BTL owns it.
    pub(super) fn complete_send(&mut self, des: Descriptor, status: Result<(), SendFailure>) {
        let Some(frag) = self.frags.get_mut(des) else {
            return;
        };
        if frag.internal {
            // The read protocol's own: a lost peer fails its reads.
            self.release(des);
            return;
        }
        frag.state = FragState::Allocated;
        let event = SendEvent {
            descriptor: des,
            endpoint: EndpointId(frag.endpoint),
            context: frag.context,
            status,
        };
        let owned = frag.flags.contains(DesFlags::BTL_OWNERSHIP);
        if event.status.is_err() {
            self.stats.send_errors += 1;
        }
        self.notices.push_back(Notice::Sent { event, owned });
    }

    pub(super) fn report_error(
        &mut self,
        endpoint: Option<EndpointId>,
        fatal: bool,
        message: String,
    ) {
        tracing::error!(device = %self.device, port = self.port.port_num, fatal, "{message}");
        self.notices.push_back(Notice::Error(ErrorEvent {
            fatal,
            endpoint,
            message,
        }));
    }

    /// Keeps an in-order datagram's buffer until the application's callback
    /// has seen it.
    pub(super) fn hold_for_app(&mut self, delivery: Delivery) {
        self.held_for_app += 1;
        self.notices.push_back(Notice::Datagram(delivery));
    }
}
