//! Jobs under `udrun`, through `udprobe`, whose datagrams the kernel drops
//! or rewrites: nftables rules on loopback in a private network namespace.
//! Every message still arrives exactly once and intact. (Moved from
//! `probes.rs`, which holds the jobs where ranks misbehave.)
//!
//! Needs root, `nft`, `unshare` and `ip`: ignored otherwise (`SKIPPED:
//! ...`). Whether this kernel lets a namespace be made, and takes the
//! payload-rewriting rule, only running tells: a test that finds not says
//! `SKIPPED: <reason>` and records it (see udbtl-prereq).

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

fn text(output: &Output) -> String {
    let (stdout, stderr) = common::text(output);
    format!("{stdout}\n{stderr}")
}

/// One job at a time: each takes both CPUs of a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const PROBE: &str = env!("CARGO_BIN_EXE_udprobe");

/// Why the kernel tests cannot run here, if they cannot: the prerequisites
/// the build probed, checked again, and whether a network namespace can be
/// made.
fn kernel_unavailable() -> Option<String> {
    use udbtl_prereq::Prereq;
    let needs = [
        Prereq::Root,
        Prereq::Program("nft"),
        Prereq::Program("unshare"),
        Prereq::Program("ip"),
    ];
    if let Some(reason) = udbtl_prereq::missing(&needs) {
        return Some(reason);
    }
    let namespace = Command::new("unshare")
        .args(["-n", "true"])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|o| {
            if o.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&o.stderr).into_owned())
            }
        });
    namespace
        .err()
        .map(|e| format!("cannot create a network namespace: {e}"))
}

/// The exit code of the job script when nft refuses the fault rule.
const RULE_REFUSED: i32 = 77;

/// Runs `udrun -n 2 udprobe args…` in a private network namespace whose
/// loopback input applies the nftables `rule` to UDP only (not to the PMI
/// socketpairs); prints the rule's counters after the job.
fn kernel_job(rule: &str, args: &[&str], env: &[(&str, &str)]) -> common::Finished {
    let script = format!(
        "set -e
ip link set lo up
nft add table inet udprobe
nft 'add chain inet udprobe in {{ type filter hook input priority 0; }}'
set +e
nft add rule inet udprobe in iif lo meta l4proto udp {rule} || exit {RULE_REFUSED}
probe=\"$1\"
shift
\"$0\" -n 2 \"$probe\" \"$@\"
rc=$?
nft list table inet udprobe
exit $rc"
    );
    let udrun = common::udrun_exe();
    let mut command_args = vec!["-n", "sh", "-c", &script, udrun, PROBE];
    command_args.extend_from_slice(args);
    let child = common::clean_command("unshare", &command_args, env)
        .spawn()
        .expect("unshare starts");
    common::finish(child, KERNEL_JOB_LIMIT)
}

/// How long a job under a kernel rule may take before it counts as hung:
/// far above what repair costs even on a loaded machine. At 30 % loss, 4000
/// messages took 11–26 s on a quiet 2-CPU VM and over 60 s under load (each
/// of several hundred timeouts backs off), which the 60 s the probe used to
/// allow turned into a failure: a test must not depend on speed.
const KERNEL_JOB_LIMIT: Duration = Duration::from_secs(330);
/// The probe's own deadline, inside [`KERNEL_JOB_LIMIT`].
const KERNEL_JOB_TIMEOUT: &str = "300";

/// The first counter's packet count in an nft listing.
fn rule_packets(all: &str) -> u64 {
    all.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// 30 % of UDP dropped by the kernel: rank 0 sends 4000 messages and
/// finalizes at once; its finalize waits until rank 1 has them all.
#[test]
#[cfg_attr(
    any(
        udbtl_missing = "root",
        udbtl_missing = "nft",
        udbtl_missing = "unshare",
        udbtl_missing = "ip"
    ),
    ignore = "SKIPPED: needs root, nft, unshare and ip (CI has them)"
)]
fn finalize_through_thirty_percent_kernel_loss() {
    let _serial = serial();
    if let Some(why) = kernel_unavailable() {
        udbtl_prereq::skipped!("{why}");
        return;
    }
    // One message per datagram: coalesced, 4000 small messages fit in a
    // few dozen datagrams and the rule would drop too few to test repair.
    let job = kernel_job(
        "numgen random mod 100 '<' 30 counter drop",
        &[
            "--messages",
            "4000",
            "--timeout",
            KERNEL_JOB_TIMEOUT,
            "finalize-busy",
            "--busy-ms",
            "0",
        ],
        &[("UDBTL_COALESCE", "0")],
    );
    let all = text(&job.output);
    println!(
        "30 % kernel loss: {} in {:.1} s\n{all}",
        job.output.status,
        job.elapsed.as_secs_f64()
    );
    assert!(!job.timed_out, "the job hung: {all}");
    assert!(job.output.status.success(), "{all}");
    assert!(
        all.contains("all 4000 messages from rank 0, in order and intact"),
        "{all}"
    );
    assert!(all.contains("rank 0: finalize OK"), "{all}");
    assert!(all.contains("rank 1: finalize OK"), "{all}");
    let dropped = rule_packets(&all);
    println!("30 % kernel loss: the kernel dropped {dropped} datagrams");
    assert!(dropped > 500, "the rule really dropped: {all}");
}

