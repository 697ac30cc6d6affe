//! Ranks on a "remote" host, reached through a fake ssh that runs them on
//! this machine in a session of their own: PMI over `PMI_PORT`, a remote
//! rank killed with its job, sealed datagrams keyed from the job secret on
//! local and remote ranks, the secrets line on the launcher's stdin kept
//! apart from the ranks' stdin, the startup timeout of a rank that never
//! connects, and the address PMI is served on.

use crate::harness::{
    FAKE_SSH, NOT_WAITED_OUT, assert_all_saw, assert_fails, eventually, gone, launch,
    one_remote_rank_args, pmi_rank, ranks_of_line, remote_args, run_command, run_script,
    run_with_stdin, scratch, script_file, udrun, zombie,
};

/// With `UDBTL_AUTH`, every rank's datagram keys derive from the job secret
/// that udrun hands local ranks in their environment and remote ones on the
/// launcher's stdin, so no key travels through PMI: a job across both kinds
/// of rank greets all round, authenticated and encrypted, and every rank's
/// dump says how it seals and where its keys came from.
#[test]
fn sealed_datagrams_key_from_the_job_secret_on_local_and_remote_ranks() {
    let dir = scratch("auth-keys");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    for (auth, integrity) in [
        ("1", "integrity aes-256-gcm (keys from the job secret)"),
        (
            "encrypt",
            "integrity aes-256-gcm, encrypted (keys from the job secret)",
        ),
    ] {
        let setting = format!("UDBTL_AUTH={auth}");
        let mut cmd = udrun(&remote_args(&ssh, &["-x", &setting, "-x", "UDBTL_DUMP=1"]));
        cmd.arg(env!("CARGO_BIN_EXE_udhello"));
        let run = run_command(cmd);
        assert_eq!(run.code, Some(0), "{setting}: {run:#?}");
        assert_eq!(
            run.stdout.matches("greeted and acknowledged").count(),
            3,
            "{setting}: {run:#?}"
        );
        let sealed: usize = run
            .stderr
            .lines()
            .filter(|l| l.contains(integrity))
            .map(ranks_of_line)
            .sum();
        assert_eq!(sealed, 3, "{setting}: {run:#?}");
    }
}

#[test]
fn remote_ranks_use_pmi_port_and_die_with_the_job() {
    let dir = scratch("remote");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    // Rank 0 here over PMI_FD; ranks 1 and 2 on "node" over PMI_PORT.
    let after = r#"echo "rank $rank ${PMI_PORT:+port} $UDRUN_LOCAL_RANK/$UDRUN_LOCAL_SIZE ${UDRUN_TEST_VAR-unset}""#;
    let script = pmi_rank("", after);
    let mut cmd = udrun(&remote_args(&ssh, &[]));
    cmd.env("UDRUN_TEST_VAR", "exported")
        .args(["-x", "UDRUN_TEST_VAR", "bash", "-c", &script]);
    let run = run_command(cmd);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_all_saw(&run, 3);
    for line in [
        "rank 0  0/1 exported",
        "rank 1 port 0/2 exported",
        "rank 2 port 1/2 exported",
    ] {
        assert!(run.stdout.lines().any(|l| l == line), "{line:?}: {run:#?}");
    }

    // A remote rank that hangs is killed when a local one fails, through
    // its ssh's stdin.
    let hang = pmi_rank(
        r#"echo "pid $$"; [ "$rank" = 0 ] && { sleep 0.5; exit 4; }; sleep 1000"#,
        "",
    );
    let run = run_script(&one_remote_rank_args(&ssh), &hang);
    assert_fails(&run, 4, &["rank 0 (pid ", "exited with code 4"]);
    let pids: Vec<u32> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("pid ")?.parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "{run:#?}");
    eventually(&format!("remote rank left: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid) || zombie(pid))
    });
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_remote_rank_that_never_connects_ends_the_job_at_the_startup_timeout() {
    let dir = scratch("startup");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    let script = format!(
        "[ -n \"${{PMI_PORT:-}}\" ] && exec sleep 1000\n{}",
        pmi_rank("", "")
    );
    let run = run_script(&remote_args(&ssh, &["--startup-timeout", "1"]), &script);
    assert_fails(
        &run,
        1,
        &[
            "rank 1 (host node, fake-ssh pid ",
            "did not connect to PMI within --startup-timeout 1 s (nor did 1 other rank); \
             killing the job",
        ],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn stdin_goes_to_local_rank_0_and_the_secrets_line_is_not_seen_as_stdin() {
    let dir = scratch("stdin-remote");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    // Rank 0 here reads udrun's stdin; the remote ranks read /dev/null
    // (their launcher's stdin, after the secrets line, is the watcher's).
    let cmd = udrun(&remote_args(
        &ssh,
        &[
            "sh",
            "-c",
            r#"r=${PMI_RANK:-r$PMI_ID}; while read -r l; do echo "$r:$l"; done; echo "$r:eof:${#UDBTL_PMI_SECRET}""#,
        ],
    ));
    let run = run_with_stdin(cmd, b"a\nb\n");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let stdout = &run.stdout;
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    // Every rank has all 64 hex digits of the secret (authenticated
    // datagrams key from it): local rank 0 in its environment, the remote
    // ones from the secrets line.
    assert_eq!(
        lines,
        ["0:a", "0:b", "0:eof:64", "r1:eof:64", "r2:eof:64"],
        "{stdout}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn pmi_is_served_on_the_advertised_address_unless_pmi_listen_any() {
    let dir = scratch("listen");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    // The remote rank finds udrun's listening socket in /proc/net/tcp.
    let script = r#"p=$(printf '%04X' "${PMI_PORT##*:}")
awk -v p=":$p" '$4 == "0A" && substr($2, length($2) - 4) == p { print "listen " $2 }' /proc/net/tcp"#;
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let advertised = std::net::ToSocketAddrs::to_socket_addrs(&(this_host.trim(), 0))
        .unwrap()
        .find(std::net::SocketAddr::is_ipv4);
    for (any, expected) in [(false, advertised), (true, Some(([0, 0, 0, 0], 0).into()))] {
        let mut args = vec!["-n", "1", "--host", "node", "--launcher-exec"];
        args.push(ssh.to_str().unwrap());
        if any {
            args.push("--pmi-listen-any");
        }
        args.extend(["bash", "-c", script]);
        let run = launch(&args);
        assert_eq!(run.code, Some(0), "{run:#?}");
        let Some(std::net::SocketAddr::V4(expected)) = expected else {
            // This host's name resolves to IPv6 only: not checked here.
            continue;
        };
        // /proc/net/tcp shows the address as a little-endian u32 in hex.
        let hex = format!("{:08X}:", u32::from_le_bytes(expected.ip().octets()));
        let listen: Vec<&str> = run
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("listen "))
            .collect();
        assert_eq!(listen.len(), 1, "{run:#?}");
        assert!(listen[0].starts_with(&hex), "{hex}: {run:#?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
