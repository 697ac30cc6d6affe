//! The module's calls for a host that runs its callbacks itself (see
//! [`HostEvent`]): adding one peer, deleting peers and sending, each under
//! one lock.

use udbtl_fabric::Context;

use super::Module;
use crate::error::BtlError;
use crate::frag::{DesFlags, Descriptor};
use crate::module::SendStatus;
#[cfg(doc)]
use crate::module::{HostEvent, SendEvent};
use crate::{EndpointId, Tag};

/// Everything a host decides about a send at send time, for
/// [`Module::send_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendArgs {
    /// Bytes of the descriptor's segment to send (at most what it was
    /// allocated or prepared with).
    pub len: usize,
    /// The tag the receiver's callback is chosen by.
    pub tag: Tag,
    /// The descriptor's flags from now on (e.g. whether the BTL frees it).
    pub flags: DesFlags,
    /// The value handed back in its [`SendEvent`].
    pub context: u64,
}

impl<C: Context> Module<C> {
    /// Whether one of a peer's published addresses is on this module's
    /// network, so that [`add_procs`](Self::add_procs) would reach it.
    pub fn reaches(&self, addresses: &[udbtl_wire::modex::Address]) -> bool {
        self.lock().pick_address(addresses).is_some()
    }

    /// Adds one peer for a host, under one lock: its endpoint (see
    /// [`add_procs`](Self::add_procs)), marked as a process of the job whose
    /// datagrams carry `job_key` (see [`set_endpoint_job`](Self::set_endpoint_job)),
    /// with `context` attached unless the endpoint existed already. Returns
    /// the endpoint and the context in force: another caller's, when it had
    /// added the peer first (two threads, or an add made from inside
    /// another). `None` when this module does not reach the peer.
    ///
    /// # Errors
    /// As [`add_procs`](Self::add_procs).
    pub fn add_peer(
        &self,
        addresses: &[udbtl_wire::modex::Address],
        job_key: u32,
        context: u64,
    ) -> Result<Option<(EndpointId, u64)>, BtlError> {
        let mut engine = self.lock();
        let added = engine.add_procs(&[Some(addresses)])?;
        let Some(endpoint) = added.endpoints.first().copied().flatten() else {
            return Ok(None);
        };
        if let Some(existing) = engine.endpoints.context(Some(endpoint)) {
            return Ok(Some((endpoint, existing)));
        }
        engine.set_endpoint_context(endpoint, context)?;
        engine.set_endpoint_job(endpoint, job_key)?;
        Ok(Some((endpoint, context)))
    }

    /// [`del_procs`](Self::del_procs) for a host that runs its callbacks
    /// itself: sends that fail because their endpoint goes are left as
    /// events for [`next_event`](Self::next_event).
    ///
    /// # Errors
    /// As [`del_procs`](Self::del_procs).
    pub fn del_procs_host(&self, endpoints: &[EndpointId]) -> Result<(), BtlError> {
        self.lock().del_procs(endpoints)
    }

    /// [`set_segment_len`](Self::set_segment_len),
    /// [`set_context`](Self::set_context), [`set_flags`](Self::set_flags)
    /// and [`send`](Self::send) in one call, under one lock: a host's send.
    ///
    /// # Errors
    /// As those calls; on error the descriptor is back in the caller's hands.
    pub fn send_with(
        &self,
        endpoint: EndpointId,
        des: Descriptor,
        args: SendArgs,
    ) -> Result<SendStatus, BtlError> {
        let mut engine = self.lock();
        engine.set_segment_len(des, args.len)?;
        engine.set_context(des, args.context)?;
        engine.set_flags(des, args.flags)?;
        engine.send(endpoint, des, args.tag)
    }
}
