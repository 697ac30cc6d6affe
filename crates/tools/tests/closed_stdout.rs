//! `udrun ... | head` (issue 30): when the reader of udrun's stdout goes
//! away, udrun ends the job quietly with status 141 (128 + SIGPIPE, as a
//! pipeline's writer), reporting no rank; udbench, whose own stdout is
//! closed, ends by SIGPIPE as a C program does, without a panic. Real
//! processes; what is asserted does not depend on their speed.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

const UDBENCH: &str = env!("CARGO_BIN_EXE_udbench");

/// Runs `udrun args`, reads `lines` lines of its stdout, closes it, and
/// returns udrun's exit status and stderr.
fn head(args: &[&str], lines: usize) -> (Option<i32>, String) {
    let mut child = common::start(args, &[]);
    let stdout = child.stdout.take().unwrap();
    let mut reader = BufReader::new(stdout);
    for n in 0..lines {
        let mut line = String::new();
        let read = reader.read_line(&mut line).unwrap();
        assert!(read > 0, "udrun {args:?}: stdout ended after {n} lines");
    }
    drop(reader);
    let finished = common::finish(child, Duration::from_secs(60));
    let (_, stderr) = common::text(&finished.output);
    assert!(!finished.timed_out, "udrun {args:?} hung: {stderr}");
    (finished.output.status.code(), stderr)
}

/// Nothing about the closed pipe, a panic or a failed rank.
fn assert_quiet(stderr: &str) {
    for word in ["panicked", "Broken pipe", "udrun: rank", "SIGPIPE"] {
        assert!(!stderr.contains(word), "{word:?} in:\n{stderr}");
    }
}

#[test]
fn udbench_under_udrun_piped_to_head_ends_quietly() {
    // Far more rows than are read: the rows after the third find the pipe
    // closed, however fast they come.
    let (code, stderr) = head(
        &[
            "-n",
            "2",
            UDBENCH,
            "latency",
            "--max-size",
            "4M",
            "--iterations",
            "100",
        ],
        3,
    );
    assert_eq!(code, Some(141), "{stderr}");
    assert_quiet(&stderr);
}

#[test]
fn udruns_own_forwarding_ends_the_job_quietly() {
    // yes never stops writing: only the closed pipe can end this job.
    let (code, stderr) = head(&["-n", "2", "yes"], 3);
    assert_eq!(code, Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn udbench_whose_own_stdout_closes_dies_of_sigpipe_without_a_panic() {
    // Rank 0's udbench writes into a pipe to head, not to udrun: it ends
    // by SIGPIPE (bash's pipefail status 141), as OSU's programs do. The
    // job then fails, as it must: rank 0 never finalized.
    let script = r#"set -o pipefail
"$0" latency --max-size 4M --iterations 100 | head -3 >/dev/null
echo "udbench status $?" >&2"#;
    let child = common::start(&["-n", "2", "bash", "-c", script, UDBENCH], &[]);
    let finished = common::finish(child, Duration::from_secs(60));
    let (_, stderr) = common::text(&finished.output);
    assert!(!finished.timed_out, "the job hung: {stderr}");
    assert!(stderr.contains("udbench status 141"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}
