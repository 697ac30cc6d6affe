//! The fabric layer of udbtl: a model of InfiniBand Unreliable Datagram verbs.
//!
//! The BTL above is written once against [`Provider`] and [`Context`], which
//! mirror the verbs the original `btl_ofud` component used: device and port
//! discovery, protection domains, memory registration, completion queues, UD
//! queue pairs that step through INIT → RTR → RTS, address handles, posted
//! receives and batched sends.
//!
//! # Providers
//!
//! * [`udp`]: real. Each queue pair is a nonblocking UDP socket; a queue pair
//!   address is (IP, UDP port) where verbs would use (LID, QPN).
//! * [`sim`]: deterministic. An in-process fabric on virtual time with a
//!   seeded fault model (loss, duplication, reordering, corruption, MTU).
//! * [`ibv`]: real RDMA. UD queue pairs on InfiniBand or RoCE devices
//!   through libibverbs; needs the `verbs` cargo feature (off by default)
//!   to build and an RDMA device to run.
//! * [`faulty`]: a wrapper that injects loss, duplication and reordering into
//!   any provider, so real multi-process runs can be made lossy.
//!
//! [`AnyProvider`] wraps any of them as one type, for a program that
//! chooses its provider at run time; the contexts it opens are
//! [`AnyContext`]s (`Box<dyn Context>`).
//!
//! # UD semantics every provider keeps
//!
//! * A send larger than the port's `max_msg_size` is refused when posted.
//! * A datagram that arrives while its queue pair has no receive posted is
//!   dropped and counted ([`FabricStats::rx_no_buffer`]).
//! * A datagram whose queue key differs from the receiving queue pair's is
//!   dropped and counted ([`FabricStats::rx_bad_qkey`]).
//! * Neither delivery nor order is promised.
//! * Memory is checked as verbs would: a gather entry must lie inside a live
//!   registration of the sending context (unless the send is inline).
//!
//! # Memory ownership
//!
//! Receive buffers live in provider-owned registrations ([`Context::reg_mr`]);
//! the caller reads and writes them through [`Context::mr_bytes`] and
//! [`Context::mr_bytes_mut`]. A provider writes into a posted buffer only
//! while the caller is inside [`Context::poll_cq`], so the verbs rule "posted
//! memory belongs to the device until its completion is polled" cannot be
//! broken by safe code. Sends may also gather from caller memory registered
//! with [`Context::reg_user_mr`]; the provider has consumed the bytes when
//! `post_send` returns.
//!
//! # Waiting for completions
//!
//! [`Context::completion_channel`] gives a [`CompletionChannel`] (verbs'
//! `ibv_comp_channel`) on which a thread can sleep, without the context and
//! without its lock, until a completion queue may have completions, a timeout
//! passes or a [`Waker`] is woken. `udp` provides one; `sim`, on virtual
//! time, does not.
#![warn(missing_docs)]

mod bookkeeping;
mod boxed;
mod channel;
mod error;
pub mod faulty;
pub mod ibv;
pub mod memory;
pub mod sim;
mod table;
mod types;
pub mod udp;

pub use boxed::{AnyContext, AnyProvider};
pub use channel::{CompletionChannel, Waker, Wakeup};
pub use error::{FabricError, PostError, Result};
pub use table::{Handle, Table};
pub use types::*;

/// A source of devices: the `ibv_get_device_list`/`ibv_open_device` half of
/// verbs.
pub trait Provider {
    /// An opened device.
    type Context: Context + 'static;

    /// The provider's name, e.g. `udp`.
    fn name(&self) -> &'static str;

    /// Lists the devices this provider can open.
    ///
    /// # Errors
    /// The provider could not enumerate its devices.
    fn devices(&self) -> Result<Vec<DeviceInfo>>;

    /// Opens a device by name.
    ///
    /// # Errors
    /// [`FabricError::NoSuchDevice`] or a provider failure.
    fn open(&self, device: &str) -> Result<Self::Context>;
}

/// An opened device: the verbs that create resources, post work and poll
/// completions.
///
/// Resources are named by handles. Destroying a resource that others still
/// depend on fails with [`FabricError::Busy`], so teardown must run in the
/// verbs order: address handles and queue pairs, then completion queues and
/// registrations, then protection domains.
pub trait Context: Send {
    /// The device this context was opened on.
    fn device(&self) -> &DeviceInfo;

    /// Queries a port (numbered from 1).
    ///
    /// # Errors
    /// [`FabricError::NoSuchPort`].
    fn query_port(&self, port: u8) -> Result<PortAttr>;

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// A device limit was reached.
    fn alloc_pd(&mut self) -> Result<PdHandle>;

    /// Frees a protection domain that nothing uses any more.
    ///
    /// # Errors
    /// [`FabricError::Busy`] while registrations, queue pairs or address
    /// handles still belong to it.
    fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()>;

    /// Allocates and registers `len` zeroed bytes owned by the provider.
    /// Receive buffers must come from such registrations.
    ///
    /// # Errors
    /// Bad handle, zero length, or a device limit.
    fn reg_mr(&mut self, pd: PdHandle, len: usize) -> Result<Mr>;

    /// Registers caller memory for sending. Only the address range is
    /// recorded; the bytes are passed again, as [`Gather::User`], when posting.
    ///
    /// # Errors
    /// Bad handle, empty region, or a device limit.
    fn reg_user_mr(&mut self, pd: PdHandle, region: &[u8]) -> Result<Mr>;

    /// Deregisters memory.
    ///
    /// # Errors
    /// Bad handle.
    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()>;

    /// The bytes of a provider-owned registration.
    ///
    /// # Errors
    /// Bad handle, or a registration of caller memory.
    fn mr_bytes(&self, mr: MrHandle) -> Result<&[u8]>;

