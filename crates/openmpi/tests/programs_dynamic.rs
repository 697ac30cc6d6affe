//! Dynamic processes over udbtl: MPI_Comm_spawn of two children, then
//! point-to-point and collectives on the intercommunicator. The two jobs'
//! datagrams carry different keys; each side adds the other's processes as
//! peers of another job.

mod common;

use common::{Run, assert_said_ok};

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn spawned_children_talk_to_their_parents_over_udbtl() {
    require_openmpi!();
    let exe = common::program("spawn");
    let _turn = common::serial();
    let out = Run::udbtl(2).success(&exe, &[]);
    assert_said_ok("spawn parent", &out, "2 parents");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for who in ["parent 0", "parent 1", "child 0", "child 1"] {
        assert!(
            stdout.contains(&format!("OK spawn {who} ")),
            "{who} missing:\n{stdout}"
        );
    }
    // Both jobs carried their traffic over udbtl: two parents and two
    // children each printed counters that moved messages.
    let lines = common::stats_fields(&out.stderr);
    assert_eq!(lines.len(), 4, "{}", String::from_utf8_lossy(&out.stderr));
    for line in &lines {
        let count = |key: &str| {
            line.iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        assert!(count("sent") > 0 && count("received") > 0, "{line:?}");
    }
}
