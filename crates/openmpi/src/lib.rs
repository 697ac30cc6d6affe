//! `mca_btl_udbtl`: udbtl as an Open MPI 4.1 BTL component, which Open MPI's
//! ob1 drives for matching, rendezvous and collectives, as it drove ofud.
//!
//! The component is split at the ABI boundary:
//!
//! * `src/*.c` include Open MPI's headers, so every struct layout comes from
//!   them: `component.c` (the component: variables, init, progress,
//!   finalize), `module.c` (descriptors and sends, ob1's flow control),
//!   `procs.c` (peers: add, delete, adopt on first contact, loss reports)
//!   and `params.c` (typed MCA variables and MPI_T counters), with
//!   `udbtl.h` between them;
//! * [`ffi`] is the surface they call, the crate's only `unsafe` code;
//! * [`transport`] is the safe part: the transport and its modules, which
//!   module takes which peer, the job's identity and the counters;
//!   [`host`] what C does with one module beyond `Module`'s own methods;
//!   [`params`] the parameters as MCA variables; [`gate`] cheap idle
//!   progress; [`log`] udbtl's warnings through Open MPI's output.
//!
//! The crate builds the component only where Open MPI's development headers
//! are installed (`libopenmpi-dev`); elsewhere it is an empty library, and
//! the build says so.
//!
//! Load it with `eval "$(scripts/ompi-component)"` and select it with
//! `--mca pml ob1 --mca btl self,udbtl`.

#[cfg(udbtl_openmpi)]
pub mod ffi;
pub mod gate;
pub mod host;
pub mod log;
pub mod params;
pub mod transport;
