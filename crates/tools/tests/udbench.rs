//! `udbench` under `udrun`: every benchmark runs real jobs with tiny sizes
//! and iteration counts, prints OSU's headers and one row per size, emits
//! JSON Lines other tools can read, and refuses bad arguments with a clear
//! message instead of panicking or hanging. Behaviour only: no timings are
//! asserted.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

use common::text;

const UDBENCH: &str = env!("CARGO_BIN_EXE_udbench");

/// Runs `udrun -n <ranks> udbench args…` with a one-minute watchdog and
/// returns stdout, asserting success.
fn udbench(ranks: u32, args: &[&str]) -> String {
    udbench_with_stderr(ranks, args).0
}

/// Runs `udbench args` under `udrun -n ranks`, which must not hang;
/// returns whether it succeeded, its stdout and its stderr.
fn udbench_job(ranks: u32, args: &[&str]) -> (bool, String, String) {
    let n = ranks.to_string();
    let mut all = vec!["-n", &n, UDBENCH];
    all.extend_from_slice(args);
    let finished = common::finish(common::start(&all, &[]), Duration::from_secs(60));
    let (stdout, stderr) = text(&finished.output);
    assert!(!finished.timed_out, "{args:?} hung:\n{stdout}\n{stderr}");
    (finished.output.status.success(), stdout, stderr)
}

/// As [`udbench`], returning stdout and stderr.
fn udbench_with_stderr(ranks: u32, args: &[&str]) -> (String, String) {
    let (ok, stdout, stderr) = udbench_job(ranks, args);
    assert!(ok, "{args:?}:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Runs a job that must fail; returns its stderr.
fn udbench_fails(ranks: u32, args: &[&str]) -> String {
    let (ok, stdout, stderr) = udbench_job(ranks, args);
    assert!(!ok, "{args:?} succeeded:\n{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}:\n{stderr}");
    stderr
}

/// The rows of the table under `header`: the lines after it up to the next
/// table's title or the end, without the warnings of noisy rows (`#
/// warning: ...`, which a busy host may cause).
fn rows<'a>(stdout: &'a str, header: &str) -> Vec<Vec<&'a str>> {
    let mut lines = stdout.lines().skip_while(|l| *l != header);
    assert_eq!(lines.next(), Some(header), "no {header:?} in\n{stdout}");
    lines
        .take_while(|l| !l.starts_with("# udbench "))
        .filter(|l| {
            let warning = l.starts_with("# warning: ") && l.contains(" B is noisy: ");
            assert!(warning || !l.starts_with('#'), "{l:?} in\n{stdout}");
            !warning
        })
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// Checks that `rows` hold the sizes `sizes` in order, each with `columns`
/// numbers after it (not negative: at two decimals a slow 1-byte bandwidth
/// reads 0.00).
fn check_rows(rows: &[Vec<&str>], sizes: &[u64], columns: usize) {
    let got: Vec<u64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
    assert_eq!(got, sizes, "{rows:?}");
    for row in rows {
        assert_eq!(row.len(), 1 + columns, "{row:?}");
        for value in &row[1..] {
            let x: f64 = value.parse().unwrap();
            assert!(x.is_finite() && x >= 0.0, "{row:?}");
        }
    }
}

const LATENCY: &str =
    "# Size          Latency (us)          P50 (us)        P99 (us)        Max (us)";
const BANDWIDTH: &str = "# Size      Bandwidth (MB/s)";
const MBW_MR: &str = "# Size                  MB/s        Messages/s";
const MULTI_LAT: &str = "# Size          Latency (us)";

/// 1 B .. 4 KiB.
const ALL_SIZES: [u64; 13] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];

#[test]
fn without_a_subcommand_latency_then_bandwidth() {
    let stdout = udbench(2, &["--max-size", "4k", "--iterations", "50"]);
    let latency = stdout.find(LATENCY).expect("latency header");
    let bandwidth = stdout.find(BANDWIDTH).expect("bandwidth header");
    assert!(latency < bandwidth, "{stdout}");
    check_rows(&rows(&stdout, LATENCY), &ALL_SIZES, 4);
    check_rows(&rows(&stdout, BANDWIDTH), &ALL_SIZES, 1);

    let (stdout, stderr) = udbench_with_stderr(
        2,
        &["--max-size", "8", "--iterations", "50", "--no-bandwidth"],
    );
    check_rows(&rows(&stdout, LATENCY), &[1, 2, 4, 8], 4);
    assert!(!stdout.contains(BANDWIDTH), "{stdout}");
    // Quiet on a stderr that is not a terminal, unless asked.
    assert!(!stderr.contains("udbench:"), "{stderr}");
}

