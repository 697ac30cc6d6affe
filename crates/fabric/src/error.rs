use std::io;

use crate::types::{LKey, QpState};

/// A verbs call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// No device of that name.
    #[error("no device named {name:?} on provider {provider}")]
    NoSuchDevice {
        /// Provider searched.
        provider: &'static str,
        /// Name asked for.
        name: String,
    },
    /// The device has no such port.
    #[error("device {device} has no port {port}")]
    NoSuchPort {
        /// Device name.
        device: String,
        /// Port asked for.
        port: u8,
    },
    /// A handle named a resource that does not exist (never created, already
    /// destroyed, or belonging to another context).
    #[error("invalid {kind} handle")]
    InvalidHandle {
        /// Resource kind.
        kind: &'static str,
    },
    /// A resource cannot be destroyed while others still use it.
    #[error("{kind} is still in use by {users} {user_kind}")]
    Busy {
        /// Resource being destroyed.
        kind: &'static str,
        /// How many dependants remain.
        users: usize,
        /// Kind of the dependants.
        user_kind: &'static str,
    },
    /// A queue pair operation is not allowed in its current state.
    #[error("queue pair {qp_num} is in state {state:?}, which does not allow {operation}")]
    InvalidState {
        /// The queue pair.
        qp_num: u32,
        /// Its state.
        state: QpState,
        /// What was attempted.
        operation: &'static str,
    },
    /// An argument is outside what the device allows.
    #[error("invalid {what}: {detail}")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
        /// Why it was refused.
        detail: String,
    },
    /// A datagram is larger than the port's maximum message size.
    #[error("datagram of {len} bytes exceeds the maximum of {max}")]
    MessageTooLong {
        /// Requested length.
        len: usize,
        /// The port's maximum message size.
        max: usize,
    },
    /// Inline data exceeds the queue pair's inline limit.
    #[error("{len} bytes of inline data exceed the limit of {max}")]
    InlineTooLong {
        /// Requested length.
        len: usize,
        /// The granted inline limit.
        max: usize,
    },
    /// A work request names memory that is not registered, or reaches
    /// outside its registration.
    #[error("memory access outside registration {lkey:?}")]
    ProtectionError {
        /// The key presented.
        lkey: LKey,
    },
    /// A work queue or completion queue is full.
    #[error("{queue} is full ({capacity} entries)")]
    QueueFull {
        /// Which queue.
        queue: &'static str,
        /// Its capacity.
        capacity: usize,
    },
    /// A device limit was reached.
    #[error("out of {what} (limit {limit})")]
    ResourceExhausted {
        /// The resource.
        what: &'static str,
        /// The device limit.
        limit: u32,
    },
    /// The device went away or failed (`ENODEV`, or a fatal asynchronous
    /// event): nothing more can be done with it.
    #[error("device {device} is unavailable: {reason}")]
    DeviceLost {
        /// Device name.
        device: String,
        /// What happened.
        reason: String,
    },
    /// A system call failed.
    #[error("{operation} failed")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// A failed `post_send`/`post_recv`: the first `posted` work requests were
/// accepted, the one after them failed with `error`, and the rest were not
/// looked at. This is the `bad_wr` of verbs.
#[derive(Debug, thiserror::Error)]
#[error("work request {posted} of the batch was refused: {error}")]
pub struct PostError {
    /// Work requests accepted before the failure.
    pub posted: usize,
    /// Why the next one was refused.
    #[source]
    pub error: FabricError,
}

/// `Result` with [`FabricError`].
pub type Result<T, E = FabricError> = core::result::Result<T, E>;
