//! The README's API example (`crates/udbtl/examples/ring.rs`) runs under
//! udrun as a user would run it, and does what it says.

use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

#[test]
fn the_ring_example_runs_under_udrun() {
    let ring = common::example_exe("ring");
    for ranks in ["1", "2", "4"] {
        let output = common::udrun(&["-n", ranks, &ring], &[], Duration::from_secs(120));
        let (stdout, stderr) = common::text(&output);
        assert!(
            output.status.success(),
            "{ranks} ranks: {:?}\n{stdout}\n{stderr}",
            output.status
        );
        let n: u64 = ranks.parse().unwrap_or_default();
        let sum = n * (n - 1) / 2;
        assert!(
            stdout.contains(&format!(
                "rank 0: the token came back with {sum} (expected {sum})"
            )),
            "{ranks} ranks:\n{stdout}\n{stderr}"
        );
        for rank in 0..n {
            let prev = (rank + n - 1) % n;
            assert!(
                stdout.contains(&format!(
                    "rank {rank}: 102400 bytes from rank {prev}, all checked"
                )),
                "{ranks} ranks, rank {rank}:\n{stdout}\n{stderr}"
            );
        }
    }
}
