//! The handle's descriptor calls: taking, preparing, filling and freeing
//! fragments, and registering the caller's memory.

use std::sync::Arc;

use parking_lot::MutexGuard;

use udbtl_fabric::Context;

use super::{Module, Segment};
use crate::convertor::Convertor;
use crate::error::BtlError;
use crate::frag::{DesFlags, Descriptor, LentBytes};
use crate::rcache::RegId;

impl<C: Context> Module<C> {
    /// A send fragment with room for `size` bytes, from the send free list.
    /// `None` if `size` exceeds the eager limit or the list is at its bound;
    /// the caller retries after completions return fragments.
    pub fn alloc(&self, order: u8, size: usize, flags: DesFlags) -> Option<Descriptor> {
        self.lock().alloc(order, size, flags)
    }

    /// Returns a descriptor the caller owns. A send fragment goes back to its
    /// list; a user fragment releases its registration first.
    ///
    /// # Errors
    /// A stale descriptor, or one still owned by the BTL (waiting or
    /// posted): a descriptor may only be freed after local completion.
    pub fn free(&self, des: Descriptor) -> Result<(), BtlError> {
        self.lock().free(des)
    }

    /// Prepares a descriptor holding `reserve` bytes for the caller's header
    /// followed by up to `*size` bytes from `convertor`; sets `*size` to the
    /// number of data bytes taken.
    ///
    /// Data is sent from user memory, without a copy, when the convertor is
    /// zero-copy capable (shared memory), `reserve` fits the user fragment's
    /// header room, and either `registration` is given or the data exceeds
    /// the eager limit. The data is then cut at the maximum datagram size, so
    /// a large buffer takes several calls. Otherwise the data is packed into
    /// a send fragment. Unlike the seed, the zero-copy branch returns a
    /// working descriptor, carries the BTL header in its own gather entry, and
    /// never exceeds one datagram.
    ///
    /// `None` when no fragment is free or `reserve` leaves no room.
    pub fn prepare_src(
        &self,
        registration: Option<RegId>,
        convertor: &mut Convertor<'_>,
        order: u8,
        reserve: usize,
        size: &mut usize,
        flags: DesFlags,
    ) -> Option<Descriptor> {
        self.lock()
            .prepare_src(registration, convertor, order, reserve, size, flags)
    }

    /// Prepares a descriptor that sends `lent`'s bytes without copying them,
    /// after `reserve` bytes of the caller's header (written through
    /// [`segment_ptr`](Self::segment_ptr) or [`segment_mut`](Self::segment_mut)).
    /// The memory is registered through the registration cache and read when
    /// the datagram is posted and whenever it is retransmitted, which is why
    /// [`LentBytes`] asks its owner to keep it unchanged until the send
    /// completes; the send callback always follows.
    ///
    /// # Errors
    /// `lent` back when the header and data are longer than the larger of a
    /// fragment and an `alloc` ([`Limits::frag_limit`](crate::Limits::frag_limit) and
    /// [`Limits::alloc_limit`](crate::Limits::alloc_limit); `reserve` at most
    /// [`USER_RESERVE_MAX`](crate::USER_RESERVE_MAX)), no
    /// user fragment is free, or the fabric refused the registration; the
    /// caller then copies instead.
    pub fn prepare_lent(
        &self,
        lent: Box<dyn LentBytes>,
        order: u8,
        reserve: usize,
        flags: DesFlags,
    ) -> Result<Descriptor, Box<dyn LentBytes>> {
        self.lock().prepare_lent(lent, order, reserve, flags)
    }

    /// Registers user memory through the registration cache (the module's
    /// `btl_mpool`), for callers that pass a registration to
    /// [`prepare_src`](Self::prepare_src). Release it with
    /// [`mpool_deregister`](Self::mpool_deregister).
    ///
    /// # Errors
    /// The fabric refused the registration.
    pub fn mpool_register(&self, data: &Arc<[u8]>) -> Result<RegId, BtlError> {
        self.lock().mpool_register(data)
    }

    /// Drops a reference taken by [`mpool_register`](Self::mpool_register).
    ///
    /// # Errors
    /// The registration holds no reference.
    pub fn mpool_deregister(&self, reg: RegId) -> Result<(), BtlError> {
        self.lock().mpool_deregister(reg)
    }

    /// The bytes after the BTL header that the caller fills: the reserve and,
    /// for a send fragment, the packed payload (`alloc`'s `size` bytes). The
    /// guard holds the module's lock: drop it before the next call.
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn segment_mut(&mut self, des: Descriptor) -> Result<Segment<'_>, BtlError> {
        let mut engine = self.lock();
        engine.segment_mut(des)?;
        // Checked just above, under the same lock: the empty slice is never
        // used.
        Ok(Segment(MutexGuard::map(engine, |e| {
            e.segment_mut(des).unwrap_or_default()
        })))
    }

    /// Sets the value handed back in the descriptor's
    /// [`SendEvent`](crate::SendEvent).
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn set_context(&self, des: Descriptor, context: u64) -> Result<(), BtlError> {
        self.lock().set_context(des, context)
    }

    /// Replaces the flags a descriptor was allocated with, e.g. when its
    /// owner decides only at send time whether the BTL frees it
    /// ([`DesFlags::BTL_OWNERSHIP`]).
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn set_flags(&self, des: Descriptor, flags: DesFlags) -> Result<(), BtlError> {
        self.lock().set_flags(des, flags)
    }

    /// Changes the length of an allocated send fragment's segment (at most
    /// what it was allocated with), e.g. after packing fewer bytes.
    ///
    /// # Errors
    /// A stale descriptor or a longer length.
    pub fn set_segment_len(&self, des: Descriptor, len: usize) -> Result<(), BtlError> {
        self.lock().set_segment_len(des, len)
    }

    /// Marks whether a descriptor starts and/or ends a message, for
    /// messages sent as several descriptors (the receiver delivers them as
    /// one). By default a descriptor is a whole message.
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn set_message_bounds(
        &self,
        des: Descriptor,
        first: bool,
        last: bool,
    ) -> Result<(), BtlError> {
        self.lock().set_message_bounds(des, first, last)
    }
}
