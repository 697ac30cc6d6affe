//! The device-free half of the `verbs` provider: plain functions over plain
//! values, compiled with or without the `verbs` feature and unit-tested on
//! machines that have no RDMA device.
//!
//! * [`Gid`]: parsing and formatting of 128-bit global identifiers.
//! * [`Mtu`] and [`LinkLayer`]: the verbs enums, with their numeric values.
//! * [`AhSpec::build`] and [`select_gid_index`]: how an address handle is
//!   routed (LID for InfiniBand, GRH for RoCE).
//! * [`errno_error`] and [`post_errno_error`]: errno to [`FabricError`](crate::FabricError).
//! * [`RecvLayout`] and [`SlotPool`]: where the device writes a receive,
//!   GRH included, and which staging slots are free.
//!
//! Each part has its own file: [`port`] (GIDs, MTUs, link
//! layers), [`route`] (address handles, GID index, network
//! id), [`errno`] (errno to error), and
//! [`completion`] (completion fields, receive layout,
//! staging slots). Everything is re-exported here.

mod completion;
mod errno;
mod port;
mod route;

pub use completion::*;
pub use errno::*;
pub use port::*;
pub use route::*;
