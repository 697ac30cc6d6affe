//! The MPI programs over a lossy `self,udbtl`: the component's fault
//! injector (`UDBTL_FAULT_*`) drops 5% of the datagrams, or duplicates and
//! reorders 5% each, and every program must still get every byte right.
//! Fewer sizes and ranks than the clean runs: repairs take time.

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

/// The faults injected in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Faults {
    /// 5% of datagrams lost.
    Drop,
    /// 5% of datagrams sent twice, and 5% held back behind the next one.
    DuplicateReorder,
}

impl Faults {
    /// `run` with these faults, from a fixed seed per program so a failure
    /// can be replayed.
    fn apply(self, run: Run, seed: u64) -> Run {
        let run = run.env("UDBTL_FAULT_SEED", &seed.to_string());
        match self {
            Self::Drop => run.env("UDBTL_FAULT_DROP", "0.05"),
            Self::DuplicateReorder => run
                .env("UDBTL_FAULT_DUPLICATE", "0.05")
                .env("UDBTL_FAULT_REORDER", "0.05"),
        }
    }
}

/// Sum over the ranks' `udbtl-stats:` lines of the counter `key` (for the
/// counters the harness's `Stats` does not carry).
fn total(out: &Output, key: &str) -> u64 {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| l.split_once("udbtl-stats:").map(|(_, rest)| rest))
        .flat_map(str::split_whitespace)
        .filter_map(|field| field.split_once('='))
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

/// Builds `name` and runs it on `np` ranks with `faults`; asserts success,
/// the `OK <name>` line, udbtl's traffic, and that the faults happened and
/// were repaired: with drops, some rank retransmitted.
fn run_faulty(name: &str, np: u32, faults: Faults, seed: u64, args: &[&str]) -> Output {
    let run = faults.apply(Run::udbtl(np), seed);
    let _turn = one_at_a_time();
    let exe = common::program(name);
    let out = run.success(&exe, args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.lines().any(|l| l.starts_with(&format!("OK {name}"))),
        "{name} with {np} ranks and {faults:?} did not say OK:\n{stdout}\nstderr:\n{stderr}"
    );
    common::assert_carried(&out, np);
    let stats = common::stats(&out.stderr);
    assert!(
        stats.iter().all(|s| s.lost_peers == 0),
        "{name} with {faults:?}: a peer was given up for lost:\n{stderr}"
    );
    match faults {
        Faults::Drop => assert!(
            stats.iter().any(|s| s.retransmitted > 0),
            "{name} with {faults:?}: no rank retransmitted, so nothing was lost:\n{stderr}"
        ),
        Faults::DuplicateReorder => assert!(
            total(&out, "duplicates") > 0,
            "{name} with {faults:?}: no duplicate was seen:\n{stderr}"
        ),
    }
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
/// arguments for `p2p`. (The same lookup as in `programs_p2p.rs`: test
/// binaries share no code but `common`.)
fn threshold_args() -> &'static [String] {
    static ARGS: OnceLock<Vec<String>> = OnceLock::new();
    ARGS.get_or_init(|| {
        let limits = thresholds([65536, 65536, 131072]);
        limits.iter().map(u64::to_string).collect()
    })
}

fn p2p(faults: Faults) {
    // Sizes up to 1 MiB cover every protocol; beyond is more of the same.
    let mut args = vec!["--max", "1048576"];
    args.extend(threshold_args().iter().map(String::as_str));
    run_faulty("p2p", 2, faults, 11, &args);
}

#[test]
fn p2p_with_drops() {
    require_openmpi!();
    p2p(Faults::Drop);
}

#[test]
fn p2p_with_duplicates_and_reordering() {
    require_openmpi!();
    p2p(Faults::DuplicateReorder);
}

#[test]
fn matching_with_drops() {
    require_openmpi!();
    run_faulty("matching", 3, Faults::Drop, 12, &[]);
}

#[test]
fn matching_with_duplicates_and_reordering() {
    require_openmpi!();
    run_faulty("matching", 3, Faults::DuplicateReorder, 12, &[]);
}

#[test]
fn datatypes_with_drops() {
    require_openmpi!();
    run_faulty("datatypes", 3, Faults::Drop, 13, &[]);
}

#[test]
fn datatypes_with_duplicates_and_reordering() {
    require_openmpi!();
    run_faulty("datatypes", 3, Faults::DuplicateReorder, 13, &[]);
}

#[test]
fn collectives_with_drops() {
    require_openmpi!();
    run_faulty("collectives", 4, Faults::Drop, 14, &[]);
}

#[test]
fn collectives_with_duplicates_and_reordering() {
    require_openmpi!();
    run_faulty("collectives", 4, Faults::DuplicateReorder, 14, &[]);
}

#[test]
fn connectivity_with_drops() {
    require_openmpi!();
    run_faulty("connectivity", 8, Faults::Drop, 15, &[]);
}

#[test]
fn size_suffixes_parse() {
    assert_eq!(parse_size("65536"), Some(65536));
    assert_eq!(parse_size(" 64K\n"), Some(65536));
    assert_eq!(parse_size("unset"), None);
}
