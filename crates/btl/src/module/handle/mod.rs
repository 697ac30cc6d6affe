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
use udbtl_wire::modex;

mod diagnostics;
mod fragments;
mod host;
mod read;

pub use host::SendArgs;

use super::events::Callbacks;
use super::helper::Helper;
use super::{
    AddProcs, Engine, ErrorCallback, HostEvent, Polled, RecvCallback, RecvEvent, SendCallback,
    SendStatus,
};
use crate::error::BtlError;
use crate::frag::Descriptor;
use crate::params::Params;
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
        let wants_helper = params.progress_thread && engine.path.is_reliable() && {
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
        run_events(&mut self.engine.lock(), self.callbacks.get_mut());
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

    /// Releases endpoints and their address handles. Sends waiting for a
    /// credit to them complete with an error first, through the send
    /// callback.
    ///
    /// # Errors
    /// An unknown endpoint, or an address handle the fabric refused to free.
    pub fn del_procs(&mut self, endpoints: &[EndpointId]) -> Result<(), BtlError> {
        let mut engine = self.engine.lock();
        let result = engine.del_procs(endpoints);
        run_events(&mut engine, self.callbacks.get_mut());
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
        run_events(&mut engine, self.callbacks.get_mut());
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
}

impl<C: Context> fmt::Display for Module<C> {
    /// The module's state for humans (`btl_dump`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.lock(), f)
    }
}

/// The one delivery path, with the callbacks registered on the module: each
/// event the engine hands out runs its callback and is finished at once,
/// which reposts a delivered buffer. Returns how many events ran.
fn run_events<C: Context>(engine: &mut Engine<C>, callbacks: &mut Callbacks) -> usize {
    let mut ran = 0;
    while let Some(event) = engine.next_host_event() {
        ran += 1;
        let claimed = match &event {
            HostEvent::Received(received) => {
                match callbacks.recv[usize::from(received.tag.0)].as_mut() {
                    Some(callback) => {
                        callback(&RecvEvent {
                            tag: received.tag,
                            endpoint: received.endpoint,
                            endpoint_context: received.endpoint_context,
                            src: received.src,
                            payload: engine.payload(received),
                        });
                        true
                    }
                    None => false,
                }
            }
            HostEvent::Sent { event, .. } => {
                if let Some(callback) = callbacks.send.as_mut() {
                    callback(event);
                }
                true
            }
            HostEvent::Error(event) => {
                if let Some(callback) = callbacks.error.as_mut() {
                    callback(event);
                }
                true
            }
            HostEvent::ReadDone(event) => {
                if let Some(callback) = callbacks.read.as_mut() {
                    callback(event);
                }
                true
            }
        };
        engine.finish_host_event(event, claimed);
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
