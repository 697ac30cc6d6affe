//! Deterministic scenarios on virtual time for flow control and liveness:
//! room for received data, acknowledgement requests, zero-window probes,
//! initial credit, resets, deferred failures and resuming after a pause.

#![allow(clippy::unwrap_used)]

#[path = "../harness/mod.rs"]
mod harness;
#[path = "../pair/mod.rs"]
mod pair;

mod liveness;
mod resets;
mod room;

use std::time::Duration;

use harness::{Net, payload};
use udbtl_reliability::{
    Config, Discard, Event, Instant, LossReason, PeerId, Receipt, Room, SendError, Transmit,
};
use udbtl_wire::SeqNum;
use udbtl_wire::rel::{self, FLAG_ACK_ONLY, FLAG_ACK_REQ, FLAG_RESET};

use pair::*;

/// A peer timeout of a second and a maximum retransmission timeout of
/// 300 ms: the liveness and reset scenarios run in virtual seconds.
fn liveness_config() -> Config {
    Config {
        peer_timeout: Duration::from_secs(1),
        rto_max: ms(300),
        ..Config::default()
    }
}
