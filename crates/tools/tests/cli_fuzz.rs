//! Command-line fuzzing of the real binaries (issue 11, item 2): random
//! argument lists built from each tool's own options (read from its
//! `--help`) and hostile values: numbers out of range, negative, huge,
//! size suffixes, empty strings, non-UTF-8-looking text, stray dashes.
//!
//! Every run must end by itself within a few seconds, by success or by a
//! clear error: never a panic, never a signal. A usage error (exit 2) is
//! one line naming the tool. `CLI_FUZZ_RUNS` sets the runs per tool
//! (default 150); the seed is printed, and `CLI_FUZZ_SEED` replays one.
//!
//! Options that reach other hosts or oversubscribe the machine (`--host`,
//! `--hostfile`, `--launcher-exec`, `--oversubscribe`) are left out, so
//! that an argument list that parses starts at most a small local job of
//! `true`.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

/// The long and short options a tool's `--help` lists.
fn options(tool: &str) -> Vec<String> {
    let help = Command::new(tool).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    let mut found: Vec<String> = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|w| w.starts_with('-') && w.len() > 1 && w.chars().nth(1) != Some(' '))
        .map(|w| w.split('=').next().unwrap_or(w).to_owned())
        .filter(|w| {
            w.chars()
                .skip_while(|c| *c == '-')
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
        .filter(|w| {
            !matches!(
                w.as_str(),
                "--host"
                    | "-H"
                    | "--hostfile"
                    | "--launcher-exec"
                    | "--oversubscribe"
                    | "--help"
                    | "-h"
                    | "--version"
                    | "-V"
            )
        })
        .collect();
    found.sort();
    found.dedup();
    assert!(found.len() > 3, "{tool} --help lists its options: {text}");
    found
}

/// A hostile or ordinary value.
fn value(rng: &mut fastrand::Rng) -> String {
    const VALUES: &[&str] = &[
        "0",
        "1",
        "2",
        "-1",
        "3",
        "4k",
        "1M",
        "64KiB",
        "1.5",
        "nan",
        "inf",
        "",
        " ",
        "-",
        "--",
        "99999999999999999999",
        "4294967296",
        "18446744073709551616",
        "0x10",
        "1e3",
        "core",
        "none",
        "yes",
        "off",
        "é",
        "\u{202e}",
        "a=b",
        "lo",
        "10.77.0.0/24",
    ];
    if rng.u8(..4) == 0 {
        (0..rng.usize(1..12)).map(|_| rng.char('!'..='~')).collect()
    } else {
        VALUES[rng.usize(..VALUES.len())].to_owned()
    }
}

/// A random argument list for a tool with `options` and `subcommands`.
fn arguments(rng: &mut fastrand::Rng, options: &[String], subcommands: &[&str]) -> Vec<String> {
    let mut args = Vec::new();
    if !subcommands.is_empty() && rng.bool() {
        args.push(subcommands[rng.usize(..subcommands.len())].to_owned());
    }
    for _ in 0..rng.usize(0..5) {
        match rng.u8(..10) {
            0 => args.push(value(rng)),
            1 => args.push(format!(
                "{}={}",
                options[rng.usize(..options.len())],
                value(rng)
            )),
            _ => {
                args.push(options[rng.usize(..options.len())].clone());
                if rng.u8(..4) != 0 {
                    args.push(value(rng));
                }
            }
        }
    }
    args
}

/// Runs `tool args`, bounded; panics on a crash, a hang or an error that
/// is not one line naming the tool. Returns the exit code.
fn check(tool: &str, name: &str, args: &[String], seed: u64) -> i32 {
    // An empty PATH: a random word must not name a program that runs for
    // ever (`yes`); udrun's ranks run `true` by its full path.
    let mut child = common::clean_command(tool, &[], &[])
        .args(args)
        .env("PATH", "")
        .env("UDRUN_OVERSUBSCRIBE", "0")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("seed {seed}: {name} {args:?} did not end within 20 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("panicked"),
        "seed {seed}: {name} {args:?} panicked: {stderr}"
    );
    let code = status.code();
    assert!(
        code.is_some() && code != Some(101),
        "seed {seed}: {name} {args:?} ended with {status}: {stderr}"
    );
    if code == Some(2) {
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("{name}:")) || first.starts_with("error:"),
            "seed {seed}: {name} {args:?}: usage error does not name the tool: {stderr}"
        );
    }
    code.unwrap_or(-1)
}

/// The full path of `true`, found on the test's own PATH.
fn true_program() -> String {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("true"))
        .find(|path| path.is_file())
        .expect("true on PATH")
        .display()
        .to_string()
}

#[test]
fn random_command_lines_end_in_success_or_a_clear_error() {
    let runs: usize = std::env::var("CLI_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let seed = std::env::var("CLI_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("CLI_FUZZ_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let tools: [(&str, &str, &[&str]); 3] = [
        (env!("CARGO_BIN_EXE_udrun"), "udrun", &[]),
        (
            env!("CARGO_BIN_EXE_udbench"),
            "udbench",
            &["latency", "bw", "bibw", "mbw_mr", "multi_lat", "help"],
        ),
        (env!("CARGO_BIN_EXE_udinfo"), "udinfo", &[]),
    ];
    for (tool, name, subcommands) in tools {
        let options = options(tool);
        let mut codes = std::collections::BTreeMap::<i32, usize>::new();
        for _ in 0..runs {
            let mut args = arguments(&mut rng, &options, subcommands);
            if name == "udrun" && rng.bool() {
                // A rank count and a program, so that some lists parse whole.
                let n = ["1", "2", "0", "3"][rng.usize(..4)];
                args.splice(0..0, ["-n".to_owned(), n.to_owned()]);
                args.extend(["--".into(), true_program()]);
            }
            *codes.entry(check(tool, name, &args, seed)).or_default() += 1;
        }
        println!("{name}: {runs} runs, exit codes {codes:?}");
        assert!(codes.len() > 1, "{name}: every run ended alike: {codes:?}");
    }
}
