//! The module as its caller holds it: a handle on the engine, which lives
//! behind a lock, and the caller's callbacks, which never leave the
//! caller's own calls.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use sync_wrapper::SyncWrapper;
use udbtl_fabric::{Context, PortAttr, QpAddr};
use udbtl_wire::datagram::AuthKey;
use udbtl_wire::modex;

use super::events::{Callbacks, Notice};
use super::helper::Helper;
use super::{
    AddProcs, Engine, ErrorCallback, HostEvent, Limits, ModuleStats, Polled, RecvCallback,
    SendCallback, SendStatus,
};
use crate::convertor::Convertor;
use crate::error::BtlError;
use crate::frag::{DesFlags, Descriptor, LentBytes};
use crate::params::Params;
use crate::rcache::{RegCacheStats, RegId};
use crate::{EndpointId, Tag};

/// One module per active port.
///
/// The module's state (the fabric context, fragments, endpoints, the
/// reliability state) sits behind a lock that every call takes briefly, so
/// that servicing the fabric never depends on one thread. The caller's
/// callbacks run only inside its own [`progress`](Self::progress) calls, in
/// the order their events happened.
pub struct Module<C: Context> {
    pub(super) engine: Arc<Mutex<Engine<C>>>,
    /// Reached only through `&mut self`, so sharing the module between
    /// threads (a host calling its `&self` methods) shares no callback.
    callbacks: SyncWrapper<Callbacks>,
    port: PortAttr,
    device: String,
    /// The application's progress calls so far, published for the helper.
    activity: Arc<AtomicU64>,
    /// Services the fabric while the application is away; `None` when
    /// `progress_thread` is off, the module is unreliable, or the fabric
    /// cannot wait (the simulator).
    helper: Option<Helper>,
}

impl<C: Context> fmt::Debug for Module<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.device)
            .field("port", &self.port.port_num)
            .finish_non_exhaustive()
    }
}

/// The bytes of a descriptor's segment, borrowed from the module: writable
/// while this guard lives, which holds the module's lock.
pub struct Segment<'a>(MappedMutexGuard<'a, [u8]>);

impl fmt::Debug for Segment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("len", &self.0.len())
            .finish()
    }
}

