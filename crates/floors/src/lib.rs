//! The floors udbtl is measured against, and the tool that tables and plots
//! every measurement.
//!
//! * `udp_pingpong`: raw UDP ping-pong between two processes, busy-polling.
//! * `udp_stream`: raw UDP streaming, one datagram per call (`single`),
//!   `sendmmsg`/`recvmmsg` batches (`mmsg`) or `UDP_SEGMENT`/`UDP_GRO`
//!   (`gso`, through `quinn-udp`).
//! * `udplot`: medians of JSON Lines results into `results.md` and SVGs.
//!
//! All three speak the JSON Lines schema of [`record::Record`], which
//! `udbench` emits too.

pub mod net;
pub mod record;
pub mod stats;
pub mod sys;
pub mod targets;
