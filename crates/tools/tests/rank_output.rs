//! What udrun prints about a failed rank, and in what order (issue 30): the
//! rank's own output first, to its end, then udrun's verdict; and the same
//! multi-line stderr message from several ranks printed whole, each copy
//! together and in order, prefixed on every line or on none. Real
//! processes; nothing here depends on their speed.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

const UDBENCH: &str = env!("CARGO_BIN_EXE_udbench");
const UDHELLO: &str = env!("CARGO_BIN_EXE_udhello");

/// Runs `udrun args` with the `UDBTL_*` variables `env`; returns its exit
/// status and stderr.
fn udrun(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let finished = common::finish(common::start(args, env), Duration::from_secs(60));
    let (_, stderr) = common::text(&finished.output);
    assert!(!finished.timed_out, "udrun {args:?} hung: {stderr}");
    (finished.output.status.code(), stderr)
}

/// Runs `script` under `udrun -n 2 sh -c`, with `--tag-output` if `tag`;
/// returns its exit status and stderr.
fn udrun_sh(script: &str, tag: bool) -> (Option<i32>, String) {
    let mut args = vec!["-n", "2", "sh", "-c", script];
    if tag {
        args.insert(2, "--tag-output");
    }
    udrun(&args, &[])
}

/// The index of the one line of udrun's verdict on a rank.
fn verdict(stderr: &str) -> usize {
    let verdicts: Vec<usize> = (0..)
        .zip(stderr.lines())
        .filter(|(_, l)| l.starts_with("udrun: rank "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(verdicts.len(), 1, "{stderr}");
    verdicts[0]
}

#[test]
fn a_ranks_error_comes_before_udruns_verdict() {
    let (code, stderr) = udrun(&["-n", "2", UDHELLO], &[("UDBTL_RD_NUM", "abc")]);
    assert_eq!(code, Some(1), "{stderr}");
    let first_error = stderr
        .lines()
        .position(|l| l.contains(r#"invalid value "abc" for parameter rd_num"#))
        .unwrap_or_else(|| panic!("no error line in:\n{stderr}"));
    assert!(first_error < verdict(&stderr), "{stderr}");
}

#[test]
fn everything_a_failed_rank_wrote_comes_before_the_verdict() {
    // Rank 0 fills its stderr pipe and exits at once: most of what it wrote
    // is still in the pipe when udrun learns of its exit.
    let script = r#"if [ "$PMI_RANK" = 0 ]; then
    i=0; while [ $i -lt 2000 ]; do i=$((i + 1)); echo "rank 0 line $i of 2000"; done >&2
    exit 1
fi
sleep 30"#;
    for tag in [false, true] {
        let (code, stderr) = udrun_sh(script, tag);
        assert_eq!(code, Some(1), "{stderr}");
        let last = stderr
            .lines()
            .position(|l| l.ends_with("rank 0 line 2000 of 2000"))
            .unwrap_or_else(|| panic!("tag {tag}: rank 0's last line is missing:\n{stderr}"));
        let verdict = verdict(&stderr);
        assert!(last < verdict, "tag {tag}:\n{stderr}");
        assert!(
            stderr
                .lines()
                .nth(verdict)
                .unwrap()
                .contains("exited with code 1"),
            "{stderr}"
        );
        assert_eq!(
            stderr
                .lines()
                .filter(|l| l.contains("rank 0 line "))
                .count(),
            2000,
            "tag {tag}"
        );
    }
}

#[test]
fn a_rank_that_dies_mid_line_does_not_run_into_the_verdict() {
    // The rank's last words have no newline, as when it is killed between
    // the pieces of a message (`setsid: ` then the reason).
    let script = r#"if [ "$PMI_RANK" = 0 ]; then printf 'half a line' >&2; exit 3; fi
sleep 30"#;
    for tag in [false, true] {
        let (code, stderr) = udrun_sh(script, tag);
        assert_eq!(code, Some(3), "{stderr}");
        let verdict = verdict(&stderr);
        let half = stderr
            .lines()
            .position(|l| l.ends_with("half a line"))
            .unwrap_or_else(|| panic!("tag {tag}: the rank's words are missing:\n{stderr}"));
        assert!(half < verdict, "tag {tag}:\n{stderr}");
        assert!(stderr.ends_with('\n'), "tag {tag}:\n{stderr}");
    }
}

/// Checks that `stderr`, udrun's lines aside, is whole copies of `block`,
/// each either unchanged or with every line prefixed `[ranks ...]`; returns
/// how many ranks each copy stands for.
fn copies_of(stderr: &str, block: &[&str]) -> Vec<usize> {
    let lines: Vec<&str> = stderr.lines().collect();
    let mut copies = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("udrun: ") {
            i += 1;
            continue;
        }
        let prefix = lines[i]
            .strip_prefix("[ranks ")
            .and_then(|rest| rest.split_once(']'))
            .map(|(list, _)| format!("[ranks {list}]"));
        for (k, want) in block.iter().enumerate() {
            let want = match (&prefix, want.is_empty()) {
                (None, _) => (*want).to_owned(),
                (Some(prefix), true) => prefix.clone(),
                (Some(prefix), false) => format!("{prefix} {want}"),
            };
            assert_eq!(
                lines.get(i + k).copied(),
                Some(want.as_str()),
                "line {} of a copy:\n{stderr}",
                k + 1
            );
        }
        copies.push(prefix.map_or(1, |p| ranks_in(&p)));
        i += block.len();
    }
    copies
}

/// How many ranks `[ranks 0-2,5]` names.
fn ranks_in(prefix: &str) -> usize {
    let list = prefix.trim_start_matches("[ranks ").trim_end_matches(']');
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((lo, hi)) => hi.parse::<usize>().unwrap() - lo.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

#[test]
fn a_multi_line_usage_error_of_several_ranks_stays_whole() {
    // What every rank writes, as udbench writes it alone.
    let alone = Command::new(UDBENCH).arg("osu_latency").output().unwrap();
    let usage = String::from_utf8(alone.stderr).unwrap();
    let block: Vec<&str> = usage.lines().collect();
    assert!(block.len() > 3, "{usage}");
    assert!(block.iter().any(|l| l.starts_with("Usage:")), "{usage}");
    for ranks in ["2", "3"] {
        let (code, stderr) = udrun(&["-n", ranks, UDBENCH, "osu_latency"], &[]);
        assert_eq!(code, Some(2), "{stderr}");
        // Each rank that wrote before the job was killed is in one copy.
        let copies = copies_of(&stderr, &block);
        assert!(!copies.is_empty(), "{stderr}");
        assert!(
            copies.iter().sum::<usize>() <= ranks.parse().unwrap(),
            "{stderr}"
        );
    }
}