#[test]
fn progress_on_request() {
    let (stdout, stderr) = udbench_with_stderr(
        2,
        &["bw", "--max-size", "2", "--iterations", "10", "--progress"],
    );
    check_rows(&rows(&stdout, BANDWIDTH), &[1, 2], 1);
    assert!(stderr.contains("udbench: bw 1 B (1/2)"), "{stderr}");
    assert!(stderr.contains("udbench: bw 2 B (2/2)"), "{stderr}");
    assert!(!stdout.contains("udbench: bw"), "{stdout}");
}

#[test]
fn each_subcommand_prints_its_header_and_a_row_per_size() {
    let tiny = [
        "--min-size",
        "256",
        "--max-size",
        "4KiB",
        "--iterations",
        "20",
    ];
    let sizes = [256, 512, 1024, 2048, 4096];
    for (bench, header, columns) in [
        ("latency", LATENCY, 4),
        ("bw", BANDWIDTH, 1),
        ("bibw", BANDWIDTH, 1),
        ("mbw_mr", MBW_MR, 2),
        ("multi_lat", MULTI_LAT, 1),
    ] {
        let mut args = vec![bench];
        args.extend_from_slice(&tiny);
        let stdout = udbench(2, &args);
        check_rows(&rows(&stdout, header), &sizes, columns);
    }
    // A window other than OSU's, and sizes past OSU's 8 KiB "large" mark.
    let stdout = udbench(
        2,
        &[
            "bw",
            "--window",
            "8",
            "--min-size",
            "8k",
            "--max-size",
            "16k",
            "--iterations",
            "10",
        ],
    );
    check_rows(&rows(&stdout, BANDWIDTH), &[8192, 16384], 1);
}

#[test]
fn several_pairs_under_four_ranks() {
    let stdout = udbench(
        4,
        &[
            "mbw_mr",
            "--pairs",
            "2",
            "--max-size",
            "2",
            "--iterations",
            "10",
            "--window",
            "8",
        ],
    );
    assert!(
        stdout.contains("[ pairs: 2 ] [ window size: 8 ]"),
        "{stdout}"
    );
    check_rows(&rows(&stdout, MBW_MR), &[1, 2], 2);

    let stdout = udbench(4, &["multi_lat", "--max-size", "2", "--iterations", "10"]);
    assert!(stdout.contains("2 pairs"), "{stdout}");
    check_rows(&rows(&stdout, MULTI_LAT), &[1, 2], 1);
}

/// A flat JSON object of strings and numbers, as udbench writes them:
/// its keys in order, each with its raw value.
fn parse_object(line: &str) -> Vec<(String, String)> {
    let body = line
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not an object: {line}"));
    body.split(',')
        .map(|field| {
            let (key, value) = field.split_once(':').unwrap();
            let key = key.strip_prefix('"').and_then(|k| k.strip_suffix('"'));
            (key.unwrap().to_owned(), value.to_owned())
        })
        .collect()
}