impl Deref for Segment<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for Segment<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl<C: Context> Module<C> {
    /// Builds a module on `port` of an opened device, in the seed's order:
    /// protection domain, registration cache, completion queue of depth
    /// `rd_num + sd_num`, [`NUM_QP`](crate::NUM_QP) queue pairs moved to
    /// RTS, `rd_num` receive buffers posted at once, then the send and user
    /// free lists. A failure unwinds what was built, in reverse, and hands
    /// the context back with the error.
    ///
    /// # Errors
    /// The failing step and its verbs error.
    pub fn new(ctx: C, port: u8, params: &Params) -> Result<Self, (C, BtlError)>
    where
        C: 'static,
    {
        let mut engine = Engine::new(ctx, port, params)?;
        // An unreliable module has nothing to service, and a fabric that
        // cannot wait on real time (the simulator) must not be serviced on
        // it.
        let wants_helper = params.progress_thread && engine.reliable.is_some() && {
            let cq = engine.cq;
            matches!(engine.ctx.completion_channel(cq), Ok(Some(_)))
        };
        let mut module = Self {
            port: engine.port.clone(),
            device: engine.device.clone(),
            engine: Arc::new(Mutex::new(engine)),
            callbacks: SyncWrapper::new(Callbacks::new()),
            activity: Arc::default(),
            helper: None,
        };
        if wants_helper {
            match Helper::start(
                module.engine.clone(),
                module.activity.clone(),
                Duration::from_millis(u64::from(params.peer_timeout)),
            ) {
                Ok(helper) => module.helper = Some(helper),
                Err(err) => tracing::warn!(%err, "could not start the progress helper thread"),
            }
        }
        Ok(module)
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Engine<C>> {
        self.engine.lock()
    }

    /// Releases everything, in the verbs order: address handles, queue
    /// pairs, completion queue, registrations (fragments, receive buffers,
    /// cache), protection domain. Events not reported yet are reported
    /// first. Returns the fabric context.
    ///
    /// # Errors
    /// Descriptors still owned by the caller, cached registrations still
    /// referenced, or a fabric refusal: each is a leak the caller should
    /// hear about. Teardown still goes as far as it can.
    pub fn finalize(mut self) -> Result<C, (C, BtlError)> {
        // Stopped and joined first: then the module holds the only reference
        // to its engine.
        self.helper = None;
        run_notices(&mut self.engine.lock(), self.callbacks.get_mut());
        let engine = match Arc::try_unwrap(self.engine) {
            Ok(engine) => engine.into_inner(),
            Err(_) => unreachable!("the helper, the only other holder, was joined"),
        };
        engine.finalize()
    }

    // ----- addressing ---------------------------------------------------

    /// This module's published address.
    pub fn address(&self) -> modex::Address {
        self.lock().address()
    }

    /// Turns peers' published addresses into endpoints. `peers[i]` is peer
    /// `i`'s address list, or `None` if it published nothing. A peer with no
    /// address on this module's network is unreachable through this module;
    /// that is not an error for the whole call (a seed bug).
    ///
    /// # Errors
    /// A verbs failure creating an address handle; endpoints created before
    /// it are released.
    pub fn add_procs(&self, peers: &[Option<&[modex::Address]>]) -> Result<AddProcs, BtlError> {
        self.lock().add_procs(peers)
    }

    /// Creates an endpoint for a peer module whose queue pairs are `qps`
    /// (the first receives; datagrams from any of them are recognised as the
    /// peer's) in process `proc_id`, with an address handle built with the
    /// service level and path bits parameters. `auth_key` is the peer's
    /// receive key, which a module with `auth` needs to send to it.
    ///
    /// # Errors
    /// The address handle could not be created.
    pub fn add_endpoint(
        &self,
        qps: [QpAddr; modex::QPNS],
        proc_id: u32,
        auth_key: Option<AuthKey>,
    ) -> Result<EndpointId, BtlError> {
        self.lock().add_endpoint(qps, proc_id, auth_key)
    }

    /// Releases endpoints and their address handles. Sends waiting for a
    /// credit to them complete with an error first, through the send
    /// callback.
    ///
    /// # Errors
    /// An unknown endpoint, or an address handle the fabric refused to free.
    pub fn del_procs(&mut self, endpoints: &[EndpointId]) -> Result<(), BtlError> {
        let mut engine = self.engine.lock();
        let result = engine.del_procs(endpoints);
        run_notices(&mut engine, self.callbacks.get_mut());
        result
    }

    /// Attaches a value of the caller's to an endpoint (the peer's rank,
    /// say); receive callbacks get it back as
    /// [`RecvEvent::endpoint_context`](super::RecvEvent::endpoint_context),
    /// so mapping a sender costs no lookup.
    ///
    /// # Errors
    /// An unknown endpoint.
    pub fn set_endpoint_context(&self, endpoint: EndpointId, context: u64) -> Result<(), BtlError> {
        self.lock().set_endpoint_context(endpoint, context)
    }

    /// Marks an endpoint's peer as a process of another job, whose
    /// datagrams carry `job_key` (dynamic processes: a spawned job, or one
    /// met through connect/accept): its datagrams are accepted from that
    /// peer, and datagrams carrying that key from anyone else are not. This
    /// module's own datagrams keep carrying its own key.
    ///
    /// # Errors
    /// An unknown endpoint.
    pub fn set_endpoint_job(&self, endpoint: EndpointId, job_key: u32) -> Result<(), BtlError> {
        self.lock().set_endpoint_job(endpoint, job_key)
    }

    /// The value attached to an endpoint with
    /// [`set_endpoint_context`](Self::set_endpoint_context), if any.
    pub fn endpoint_context(&self, endpoint: EndpointId) -> Option<u64> {
        self.lock().endpoints.context(Some(endpoint))
    }

    /// The remote queue pair of an endpoint.
    pub fn endpoint_addr(&self, endpoint: EndpointId) -> Option<QpAddr> {
        self.lock().endpoint_addr(endpoint)
    }

    /// Names this process for its peers: the id published in the modex and
    /// carried in every reliable datagram, by which receivers tell it from
    /// another process that reuses its address, and look up a sender they
    /// do not know yet. A launcher sets it from the process's rank, which is
    /// unique in the job (the job key tells jobs apart); left unset it is
    /// random. Set it before publishing the modex.
    pub fn set_process_id(&self, id: u32) {
        self.lock().proc_id = id;
    }

    /// This module's process id, as published in the modex and carried in
    /// every reliable datagram.
    pub fn process_id(&self) -> u32 {
        self.lock().proc_id
    }

    /// Process ids (as published in the modex) of senders this module does
    /// not know yet, collected since the last call. A caller that fetches
    /// addresses lazily connects to them; their retransmissions are then
    /// accepted.
    pub fn take_unknown_peers(&self) -> Vec<u32> {
        self.lock().take_unknown_peers()
    }

    // ----- descriptors --------------------------------------------------

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
    /// `lent` back when the header and data do not fit one datagram
    /// (`reserve` at most [`USER_RESERVE_MAX`](crate::USER_RESERVE_MAX)), no
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
    /// [`SendEvent`](super::SendEvent).
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

    // ----- sending and progress -----------------------------------------

    /// Sends a descriptor to an endpoint with `tag`. The BTL owns the
    /// descriptor until the send callback reports its completion.
    ///
    /// With no send credit free, the descriptor waits in the module's queue
    /// and is posted when a send completion returns a credit. Each peer's
    /// datagrams leave by one queue pair; peers are striped over them.
    ///
    /// # Errors
    /// A stale or busy descriptor, an unknown endpoint, or a post the fabric
    /// refused; in every case the descriptor is back in the caller's hands
    /// and no credit is lost (the seed swallowed post failures).
    pub fn send(
        &self,
        endpoint: EndpointId,
        des: Descriptor,
        tag: Tag,
    ) -> Result<SendStatus, BtlError> {
        self.lock().send(endpoint, des, tag)
    }

    /// Reads the fabric's clock, then polls the completion queue once, for
    /// up to [`NUM_WC`](crate::NUM_WC) completions, fires the reliability
    /// timers that are due, and runs the callbacks for everything that
    /// happened since the last call (deliveries in order, send completions,
    /// errors), reposting each receive buffer after its callback. An error
    /// completion is counted and handled in place; the rest of the batch is
    /// still processed (the seed returned at the first one and leaked the
    /// batch's receive buffers).
    ///
    /// Returns the number of completions handled, counting as well the
    /// events the helper thread queued while the application was away.
    pub fn progress(&mut self) -> usize {
        self.activity.fetch_add(1, Ordering::Relaxed);
        let mut engine = self.engine.lock();
        let queued = engine.notices.len();
        let polled = engine.progress(true);
        run_notices(&mut engine, self.callbacks.get_mut());
        queued + polled
    }

    /// [`progress`](Self::progress) for a host that runs its callbacks
    /// itself (see [`HostEvent`]): the same pass over the fabric, but instead
    /// of running callbacks it leaves the events for
    /// [`next_event`](Self::next_event). Returns the completions handled and
    /// the events waiting, and whether the module is idle.
    pub fn poll(&self) -> Polled {
        self.activity.fetch_add(1, Ordering::Relaxed);
        let mut engine = self.engine.lock();
        let polled = engine.progress(true);
        Polled {
            handled: polled + engine.notices.len(),
            idle: polled == 0 && engine.is_idle(),
        }
    }

    /// The oldest event a host's callbacks must hear, if any. Callbacks
    /// registered on this handle are not run for it. Hand it back with
    /// [`finish`](Self::finish) once its callback ran; the module is unlocked
    /// meanwhile, so the callback may call the module.
    pub fn next_event(&self) -> Option<HostEvent> {
        self.lock().next_host_event()
    }

    /// Releases what `event` held: a received buffer goes back to the pool
    /// (posted again by the next progress), an owned sent descriptor is
    /// freed.
    pub fn finish(&self, event: HostEvent) {
        self.lock().finish_host_event(event, true);
    }

    /// [`finish`](Self::finish) for a received message that no host
    /// callback took (nothing registered for its tag): counted as
    /// `recv_no_callback` rather than delivered, as [`progress`](Self::progress)
    /// counts it.
    pub fn finish_unclaimed(&self, event: HostEvent) {
        self.lock().finish_host_event(event, false);
    }

    /// Where a descriptor's segment (see [`segment_mut`](Self::segment_mut))
    /// lives, and its length, for a host that fills it without holding the
    /// module's lock. The memory is registered with the fabric and stays at
    /// this address until the descriptor is freed; the caller may write it
    /// while it owns the descriptor, that is until it sends it.
    ///
    /// # Errors
    /// A stale descriptor.
    pub fn segment_ptr(&self, des: Descriptor) -> Result<(*mut u8, usize), BtlError> {
        let mut engine = self.lock();
        let segment = engine.segment_mut(des)?;
        Ok((segment.as_mut_ptr(), segment.len()))
    }

    /// Services the fabric as the helper thread does while the application
    /// is away: acknowledgements, retransmissions, credit, the peer-failure
    /// clock; in-order data is kept for the next `progress` and no callback
    /// runs. For drivers of a simulated fabric, which has no helper thread,
    /// to play a rank that is busy computing.
    pub fn service(&mut self) -> usize {
        self.lock().progress(false)
    }

    /// Whether a helper thread services this module while the application is
    /// away.
    pub fn has_helper(&self) -> bool {
        self.helper.is_some()
    }

    /// Installs the receive callback for `tag`, replacing any earlier one.
    pub fn register(&mut self, tag: Tag, callback: RecvCallback) {
        self.callbacks.get_mut().recv[usize::from(tag.0)] = Some(callback);
    }

    /// Installs the callback that reports send completions.
    pub fn set_send_callback(&mut self, callback: SendCallback) {
        self.callbacks.get_mut().send = Some(callback);
    }

    /// Installs the error callback (`btl_register_error`).
    pub fn register_error(&mut self, callback: ErrorCallback) {
        self.callbacks.get_mut().error = Some(callback);
    }

    /// Descriptors sent reliably and not yet acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.lock().unacknowledged()
    }

