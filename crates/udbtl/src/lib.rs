//! udbtl: message passing over unreliable datagrams.
//!
//! A program calls [`init`] once. It finds its job the way an MPI program
//! does: under a launcher that serves PMI-1 (our `udrun`, MPICH's
//! `mpiexec.hydra`, Slurm's `srun --mpi=pmi2`) it learns its rank and the job
//! size, opens the transport, publishes its addresses, meets every other
//! rank at a barrier and connects to them; started alone, it is rank 0 of a
//! job of one.
//!
//! Then it sends with [`World::send`] and receives with [`World::recv`]
//! (blocking) or [`World::on_receive`] (a callback, without a copy), on
//! [`Tag`]s of its own, and leaves with [`World::finalize`], which fails,
//! naming the ranks, if any message was lost. Messages between two ranks
//! arrive exactly once and in order. This is `examples/ring.rs`, which the
//! README shows and a test runs under udrun:
//!
#![doc = concat!("```no_run\n", include_str!("../examples/ring.rs"), "```")]
//!
//! The transport underneath is the byte transfer layer of [`udbtl_btl`]
//! (re-exported as [`btl`]), reliable by default. Programs that want the BTL
//! contract itself (descriptors, tags, callbacks) build a
//! [`btl::Component`] directly.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod world;

pub use udbtl_btl as btl;
pub use udbtl_btl::EndpointId;
pub use world::{
    InitError, Lost, Message, ModexMode, RecvError, SendError, Tag, TagError, World, init,
    log_to_stderr,
};