#[test]
fn json_lines_follow_the_schema() {
    let small = [
        "--json",
        "--min-size",
        "1k",
        "--max-size",
        "2k",
        "--iterations",
        "20",
    ];
    for (bench, ranks, fields) in [
        (
            "latency",
            2,
            &[
                "iterations",
                "avg_us",
                "min_us",
                "max_us",
                "p50_us",
                "p99_us",
                "noisy",
            ][..],
        ),
        (
            "bw",
            2,
            &["window", "iterations", "mb_per_s", "spread", "noisy"][..],
        ),
        (
            "bibw",
            2,
            &["window", "iterations", "mb_per_s", "spread", "noisy"][..],
        ),
        (
            "mbw_mr",
            2,
            &[
                "pairs",
                "window",
                "mb_per_s",
                "messages_per_s",
                "spread",
                "noisy",
            ][..],
        ),
        ("multi_lat", 2, &["pairs", "avg_us"][..]),
    ] {
        let mut args = vec![bench];
        args.extend_from_slice(&small);
        let stdout = udbench(ranks, &args);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 2, "one line per size:\n{stdout}");
        for (line, size) in lines.iter().zip(["1024", "2048"]) {
            let object = parse_object(line);
            let keys: Vec<&str> = object.iter().map(|(k, _)| k.as_str()).collect();
            let mut want = vec!["tool", "bench", "size"];
            want.extend_from_slice(fields);
            assert_eq!(keys, want, "{line}");
            assert_eq!(object[0].1, r#""udbench""#, "{line}");
            assert_eq!(object[1].1, format!("\"{bench}\""), "{line}");
            assert_eq!(object[2].1, size, "{line}");
            for (key, value) in &object[3..] {
                if key == "noisy" {
                    assert!(value == "true" || value == "false", "{line}");
                    continue;
                }
                let x: f64 = value
                    .parse()
                    .unwrap_or_else(|_| panic!("{key} is not a number: {line}"));
                assert!(x.is_finite() && x > 0.0, "{key}: {line}");
            }
        }
    }
    // The default run emits both benchmarks' lines, and nothing else.
    let stdout = udbench(2, &["--json", "--max-size", "2", "--iterations", "20"]);
    let benches: Vec<String> = stdout
        .lines()
        .map(|l| parse_object(l)[1].1.clone())
        .collect();
    assert_eq!(
        benches,
        [r#""latency""#, r#""latency""#, r#""bw""#, r#""bw""#],
        "{stdout}"
    );
}

#[test]
fn bad_arguments_fail_with_a_clear_message() {
    for (ranks, args, message) in [
        (2, &["--max-size", "0"][..], "at least 1 byte"),
        (2, &["--max-size", "4q"][..], "unknown size suffix"),
        (2, &["--max-size", "2G"][..], "1 GiB limit"),
        (
            2,
            &["--min-size", "8k", "--max-size", "4k"][..],
            "--min-size 8192 is larger than --max-size 4096",
        ),
        (2, &["--iterations", "0"][..], "must be at least 1"),
        (2, &["bw", "--window", "0"][..], "must be at least 1"),
        (2, &["mbw_mr", "--pairs", "0"][..], "must be at least 1"),
        (
            2,
            &["--no-bandwidth", "bw"][..],
            "--no-bandwidth applies only without a subcommand",
        ),
        (2, &["nonsense"][..], "unrecognized subcommand"),
        (
            4,
            &["mbw_mr", "--pairs", "3"][..],
            "mbw_mr --pairs 3 needs at least 6 ranks, the job has 4",
        ),
        (
            3,
            &["multi_lat", "--max-size", "1"][..],
            "multi_lat needs an even number of ranks",
        ),
        (1, &["latency"][..], "latency needs at least 2 ranks"),
    ] {
        let stderr = udbench_fails(ranks, args);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// `UDBTL_RELIABLE=0` is refused before the job starts, with the reason,
/// instead of failing on the first message.
#[test]
fn an_unreliable_transport_is_refused_at_start() {
    let n = "2";
    let all = [
        "-n",
        n,
        UDBENCH,
        "latency",
        "--max-size",
        "1",
        "--iterations",
        "10",
    ];
    let finished = common::finish(
        common::start(&all, &[("UDBTL_RELIABLE", "0")]),
        Duration::from_secs(60),
    );
    let (stdout, stderr) = text(&finished.output);
    assert!(!finished.timed_out, "{stdout}\n{stderr}");
    assert!(!finished.output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("needs reliable delivery"), "{stderr}");
    assert!(stderr.contains("UDBTL_RELIABLE=0"), "{stderr}");
    assert!(!stderr.contains("multi-datagram"), "{stderr}");
}

/// Fewer timed iterations than warm-up ones, or a single one, still give
/// finite numbers (the warm-up scales with --iterations, and a given
/// --warmup is only untimed work).
#[test]
fn few_iterations_give_finite_rows() {
    for args in [
        &["latency", "--max-size", "2", "--iterations", "1"][..],
        &[
            "latency",
            "--max-size",
            "2",
            "--iterations",
            "1",
            "--warmup",
            "50",
        ][..],
        &[
            "bw",
            "--max-size",
            "2",
            "--iterations",
            "1",
            "--warmup",
            "50",
        ][..],
        &["bibw", "--max-size", "2", "--iterations", "1"][..],
    ] {
        let stdout = udbench(2, args);
        assert!(
            !stdout.contains("inf") && !stdout.contains("NaN"),
            "{args:?}: {stdout}"
        );
        let header = if args[0] == "latency" {
            LATENCY
        } else {
            BANDWIDTH
        };
        let columns = if args[0] == "latency" { 4 } else { 1 };
        check_rows(&rows(&stdout, header), &[1, 2], columns);
    }
}

/// Sizes take the suffixes udstress takes.
#[test]
fn sizes_take_suffixes() {
    let stdout = udbench(
        2,
        &[
            "bw",
            "--min-size",
            "1k",
            "--max-size",
            "2KiB",
            "--iterations",
            "5",
        ],
    );
    check_rows(&rows(&stdout, BANDWIDTH), &[1024, 2048], 1);
}

/// The pid of rank `rank`, a child of udrun `udrun`, once it runs.
fn rank_pid(udrun: u32, rank: u32) -> Option<u32> {
    let needle = format!("PMI_RANK={rank}");
    common::children(udrun).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
    })
}

/// Runs a 2-rank latency sweep long enough for the test (with `env` and
/// udbench's `extra` arguments), stops rank 1 once the ping-pong runs, and
/// returns how the job ended (its standard output is read here, not
/// returned).
fn stop_rank_one_mid_benchmark(env: &[(&str, &str)], extra: &[&str]) -> common::Finished {
    use std::io::{BufRead, BufReader};
    let mut all = vec![
        "-n",
        "2",
        UDBENCH,
        "latency",
        "--max-size",
        "8",
        "--iterations",
        "100000000",
    ];
    all.extend_from_slice(extra);
    let mut child = common::start(&all, env);
    let udrun = child.id();
    // Rank 0 prints the table's header once init is over, just before the
    // ping-pong starts.
    let (started_tx, started) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("# udbench latency") {
                let _ = started_tx.send(());
            }
        }
    });
    started
        .recv_timeout(Duration::from_secs(30))
        .expect("the benchmark starts");
    let victim = rank_pid(udrun, 1).expect("rank 1 runs");
    // Let the ping-pong run, then stop rank 1 for good (udrun kills it when
    // the job ends; the watchdog continues it should the job hang).
    std::thread::sleep(Duration::from_millis(500));
    common::signal(victim, "STOP");
    common::finish(child, Duration::from_secs(30))
}

