//! Point-to-point MPI programs over `self,udbtl`: every message size around
//! ob1's protocol thresholds (`p2p.c`), and wildcard, probe and synchronous
//! receives (`matching.c`), each with 1, 2, 3, 4 and 8 ranks.

mod common;

use std::process::Output;

use common::{
    Run, assert_counted, assert_never_counted, parse_size, run_ok, stats_fields, threshold_args,
    total,
};

/// `p2p` with the thresholds; sizes up to `max` bytes. Returns the run.
fn p2p(np: u32, max: &str) -> Output {
    p2p_with(&Run::udbtl(np), max)
}

fn p2p_with(run: &Run, max: &str) -> Output {
    let mut args = vec!["--max", max];
    args.extend(threshold_args().iter().map(String::as_str));
    run_ok("p2p", run, &args)
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_1_rank() {
    require_openmpi!();
    p2p(1, "67108864");
}

/// Large contiguous messages go by ob1's RGET protocol. Between two
/// processes of one host, at the defaults, the reader copies them straight
/// from the sender's memory (`gets_local`), where the kernel lets it: as
/// root, or as a user whom Yama does not restrict.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_2_ranks() {
    require_openmpi!();
    let out = p2p(2, "67108864");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if single_copy_allowed() {
        assert!(total(&out, "gets_local") > 0, "{stderr}");
    } else {
        assert!(total(&out, "gets") > 0, "{stderr}");
    }
    assert_eq!(total(&out, "gets"), total(&out, "gets_served"));
}

/// Whether the kernel lets a process read another of the same user:
/// root may, and so may anyone where Yama's `ptrace_scope` is 0 or absent.
fn single_copy_allowed() -> bool {
    udbtl_prereq::Prereq::Root.missing().is_none()
        || std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .map_or(true, |scope| scope.trim() == "0")
}

/// With `btl_udbtl_single_copy 0`, the same messages go over the network,
/// as between hosts: both ranks asked for some and served some.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_2_ranks_with_gets_over_the_network() {
    require_openmpi!();
    let out = p2p_with(&Run::udbtl(2).mca("btl_udbtl_single_copy", "0"), "67108864");
    assert_counted(&out, "gets");
    assert_eq!(total(&out, "gets"), total(&out, "gets_served"));
    assert_never_counted(&out, "gets_local");
}

/// Where the kernel refuses to let one process read another (here a
/// program that nobody may run but not read, whose processes are
/// non-dumpable; Yama's `ptrace_scope` refuses the same way), the module
/// says so once and its gets go over the network: every message arrives.
#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "runuser"
    ),
    ignore = "SKIPPED: needs Open MPI, root and runuser (util-linux)"
)]
fn p2p_2_ranks_where_the_kernel_refuses_a_single_copy() {
    require_openmpi!();
    udbtl_prereq::require!(
        udbtl_prereq::Prereq::Root,
        udbtl_prereq::Prereq::Program("runuser")
    );
    let _turn = common::serial();
    let run = Run::udbtl(2).mca("btl_base_verbose", "1");
    let mut args = vec!["--max", "4194304"];
    args.extend(threshold_args().iter().map(String::as_str));
    let out = match common::nobody::output("p2p", &run, &args, 0o711) {
        Ok(out) => out,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("in one copy was refused"),
        "the refusal is told:\n{stderr}"
    );
    assert_eq!(total(&out, "gets_local"), 0, "{stderr}");
    assert!(total(&out, "gets") > 0, "{stderr}");
    assert_eq!(total(&out, "gets"), total(&out, "gets_served"));
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_3_ranks() {
    require_openmpi!();
    p2p(3, "4194304");
}

/// Without get (`btl_udbtl_flags send`), large messages go as ob1's
/// pipeline of `max_send_size` fragments, and arrive the same.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_2_ranks_without_get() {
    require_openmpi!();
    let out = p2p_with(&Run::udbtl(2).mca("btl_udbtl_flags", "send"), "4194304");
    assert_never_counted(&out, "gets");
}

/// With `btl_udbtl_read_copy streaming`, gets over the network copy into the receive
/// buffers with streaming stores, from the first byte of each datagram's
/// payload, wherever it falls: every message of every length arrives the
/// same.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_2_ranks_with_gets_copied_by_streaming_stores() {
    require_openmpi!();
    let out = p2p_with(
        &Run::udbtl(2)
            .mca("btl_udbtl_read_copy", "streaming")
            .mca("btl_udbtl_single_copy", "0"),
        "4194304",
    );
    assert_counted(&out, "gets");
}

/// With `lend_after` 0, `prepare_src` lends every contiguous eager message
/// longer than a datagram, stream or not, and must take each one whole: ob1
/// sends what comes back as the message (up to ob1's eager limit, which is
/// longer than `max_send_size` on loopback).
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_2_ranks_lending_every_eager_message() {
    require_openmpi!();
    let out = p2p_with(&Run::udbtl(2).mca("btl_udbtl_lend_after", "0"), "1048576");
    assert_counted(&out, "eager_lent");
}

/// Without `inplace` among `btl_udbtl_flags`, ob1 copies every eager
/// message itself (`sendi`, or `alloc` and pack): nothing is lent.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_2_ranks_with_ob1_copying_eager_messages() {
    require_openmpi!();
    let out = p2p_with(&Run::udbtl(2).mca("btl_udbtl_flags", "send,get"), "1048576");
    assert_never_counted(&out, "eager_lent");
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_4_ranks() {
    require_openmpi!();
    p2p(4, "4194304");
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_8_ranks() {
    require_openmpi!();
    p2p(8, "4194304");
}

/// `p2p` with sealed datagrams, set as users set the MCA parameter:
/// `btl_udbtl_auth=1` authenticates, `encrypt` also encrypts. Every size
/// through ob1's protocols arrives checked on 2 ranks, every rank says it
/// sealed, and nothing was refused.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_2_ranks_sealed() {
    require_openmpi!();
    for (auth, word) in [("1", "sealed"), ("encrypt", "encrypted")] {
        let mut args = vec!["--max", "4194304"];
        args.extend(threshold_args().iter().map(String::as_str));
        // Gets over the network, so that their replies are sealed too.
        let run = Run::udbtl(2)
            .mca("btl_udbtl_auth", auth)
            .mca("btl_udbtl_single_copy", "0");
        let out = run_ok("p2p", &run, &args);
        let ranks = stats_fields(&out.stderr);
        assert_eq!(ranks.len(), 2, "auth {auth}");
        for fields in &ranks {
            assert!(
                fields.iter().any(|(k, v)| k == "integrity" && v == word),
                "auth {auth}: {fields:?}"
            );
        }
        for refused in ["unauthenticated", "replayed"] {
            assert_eq!(total(&out, refused), 0, "auth {auth}: {refused}");
        }
        assert!(total(&out, "gets") > 0, "auth {auth}: gets sealed too");
    }
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn matching_1_rank() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(1), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn matching_2_ranks() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(2), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn matching_3_ranks() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(3), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn matching_4_ranks() {
    require_openmpi!();
    run_ok("matching", &Run::udbtl(4), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
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