    /// The bytes of a provider-owned registration, writable.
    ///
    /// # Errors
    /// Bad handle, or a registration of caller memory.
    fn mr_bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8]>;

    /// The bytes of two different provider-owned registrations at once:
    /// `from`'s to read and `to`'s to write, so that one pass can read the
    /// one and write the other (an encryption out of place).
    ///
    /// # Errors
    /// A bad handle, the same registration twice, or a registration of
    /// caller memory.
    fn mr_bytes_pair(&mut self, from: MrHandle, to: MrHandle) -> Result<(&[u8], &mut [u8])>;

    /// Creates a completion queue with room for `depth` completions.
    ///
    /// # Errors
    /// Zero depth, or a device limit.
    fn create_cq(&mut self, depth: u32) -> Result<CqHandle>;

    /// Destroys a completion queue no queue pair uses.
    ///
    /// # Errors
    /// [`FabricError::Busy`] while queue pairs are attached.
    fn destroy_cq(&mut self, cq: CqHandle) -> Result<()>;

    /// Creates a UD queue pair in state RESET.
    ///
    /// # Errors
    /// Bad handles, capacities above the device limits.
    fn create_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo>;

    /// Moves a queue pair to the next state.
    ///
    /// # Errors
    /// [`FabricError::InvalidState`] for a transition out of order, or a bad
    /// port or partition key index.
    fn modify_qp(&mut self, qp: QpHandle, transition: &QpTransition) -> Result<()>;

    /// The queue pair's current state.
    ///
    /// # Errors
    /// Bad handle.
    fn qp_state(&self, qp: QpHandle) -> Result<QpState>;

    /// Destroys a queue pair; its posted receives are discarded.
    ///
    /// # Errors
    /// Bad handle.
    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()>;

    /// Creates an address handle for a remote port.
    ///
    /// # Errors
    /// Bad handle, an address of another provider, or a bad local port.
    fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle>;

    /// Destroys an address handle.
    ///
    /// # Errors
    /// Bad handle.
    fn destroy_ah(&mut self, ah: AhHandle) -> Result<()>;

    /// Posts receive buffers, in order. Each buffer must be at least
    /// [`GRH_LEN`] bytes.
    ///
    /// # Errors
    /// The first refused request, with the number accepted before it.
    fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError>;

    /// Checks a send as [`post_send`](Self::post_send) would (queue pair
    /// state, length against the port MTU, inline limit, memory keys, send
    /// and completion queue room) without posting it, and returns its
    /// payload length. A wrapper that decides a send's fate itself (the
    /// [`faulty`] provider) uses it to refuse exactly what the provider
    /// refuses.
    ///
    /// # Errors
    /// What `post_send` would refuse the request with.
    fn check_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize>;

    /// Posts sends, in order. A provider may transmit a batch with one
    /// system call. Each request is checked (queue pair in RTS, length against
    /// the port MTU, inline limit, memory keys, send queue room) before any
    /// byte of it leaves.
    ///
    /// # Errors
    /// The first refused request, with the number accepted before it.
    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError>;

    /// Polls up to `out.len()` completions into `out` and returns how many
    /// were written. Receives are delivered during this call.
    ///
    /// # Errors
    /// Bad handle, or a provider failure that is not a per-datagram loss.
    fn poll_cq(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize>;

    /// A channel to wait on for completions of `cq` (`ibv_create_comp_channel`
    /// with the CQ bound to it), or `None` when the provider cannot block a
    /// thread until something arrives.
    ///
    /// [`CompletionChannel::wait`] returns [`Wakeup::Ready`] when a queue pair
    /// whose receive completion queue is `cq` has a datagram waiting to be
    /// read, so that [`poll_cq`](Self::poll_cq) may yield a completion. This
    /// is level-triggered (a datagram left unread keeps every wait ready) and
    /// may be spurious: the datagram may be dropped by the poll (no posted
    /// receive, a bad key, a queue pair not yet in RTR), or another thread
    /// may have polled it first. Completions already in the queue (send
    /// completions, receives pulled in but not yet returned) do not make the
    /// channel ready, so poll the queue empty before waiting. Queue pairs
    /// created on `cq` after the channel are covered; destroyed ones stop
    /// being watched.
    ///
    /// The channel is `Send + Sync` and holds no borrow of, or lock on, the
    /// context: one thread may wait on it while another uses the context,
    /// and it stays valid (watching nothing) after the context is dropped.
    /// Each call makes a new, independent channel.
    ///
    /// `udp` returns a channel over epoll. `sim` returns `None`: its
    /// datagrams move only when the simulation's virtual clock is driven, so
    /// a thread blocked on real time would wait for nothing. `faulty` returns
    /// its wrapped provider's answer; completions the wrapper completes
    /// itself (dropped or held sends) never make the channel ready.
    ///
    /// # Errors
    /// Bad handle, or the provider could not create the channel.
    fn completion_channel(&mut self, cq: CqHandle) -> Result<Option<CompletionChannel>>;

    /// The provider's clock: monotonic time since an epoch the provider
    /// fixes. `udp` reads the host's monotonic clock (no system call: the
    /// vDSO); `sim` reads its network's virtual time, so everything timed
    /// above the fabric (retransmission, acknowledgement delay, peer
    /// failure) runs on virtual time in simulation. Contexts of one provider
    /// share one epoch.
    fn now(&self) -> core::time::Duration;

    /// Datagram counters.
    fn stats(&self) -> FabricStats;

    /// Live resources, for leak checks.
    fn resources(&self) -> ResourceCounts;
}
