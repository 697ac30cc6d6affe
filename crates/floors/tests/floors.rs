//! The floors run for real over loopback, with tiny sizes and counts. No
//! timing is asserted: only that each program and mode runs, reports what
//! path it took, and refuses bad arguments clearly.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Output, Stdio};

/// Starts a server role and returns it with the address it printed.
fn start(bin: &str, args: &[&str], marker: &str) -> (Child, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let stderr = child.stderr.take().expect("stderr");
    let mut line = String::new();
    BufReader::new(stderr)
        .read_line(&mut line)
        .expect("read server line");
    let addr = line
        .trim()
        .rsplit_once(marker)
        .map(|(_, a)| a.to_owned())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, addr)
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().expect("run client")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const PINGPONG: &str = env!("CARGO_BIN_EXE_udp_pingpong");
const STREAM: &str = env!("CARGO_BIN_EXE_udp_stream");

/// Runs a ping-pong client with `args` against a server of its own, which
/// must end cleanly (the client's empty datagram ends it).
fn pingpong(args: &[&str]) -> Output {
    let (mut server, addr) = start(
        PINGPONG,
        &["--listen", "127.0.0.1:0", "--timeout", "20"],
        "echoing on ",
    );
    let mut all = vec!["--connect", addr.as_str()];
    all.extend_from_slice(args);
    let out = run(PINGPONG, &all);
    assert!(out.status.success(), "{}", text(&out));
    assert!(server.wait().unwrap().success());
    out
}

