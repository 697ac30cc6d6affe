use udbtl_fabric::{FabricError, PostError};

use crate::params::ParamError;

/// A BTL operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BtlError {
    /// A parameter was invalid.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A verbs call failed while setting up or tearing down a module.
    #[error("{step} failed on {device}:{port}")]
    Fabric {
        /// What the module was doing.
        step: &'static str,
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The verbs error.
        #[source]
        source: FabricError,
    },
    /// Posting a send failed; the descriptor is back in the caller's hands.
    #[error("posting a send to endpoint {endpoint} failed")]
    Post {
        /// The endpoint the send was for.
        endpoint: u32,
        /// The verbs error.
        #[source]
        source: PostError,
    },
    /// A descriptor handle is stale, freed, or of the wrong kind for the call.
    #[error("descriptor {descriptor:#x} is {problem}")]
    BadDescriptor {
        /// The raw handle.
        descriptor: u32,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The endpoint exists but cannot take sends: its peer was declared
    /// lost, or it was closed.
    #[error("endpoint {endpoint} cannot take sends: {reason}")]
    PeerUnavailable {
        /// The raw handle.
        endpoint: u32,
        /// Why.
        reason: String,
    },
    /// An endpoint handle names no live endpoint of this module.
    #[error("no endpoint {endpoint} on this module")]
    BadEndpoint {
        /// The raw handle.
        endpoint: u32,
    },
    /// The provider offers no usable port.
    #[error("no active port found{detail}")]
    NoPorts {
        /// What was searched.
        detail: String,
    },
    /// A peer's published addresses could not be parsed.
    #[error("peer {peer} published a malformed address blob")]
    BadModex {
        /// Index of the peer in the call.
        peer: usize,
    },
    /// The operating system gave no random bytes for the authentication
    /// key (`auth`).
    #[error("drawing a random authentication key failed")]
    Randomness(#[source] getrandom::Error),
    /// The reliability settings derived from the parameters are
    /// inconsistent.
    #[error(transparent)]
    Reliability(#[from] udbtl_reliability::ConfigError),
    /// No send fragment became free while waiting, progressing, for one.
    #[error("no send fragment became free within {waited:?}")]
    NoFragment {
        /// How long the call waited.
        waited: std::time::Duration,
    },
    /// A remote read that cannot be asked for.
    #[error("read refused: {0}")]
    BadRead(&'static str),
    /// Resources were still in use at finalize.
    #[error("finalize found {what} still in use")]
    Leak {
        /// What leaked.
        what: String,
    },
}

/// Why a send completed without being delivered to the fabric.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendFailure {
    /// The provider refused the send when it was posted from the pending
    /// queue.
    #[error("the provider refused the send: {0}")]
    Refused(String),
    /// The send completed with an error status.
    #[error("the send completed with status {0}")]
    Completion(String),
    /// The peer acknowledged nothing for `peer_timeout`: it was declared lost.
    #[error("the peer was declared lost: {0}")]
    PeerLost(String),
}