/// A rank that stops answering in the middle of the benchmark is declared
/// lost by its peer, which exits naming it, and udrun ends the job: every
/// wait of the benchmark checks the transport, so a lost peer is an error,
/// never a silent hang (it used to spin forever on the pong that could not
/// come).
#[test]
fn a_peer_that_stops_answering_ends_the_benchmark_naming_it() {
    let finished = stop_rank_one_mid_benchmark(&[("UDBTL_PEER_TIMEOUT", "1000")], &[]);
    let (stdout, stderr) = text(&finished.output);
    assert!(!finished.timed_out, "the job hung:\n{stdout}\n{stderr}");
    assert_eq!(finished.output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("udbench: messages were lost: rank 0: rank 1 lost ("),
        "{stderr}"
    );
    assert!(
        stderr.contains("nothing heard from it within peer_timeout"),
        "{stderr}"
    );
}

/// A wait that outlasts `--stall-timeout` while the transport reports
/// nothing (here the peer is stopped, and its peer timeout is far away)
/// ends the run with what was awaited and the transport's state, instead
/// of spinning silently.
#[test]
fn a_stalled_wait_is_reported_with_the_transport_state() {
    let finished = stop_rank_one_mid_benchmark(
        &[("UDBTL_PEER_TIMEOUT", "600000")],
        &["--stall-timeout", "2"],
    );
    let (stdout, stderr) = text(&finished.output);
    assert!(!finished.timed_out, "the job hung:\n{stdout}\n{stderr}");
    assert_eq!(finished.output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "udbench: rank 0: a message of the benchmark did not come within 2 s \
             (--stall-timeout), and the transport reports no failure; its state:"
        ),
        "{stderr}"
    );
    // The state names the module and its reliability counters.
    assert!(stderr.contains("reliability        sent "), "{stderr}");
}
