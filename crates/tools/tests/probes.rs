//! Jobs where ranks misbehave, under `udrun`, through `udprobe`: every
//! message arrives exactly once and intact, or the loss is reported loudly,
//! naming the ranks, and the job fails.

#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::time::Duration;

mod common;

/// A bounded test: the whole job is interrupted after two minutes.
fn udrun(args: &[&str], env: &[(&str, &str)]) -> Output {
    common::udrun(args, env, Duration::from_secs(120))
}

fn text(output: &Output) -> String {
    let (stdout, stderr) = common::text(output);
    format!("{stdout}\n{stderr}")
}

/// With addresses fetched lazily, rank 0 sends before anyone knows it,
/// while every other rank sits in a barrier or in finalize: both run
/// through the same progress as everything else, so the receivers connect
/// to rank 0 while they wait, and nothing is lost. (Before, a receiver in
/// finalize never connected, rank 0 gave up after 5 s, and both ranks
/// finalized "successfully" with nothing delivered.)
#[test]
fn receive_first_traffic_arrives_during_a_barrier() {
    for during in ["barrier", "finalize"] {
        let output = udrun(
            &[
                "-n",
                "4",
                env!("CARGO_BIN_EXE_udprobe"),
                "lazy-barrier",
                "--wait-in",
                during,
            ],
            &[("UDBTL_MODEX", "lazy")],
        );
        let all = text(&output);
        assert!(output.status.success(), "{all}");
        for rank in 1..4 {
            assert!(
                all.contains(&format!(
                    "rank {rank}: 100 messages from rank 0, received during {during}, in order and intact"
                )),
                "{all}"
            );
        }
    }
}

/// Sends to a lost peer fail at once and leak nothing: after 10 000 of them
/// a live peer still gets everything, and finalize names the lost rank
/// (and finds no leak); the job fails.
#[test]
fn sends_to_a_lost_peer_fail_without_leaking() {
    let output = udrun(
        &["-n", "3", env!("CARGO_BIN_EXE_udprobe"), "lost-peer"],
        &[("UDBTL_PEER_TIMEOUT", "500")],
    );
    let all = text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(
        all.contains("10000 of 10000 later sends to it refused"),
        "{all}"
    );
    assert!(
        all.contains("rank 1: 100 messages from rank 0 in order and intact"),
        "{all}"
    );
    assert!(
        all.contains("rank 0: finalize: messages were lost: rank 0: rank 2 lost"),
        "{all}"
    );
    assert!(
        !all.contains("still in use"),
        "finalize found a leak: {all}"
    );
    assert!(all.contains("udrun: rank 0"), "{all}");
}
