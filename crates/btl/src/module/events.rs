//! What the module tells its caller: the events its callbacks receive, and
//! the callbacks themselves.

use udbtl_fabric::QpAddr;

use super::delivery::Delivery;
use super::read::{ReadCallback, ReadEvent};
use crate::error::SendFailure;
use crate::frag::Descriptor;
use crate::{EndpointId, Tag};

/// What a receive callback sees. The payload is only valid during the
/// callback: its buffer is reposted as soon as the callback returns.
#[derive(Debug)]
pub struct RecvEvent<'a> {
    /// The tag the sender used.
    pub tag: Tag,
    /// The sender's endpoint on this module, if the sender was added.
    pub endpoint: Option<EndpointId>,
    /// The value the caller attached to that endpoint with
    /// [`Module::set_endpoint_context`](super::Module::set_endpoint_context)
    /// (a rank, say), if any.
    pub endpoint_context: Option<u64>,
    /// The sender's queue pair.
    pub src: QpAddr,
    /// The bytes after the BTL header.
    pub payload: &'a [u8],
}

/// What the send callback sees when a descriptor's send completes.
#[derive(Debug, Clone)]
pub struct SendEvent {
    /// The descriptor. If it carries
    /// [`DesFlags::BTL_OWNERSHIP`](crate::DesFlags::BTL_OWNERSHIP) the BTL
    /// frees it right after the callback, and the handle goes stale.
    pub descriptor: Descriptor,
    /// The endpoint it was sent to.
    pub endpoint: EndpointId,
    /// The caller's context value set with
    /// [`Module::set_context`](super::Module::set_context).
    pub context: u64,
    /// Whether the datagram left (unreliable) or was acknowledged
    /// (reliable).
    pub status: Result<(), SendFailure>,
}

/// What the error callback sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorEvent {
    /// `true` when the module can no longer be used.
    pub fatal: bool,
    /// The endpoint concerned, when the error is about one peer.
    pub endpoint: Option<EndpointId>,
    /// What happened.
    pub message: String,
}

/// A receive callback, registered per tag.
pub type RecvCallback = Box<dyn FnMut(&RecvEvent<'_>) + Send>;
/// The send completion callback.
pub type SendCallback = Box<dyn FnMut(&SendEvent) + Send>;
/// The error callback.
pub type ErrorCallback = Box<dyn FnMut(&ErrorEvent) + Send>;

/// How `send` disposed of a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Posted to a queue pair; the send callback follows its completion.
    Posted,
    /// No send credit was free: queued, to be posted when a send completion
    /// returns one.
    Queued,
}

/// Something the caller's callbacks must hear, queued by the engine (on
/// whichever thread serviced the fabric) and run by the application's next
/// progress call.
#[derive(Debug)]
pub(super) enum Notice {
    /// An in-order datagram: its buffer stays held until the callback ran.
    Datagram(Delivery),
    /// A descriptor's send is over; `owned` descriptors are freed after the
    /// callback.
    Sent { event: SendEvent, owned: bool },
    /// An error for the error callback.
    Error(ErrorEvent),
    /// A remote read is over.
    ReadDone(ReadEvent),
}

/// The caller's callbacks. They run only inside the caller's own calls
/// (`progress`, and `send` for sends refused from the queue).
pub(super) struct Callbacks {
    /// One slot per tag value.
    pub(super) recv: Vec<Option<RecvCallback>>,
    pub(super) send: Option<SendCallback>,
    pub(super) error: Option<ErrorCallback>,
    pub(super) read: Option<ReadCallback>,
}

impl Callbacks {
    pub(super) fn new() -> Self {
        Self {
            recv: (0..=u8::MAX).map(|_| None).collect(),
            send: None,
            error: None,
            read: None,
        }
    }
}
