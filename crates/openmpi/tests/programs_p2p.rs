//! Point-to-point MPI programs over `self,udbtl`: every message size around
//! ob1's protocol thresholds (`p2p.c`), and wildcard, probe and synchronous
//! receives (`matching.c`), each with 1, 2, 3, 4 and 8 ranks.

mod common;

use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use common::Run;

/// One `mpirun` at a time from this file: the machine may have 2 CPUs, and
/// several 8-rank jobs at once would starve each other into timeouts.
static LAUNCH: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    LAUNCH.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds `name` and runs it on `run`, one launch at a time (building is in
/// the lock too: the harness builds into one temporary file per process).
/// Asserts success, the program's `OK <name>` line and udbtl's traffic.
fn run_ok(name: &str, run: &Run, args: &[&str]) -> Output {
    let _turn = one_at_a_time();
    let exe = common::program(name);
    let out = run.success(&exe, args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l.starts_with(&format!("OK {name}"))),
        "{name} with {} ranks did not say OK:\n{stdout}\nstderr:\n{}",
        run.np,
        String::from_utf8_lossy(&out.stderr)
    );
    common::assert_carried(&out, run.np);
    out
}

/// A size as Open MPI prints it: a number, maybe with a K, M or G suffix.
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last()? {
        (i, 'k' | 'K') => (&text[..i], 1 << 10),
        (i, 'm' | 'M') => (&text[..i], 1 << 20),
        (i, 'g' | 'G') => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok().map(|n| n * unit)
}

/// The thresholds ob1 switches protocol at: the component's
/// `btl_udbtl_{eager_limit,rndv_eager_limit,max_send_size}`.
///
/// They come from `ompi_info` when the component registers them as MCA
/// parameters; otherwise from its own `udbtl-stats:` line (which reports the
/// limits it gave ob1) after a small run; otherwise from `defaults`. Any
/// source may lack some of them.
fn thresholds(defaults: [u64; 3]) -> [u64; 3] {
    const NAMES: [&str; 3] = ["eager_limit", "rndv_eager_limit", "max_send_size"];
    let mut found: [Option<u64>; 3] = [None; 3];

    let info = Command::new("ompi_info")
        .args(["--param", "btl", "udbtl", "--level", "9", "--parsable"])
        .env("OMPI_MCA_mca_base_component_path", common::component_path())
        .output()
        .expect("run ompi_info");
    for line in String::from_utf8_lossy(&info.stdout).lines() {
        for (i, name) in NAMES.iter().enumerate() {
            let key = format!("mca:btl:udbtl:param:btl_udbtl_{name}:value:");
            if let Some(value) = line.strip_prefix(&key) {
                found[i] = found[i].or(parse_size(value));
            }
        }
    }

    if found.iter().any(Option::is_none) {
        let _turn = one_at_a_time();
        let exe = common::program("hello");
        let out = Run::udbtl(2).output(&exe, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        for field in stderr
            .lines()
            .filter_map(|l| l.split_once("udbtl-stats:").map(|(_, rest)| rest))
            .flat_map(str::split_whitespace)
        {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            if let Some(i) = NAMES.iter().position(|n| *n == key) {
                found[i] = found[i].or(parse_size(value));
            }
        }
    }

    let mut limits = defaults;
    for (limit, value) in limits.iter_mut().zip(found) {
        if let Some(value) = value.filter(|v| *v > 0) {
            *limit = value;
        }
    }
    limits
}

/// The component's thresholds, looked up once per test binary, as
/// arguments for `p2p`.
fn threshold_args() -> &'static [String] {
    static ARGS: OnceLock<Vec<String>> = OnceLock::new();
    ARGS.get_or_init(|| {
        let limits = thresholds([65536, 65536, 131072]);
        eprintln!("ob1 thresholds (eager, rndv eager, max send): {limits:?}");
        limits.iter().map(u64::to_string).collect()
    })
}

/// `p2p` with the thresholds; sizes up to `max` bytes.
fn p2p(np: u32, max: &str) {
    let mut args = vec!["--max", max];
    args.extend(threshold_args().iter().map(String::as_str));
    run_ok("p2p", &Run::udbtl(np), &args);
}

#[test]
fn p2p_1_rank() {
    require_openmpi!();
    p2p(1, "67108864");
}

/// The only run up to 64 MiB between processes: large sizes are what take
/// the time.
#[test]
fn p2p_2_ranks() {
    require_openmpi!();
    p2p(2, "67108864");
}

#[test]
fn p2p_3_ranks() {
    require_openmpi!();
    p2p(3, "4194304");
}

#[test]
fn p2p_4_ranks() {
    require_openmpi!();
    p2p(4, "4194304");
}

#[test]
fn p2p_8_ranks() {
    require_openmpi!();
    p2p(8, "4194304");
}

#[test]
fn matching_1_rank() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(1), &[]);
}

#[test]
fn matching_2_ranks() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(2), &[]);
}

#[test]
fn matching_3_ranks() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(3), &[]);
}

#[test]
fn matching_4_ranks() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(4), &[]);
}

#[test]
fn matching_8_ranks() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(8), &[]);
}

#[test]
fn size_suffixes_parse() {
    assert_eq!(parse_size("65536"), Some(65536));
    assert_eq!(parse_size(" 64K\n"), Some(65536));
    assert_eq!(parse_size("1M"), Some(1 << 20));
    assert_eq!(parse_size("unset"), None);
    assert_eq!(parse_size(""), None);
}