/// The payload byte the corruption rule overwrites: byte 4 of the
/// application's payload (a byte of `udprobe`'s sequence number), after the
/// UDP header (8), the UD header (16) and the BTL and reliability headers
/// (40). In bits, from the transport header.
const CORRUPT_BIT: usize = (8 + 16 + 40 + 4) * 8;

/// 5 % of UDP datagrams have a payload byte rewritten on the way in (on
/// loopback the kernel does not verify the UDP checksum), with the
/// checksum setting `checksum` (`None`: the default).
fn corruption(checksum: Option<&str>) {
    let _serial = serial();
    if let Some(why) = kernel_unavailable() {
        udbtl_prereq::skipped!("{why}");
        return;
    }
    let rule = format!("numgen random mod 100 '<' 5 @th,{CORRUPT_BIT},8 set 0x55 counter");
    // One message per datagram, so that the rule hits many of them and the
    // byte it rewrites is a payload byte (see CORRUPT_BIT).
    let mut env = vec![("UDBTL_COALESCE", "0")];
    if let Some(checksum) = checksum {
        env.push(("UDBTL_CHECKSUM", checksum));
    }
    let job = kernel_job(
        &rule,
        &[
            "--messages",
            "2000",
            "--timeout",
            KERNEL_JOB_TIMEOUT,
            "finalize-busy",
            "--busy-ms",
            "0",
        ],
        &env,
    );
    let all = text(&job.output);
    if job.output.status.code() == Some(RULE_REFUSED) {
        udbtl_prereq::skipped!("the kernel refused the mangling rule ({rule}): {all}");
        return;
    }
    println!(
        "5 % payload corruption (checksum {checksum:?}): {} in {:.1} s\n{all}",
        job.output.status,
        job.elapsed.as_secs_f64()
    );
    let mangled = rule_packets(&all);
    println!("5 % payload corruption: the rule rewrote {mangled} datagrams");
    assert!(!job.timed_out, "the job hung: {all}");
    assert!(
        !all.contains("is wrong or out of order"),
        "corrupted payloads reached the application: {all}"
    );
    assert!(
        all.contains("all 2000 messages from rank 0, in order and intact"),
        "{all}"
    );
    assert!(job.output.status.success(), "{all}");
    assert!(mangled > 20, "the rule really rewrote: {all}");
}

/// Corruption with the default checksum setting. (This failed while
/// `checksum=auto` turned the transport's CRC off on UDP, trusting UDP's own
/// checksum, which the kernel does not verify on loopback: with 4 datagrams
/// rewritten, rank 1 got messages 37, 40, 56 and 62 wrong and nothing
/// reported an error. The CRC is now on for every fabric but InfiniBand.)
#[test]
#[cfg_attr(
    any(
        udbtl_missing = "root",
        udbtl_missing = "nft",
        udbtl_missing = "unshare",
        udbtl_missing = "ip"
    ),
    ignore = "SKIPPED: needs root, nft, unshare and ip (CI has them)"
)]
fn corrupted_payloads_are_caught_with_the_default_checksum_setting() {
    corruption(None);
}

/// Corruption with the transport's checksum forced on.
#[test]
#[cfg_attr(
    any(
        udbtl_missing = "root",
        udbtl_missing = "nft",
        udbtl_missing = "unshare",
        udbtl_missing = "ip"
    ),
    ignore = "SKIPPED: needs root, nft, unshare and ip (CI has them)"
)]
fn corrupted_payloads_are_caught_with_the_checksum_on() {
    corruption(Some("on"));
}
