//! The `verbs` provider: UD verbs on real InfiniBand and RoCE devices
//! through libibverbs (rdma-core).
//!
//! The device-free logic ([`Gid`], [`Mtu`], [`LinkLayer`], [`AhSpec`],
//! [`select_gid_index`], [`errno_error`], [`RecvLayout`], [`SlotPool`]) is
//! always compiled and unit-tested. The provider itself,
//! `VerbsProvider`/`VerbsContext`, needs the `verbs` cargo feature, which
//! compiles a small C shim (`shim.c`) and links `libibverbs`.
//!
//! # Bindings
//!
//! libibverbs' data-path calls (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_poll_cq`) are `static inline` functions of `<infiniband/verbs.h>`
//! that jump through the driver's ops table: no `extern` declaration, and no
//! bindgen output, can call them. The shim wraps them, and every other verb
//! the provider uses, as plain C functions with integer, pointer and small
//! `repr(C)` struct arguments; `sys` declares them and holds every
//! `unsafe` block of the provider.
//!
//! # Addresses
//!
//! A port's address is [`NodeAddr::Ib`](crate::NodeAddr::Ib): its LID and
//! the GID at the chosen index. InfiniBand address handles are LID-routed
//! (with a GRH only towards another subnet); RoCE ones always carry a GRH
//! routed by GID ([`AhSpec::build`]).
//!
//! # Receive buffers
//!
//! The device writes a 40-byte GRH in front of every UD receive. Receive
//! buffers keep the fabric layout: the GRH in the first
//! [`GRH_LEN`](crate::GRH_LEN) bytes, the payload after it, and
//! `byte_len` counting both ([`RecvLayout`]).

#[cfg(feature = "verbs")]
mod context;
#[cfg(feature = "verbs")]
mod device;
mod logic;
#[cfg(feature = "verbs")]
mod poll;
#[cfg(feature = "verbs")]
mod post;
#[cfg(feature = "verbs")]
mod qp;
#[cfg(feature = "verbs")]
mod sys;

#[cfg(feature = "verbs")]
pub use context::VerbsContext;
#[cfg(feature = "verbs")]
pub use device::{NAME, PortDetail, VerbsConfig, VerbsProvider};
pub use logic::*;

/// The provider's name when the `verbs` feature is off, for listings that
/// say why there is no device.
#[cfg(not(feature = "verbs"))]
pub const NAME: &str = "verbs";

/// `true` when this build has the `verbs` provider (the `verbs` feature).
pub const AVAILABLE: bool = cfg!(feature = "verbs");