#[test]
fn pingpong_runs_over_loopback_and_prints_json() {
    let out = pingpong(&[
        "--max-size",
        "16",
        "--iterations",
        "20",
        "--skip",
        "2",
        "--json",
        "--timeout",
        "10",
    ]);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let sizes: Vec<u64> = lines.iter().map(|v| v["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [1, 2, 4, 8, 16]);
    for v in &lines {
        assert_eq!(v["tool"], "udp_pingpong");
        assert_eq!(v["bench"], "latency");
        assert_eq!(v["iterations"], 20);
        for k in ["avg_us", "min_us", "max_us", "p50_us", "p99_us"] {
            assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {v}");
        }
    }
}

#[test]
fn pingpong_table_by_default() {
    let out = pingpong(&["--max-size", "4", "--iterations", "5", "--skip", "1"]);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("# Size") && t.contains("p99 (us)"), "{t}");
    assert_eq!(t.lines().filter(|l| !l.starts_with('#')).count(), 3, "{t}");
}

fn stream(mode: &str, extra: &[&str]) -> Output {
    let (mut receiver, addr) = start(
        STREAM,
        &["--listen", "127.0.0.1:0", "--timeout", "20"],
        "receiving on ",
    );
    let mut args = vec![
        "--connect",
        addr.as_str(),
        "--mode",
        mode,
        "--max-size",
        "4096",
        "--iterations",
        "2",
        "--window",
        "4",
    ];
    args.extend_from_slice(extra);
    let out = run(STREAM, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(receiver.wait().unwrap().success());
    out
}

#[test]
fn stream_single_and_mmsg_run() {
    for (mode, says) in [
        ("single", "one datagram per send()"),
        ("mmsg", "sendmmsg batches"),
    ] {
        let out = stream(mode, &["--datagram", "1000"]);
        let t = text(&out);
        assert!(t.contains(says), "{t}");
        // 1..4096 doubling, with messages above 1000 B cut into datagrams.
        assert_eq!(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.starts_with('#'))
                .count(),
            13,
            "{t}"
        );
    }
}

#[test]
fn stream_gso_says_which_path_ran() {
    let out = stream("gso", &["--json", "--datagram", "1000"]);
    let t = text(&out);
    assert!(
        t.contains("send: UDP_SEGMENT on") || t.contains("kernel refuses UDP_SEGMENT"),
        "{t}"
    );
    assert!(
        t.contains("UDP_GRO on") || t.contains("kernel refuses UDP_GRO"),
        "{t}"
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        assert_eq!(v["tool"], "udp_stream");
        assert_eq!(v["bench"], "bw");
        assert_eq!(v["mode"], "gso");
        assert_eq!(v["datagram"], 1000);
        assert!(v["lost"].as_u64().is_some(), "{v}");
        assert!(
            v["mb_per_s"].is_number() && v["datagrams_per_s"].is_number(),
            "{v}"
        );
    }
}

#[test]
fn stream_gso_fallback_is_reported() {
    let t = text(&stream("gso", &["--no-offload"]));
    assert!(
        t.contains("send: fallback") && t.contains("UDP_GRO off (fallback)"),
        "{t}"
    );
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let out = run(
        PINGPONG,
        &["--connect", "127.0.0.1:9", "--max-size", "70000"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("exceeds the largest UDP payload") && text(&out).contains("65507"),
        "{}",
        text(&out)
    );

    let out = run(STREAM, &["--connect", "127.0.0.1:9", "--datagram", "65508"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("--datagram 65508 B exceeds"),
        "{}",
        text(&out)
    );

    let out = run(STREAM, &["--connect", "127.0.0.1:9", "--mode", "turbo"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("invalid value 'turbo'"),
        "{}",
        text(&out)
    );

    let out = run(PINGPONG, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("--listen"), "{}", text(&out));

    let out = run(PINGPONG, &["--connect", "no-such-host.invalid:1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("cannot resolve"), "{}", text(&out));
}

const UDPLOT: &str = env!("CARGO_BIN_EXE_udplot");

#[test]
fn udplot_opens_results_with_a_summary_that_stands_alone() {
    let dir = std::env::temp_dir().join(format!("udplot-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("all.jsonl");
    let lines = [
        r#"{"label":"udbtl udbench","path":"loopback","tool":"udbench","bench":"latency","size":8,"avg_us":4.0}"#,
        r#"{"label":"udbtl udbench","path":"loopback","tool":"udbench","bench":"bw","size":1048576,"mb_per_s":2000.0}"#,
        r#"{"label":"udbtl udbench","path":"loopback","tool":"udbench","bench":"bw","size":8,"mb_per_s":1.0}"#,
        r#"{"label":"udbtl udbench","path":"loopback","tool":"udbench","bench":"mbw_mr","size":8,"mb_per_s":2.4,"messages_per_s":300000.0}"#,
        r#"{"label":"ompi tcp","path":"loopback","tool":"osu_pt2pt","bench":"latency","size":8,"avg_us":5.0}"#,
        r#"{"label":"ompi tcp","path":"loopback","tool":"osu_pt2pt","bench":"bw","size":1048576,"mb_per_s":4000.0}"#,
        r#"{"label":"ompi tcp","path":"loopback","tool":"osu_pt2pt","bench":"bw","size":8,"mb_per_s":2.0}"#,
        r#"{"label":"udp pingpong","path":"veth1500","tool":"udp_pingpong","bench":"latency","size":8,"avg_us":2.0}"#,
        r#"{"label":"udbtl udbench","path":"veth1500","tool":"udbench","bench":"latency","size":8,"avg_us":5.0}"#,
        r#"{"not":"a record"}"#,
    ];
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = run(
        UDPLOT,
        &[
            "--out",
            dir.to_str().unwrap(),
            "--note",
            "commit: abc1234",
            input.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("skipped 1 line"), "{}", text(&out));
    let md = std::fs::read_to_string(dir.join("results.md")).unwrap();
    let summary = &md[..md.find("## loopback").expect("a section per path")];
    for want in [
        "## Summary",
        "- commit: abc1234",
        "| loopback | udbtl udbench | 4.00 | 2000 | 300000 |",
        "| loopback | ompi tcp | 5.00 | 4000 | 250000 |",
        "| loopback | udbtl udbench / ompi tcp | 0.80 | 0.50 | 1.20 |",
        "| veth1500 | udbtl udbench / udp pingpong | 2.50 | – | – |",
    ] {
        assert!(summary.contains(want), "{want:?} not in the summary:\n{md}");
    }
    assert!(md.contains("## veth1500"), "{md}");
    for svg in [
        "latency-loopback.svg",
        "bandwidth-loopback.svg",
        "latency-veth1500.svg",
    ] {
        assert!(dir.join(svg).is_file(), "{svg} missing");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
