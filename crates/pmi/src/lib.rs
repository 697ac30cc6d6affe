//! PMI-1 for udbtl: how processes of a job find each other.
//!
//! A launcher (our `udrun`, MPICH's `mpiexec.hydra`, or Slurm's `srun
//! --mpi=pmi2`, which serves PMI-1 too) runs a PMI server; each process
//! connects to it, learns its rank and the job size, publishes its transport
//! address in a job-wide key-value space (KVS), waits at a barrier and reads
//! its peers' addresses. This crate has the three parts:
//!
//! * [`wire`]: the PMI-1 "simple" text codec, one `cmd=<name> key=value ...`
//!   line per message;
//! * [`PmiClient`]: the process side;
//! * [`server`]: the launcher side, a sans-IO [`ServerCore`] and the threaded
//!   [`Server`].
//!
//! # Protocol subset
//!
//! `init` (version 1.1), `get_maxes`, `get_appnum`, `get_universe_size`,
//! `get_my_kvsname`, `put`, `get`, `barrier_in`/`barrier_out`, `finalize`,
//! `abort`, and the `initack` handshake of port mode. Not supported: PMI-2's
//! length-prefixed wire, `spawn` (the multi-line `mcmd=spawn` form is read
//! and refused with `rc=-1`), name publishing, and `\` escapes: values are
//! printable ASCII without spaces, so binary data must be stored as hex.
//! Keys and values are limited by the server's `get_maxes` (64 and 1024
//! bytes with hydra, Slurm and ours); [`PmiClient::put_long`] splits longer
//! values over several keys.
//!
//! # Environment
//!
//! [`PmiClient::from_env`] looks, in this order, for:
//!
//! | variables | meaning |
//! | --- | --- |
//! | `PMI_FD`, `PMI_RANK`, `PMI_SIZE` | an inherited, connected socket (hydra's default, Slurm, udrun) |
//! | `PMI_PORT=host:port`, `PMI_ID` | connect over TCP and send `cmd=initack pmiid=<PMI_ID>`; rank and size come back in `cmd=set` lines (`mpiexec.hydra -pmi-port`) |
//! | `PMI_PORT`, `PMI_ID`, `UDBTL_PMI_SECRET` | the same, after proving knowledge of the job secret in answer to the server's challenge (udrun's authenticated port mode; see [`server`]) |
//! | `PMIX_RANK`, `PMIX_VERSION`, `PRTE_LAUNCHED` | a PMIx launcher: refused with [`PmiError::PmixLauncher`] |
//! | none of these | singleton |
//!
//! # Singleton fallback
//!
//! A program started without a launcher is rank 0 of a job of 1: `put`,
//! `get` and `put_long`/`get_long` use an in-memory KVS, `barrier` returns
//! at once, `abort` does nothing, and `get("PMI_process_mapping")` answers
//! `(vector,(0,1,1))`. The same code path therefore works with and without
//! a launcher.
//!
//! ```
//! use udbtl_pmi::PmiClient;
//!
//! let mut pmi = PmiClient::singleton();
//! pmi.init()?;
//! pmi.put(&format!("addr-{}", pmi.rank()), "udp://127.0.0.1:50000")?;
//! pmi.barrier()?;
//! assert_eq!(pmi.get("addr-0")?.as_deref(), Some("udp://127.0.0.1:50000"));
//! assert_eq!(pmi.get("addr-1")?, None);
//! pmi.finalize()?;
//! # Ok::<(), udbtl_pmi::PmiError>(())
//! ```
#![warn(missing_docs)]

pub mod auth;
pub mod client;
mod error;
mod mapping;
pub mod server;
mod sys;
pub mod wire;

pub use auth::{JobSecret, SECRET_ENV, SecretError};
pub use client::{Maxes, Mode, PmiClient};
pub use error::PmiError;
pub use mapping::ProcessMapping;
pub use server::{
    Action, Handshake, KvsLimits, PortOptions, Refusal, Server, ServerCore, ServerError,
    ServerEvent, ServerStats,
};
pub use wire::{Message, WireError};