    /// Progresses until every reliable send is acknowledged (or failed with
    /// its lost peer), or `limit` passes on the fabric's clock; returns
    /// whether nothing is left unacknowledged. A fabric whose clock stands
    /// still (a simulation nobody drives) ends the wait too.
    pub fn quiesce(&mut self, limit: Duration) -> bool {
        let mut wait = super::wait::Wait::new(self.now(), limit);
        while self.unacknowledged() > 0 {
            let handled = self.progress();
            if wait.over(self.now(), handled) {
                return false;
            }
        }
        true
    }

    /// The fabric's clock.
    pub(super) fn now(&self) -> Duration {
        self.lock().ctx.now()
    }

    /// When the reliability state next needs a progress call even if nothing
    /// arrives, on the fabric's clock; `None` when no timer is armed. A
    /// driver of a simulated fabric advances time to it.
    pub fn next_deadline(&mut self) -> Option<Duration> {
        self.lock().next_deadline()
    }

    // ----- diagnostics --------------------------------------------------

    /// Sizes this module works with.
    ///
    /// They may shrink once, when a peer whose port takes smaller datagrams
    /// is added (see [`add_procs`](Self::add_procs)).
    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// The port this module drives.
    pub const fn port(&self) -> &PortAttr {
        &self.port
    }

