//! A received datagram on its way to the caller: which buffer holds it, and
//! what its headers said.

use udbtl_fabric::QpAddr;
use udbtl_wire::rel;

use crate::{EndpointId, Tag};

/// A datagram the application will hear about at its next progress call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Delivery {
    pub(super) held: Held,
    /// Header bytes in front of the payload.
    pub(super) header_len: usize,
    pub(super) tag: Tag,
    pub(super) endpoint: Option<EndpointId>,
    pub(super) src: QpAddr,
    /// Message bounds (reliability extension flags).
    pub(super) flags: u16,
}

impl Delivery {
    /// Whether the datagram is a whole message, not a piece of one.
    pub(super) const fn is_whole(&self) -> bool {
        let whole = rel::FLAG_FIRST | rel::FLAG_LAST;
        self.flags & (whole | rel::FLAG_ABORT) == whole
    }

    /// Whether the datagram claims to pack several whole messages (a
    /// [`coalesced`](udbtl_wire::coalesced) record list).
    pub(super) const fn is_coalesced(&self) -> bool {
        self.flags & rel::FLAG_COALESCED != 0
    }
}

/// A received datagram the module holds on to (while it waits for an
/// earlier one, or is being delivered): its buffer and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) slot: u32,
    pub(super) len: u32,
}
