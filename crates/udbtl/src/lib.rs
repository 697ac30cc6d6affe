//! udbtl: message passing over unreliable datagrams.
//!
//! A program calls [`init`] once. It finds its job the way an MPI program
//! does: under a launcher that serves PMI-1 (our `udrun`, MPICH's
//! `mpiexec.hydra`, Slurm's `srun --mpi=pmi2`) it learns its rank and the job
//! size, opens the transport, publishes its addresses, meets every other
//! rank at a barrier and connects to them; started alone, it is rank 0 of a
//! job of one.
//!
//! ```no_run
//! let mut world = udbtl::init()?;
//! println!("rank {} of {}", world.rank(), world.size());
//! world.finalize()?;
//! # Ok::<(), udbtl::InitError>(())
//! ```
//!
//! The transport underneath is the byte transfer layer of [`udbtl_btl`]
//! (re-exported as [`btl`]), reliable by default: messages between two ranks
//! arrive exactly once and in order. Programs that want the BTL contract
//! itself (descriptors, tags, callbacks) build a [`btl::Component`] directly.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod world;

pub use udbtl_btl as btl;
pub use udbtl_btl::{EndpointId, Tag};
pub use world::{InitError, ModexMode, World, init, log_to_stderr};