    /// The device name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Counters.
    pub fn stats(&self) -> ModuleStats {
        self.lock().stats
    }

    /// The reliability layer's counters (retransmissions, peers lost, ...);
    /// `None` when the module is unreliable.
    pub fn reliability_stats(&self) -> Option<udbtl_reliability::Stats> {
        self.lock().reliable.as_ref().map(|r| *r.core.stats())
    }

    /// Registration cache counters.
    pub fn rcache_stats(&self) -> RegCacheStats {
        self.lock().rcache.stats()
    }

    /// Runs `f` on the fabric context, for its counters, under the module's
    /// lock.
    pub fn with_context<R>(&self, f: impl FnOnce(&C) -> R) -> R {
        f(&self.lock().ctx)
    }

    /// Descriptors waiting for a send credit.
    pub fn pending_len(&self) -> usize {
        self.lock().sends.len()
    }

    /// Send credits free.
    pub fn send_credits(&self) -> u32 {
        self.lock().sends.credits()
    }

    /// Checkpoint/restart notification. There is no checkpoint support, so
    /// every state is accepted and nothing happens, as in the seed.
    pub fn ft_event(&mut self, state: i32) {
        tracing::debug!(state, "ft_event ignored: no checkpoint/restart support");
    }
}

impl<C: Context> fmt::Display for Module<C> {
    /// The module's state for humans (`btl_dump`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.lock(), f)
    }
}

/// Runs the callbacks for every queued notice, in order, reposting each
/// delivered buffer after its callback; returns how many ran.
fn run_notices<C: Context>(engine: &mut Engine<C>, callbacks: &mut Callbacks) -> usize {
    let mut ran = 0;
    while let Some(notice) = engine.notices.pop_front() {
        ran += 1;
        match notice {
            Notice::Datagram(delivery) => engine.deliver(callbacks, delivery),
            Notice::Sent { event, owned } => {
                if let Some(callback) = callbacks.send.as_mut() {
                    callback(&event);
                }
                if owned {
                    engine.release(event.descriptor);
                }
            }
            Notice::Error(event) => {
                if let Some(callback) = callbacks.error.as_mut() {
                    callback(&event);
                }
            }
        }
    }
    if ran > 0 {
        engine.flush_reposts();
    }
    ran
}

/// A module may be shared between threads: its `&self` methods lock the
/// engine, and its callbacks are reached only through `&mut self`.
const _: () = {
    const fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<Module<udbtl_fabric::udp::UdpContext>>();
};
