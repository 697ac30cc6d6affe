//! `mca_btl_udbtl`: udbtl as an Open MPI 4.1 BTL component, which Open MPI's
//! ob1 drives for matching, rendezvous and collectives, as it drove ofud.
//!
//! The component is split at the ABI boundary:
//!
//! * `src/component.c` includes Open MPI's headers, so every struct layout
//!   comes from them: it fills the component and module structs, keeps ob1's
//!   descriptors, registers the parameters, publishes and reads the modex,
//!   and forwards each call to the Rust surface;
//! * [`ffi`] is that surface, the crate's only `unsafe` code;
//! * [`transport`] is the safe part: parameters, the transport and its
//!   modules, and the job's identity.
//!
//! The crate builds the component only where Open MPI's development headers
//! are installed (`libopenmpi-dev`); elsewhere it is an empty library, and
//! the build says so.
//!
//! Load it with `OMPI_MCA_mca_base_component_path=DIR:$(ompi_info --path
//! pkglibdir)`, where DIR holds the library renamed `mca_btl_udbtl.so`, and
//! select it with `--mca pml ob1 --mca btl self,udbtl`.

#[cfg(udbtl_openmpi)]
pub mod ffi;
pub mod transport;
