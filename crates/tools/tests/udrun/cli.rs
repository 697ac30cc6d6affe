//! udrun's command line and what it sets up for the ranks: bad command
//! lines, mpirun's spellings, slots and `--oversubscribe`, a huge `-n` and
//! the descriptor limit, `--host` and `--hostfile`, `--tag-output` and a line
//! every rank prints shown once, `-x` and the job's variables, `--bind-to
//! core`, `--report-startup`, stdin, and a launcher or resource failure named
//! in one line.

use std::collections::HashSet;
use std::process::{Command, Stdio};

use crate::harness::{
    NOT_WAITED_OUT, Run, assert_all_saw, assert_fails, launch, pmi_rank, run_command, run_script,
    run_with_stdin, scratch, script_file, udrun,
};

#[test]
fn bad_command_lines_get_one_line_and_status_2() {
    for args in [
        &["-n", "2", "--bogus", "true"][..],
        &["-n", "0", "true"],
        &["-n", "two", "true"],
        &["-n", "2"],
        &["true"],
        &["-n", "2", "--bind-to", "socket", "true"],
        &["-n", "2", "-x", "1BAD", "true"],
        &["-n", "2", "--host", "a:0", "true"],
    ] {
        let run = launch(args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:#?}");
        assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {run:#?}");
        assert!(run.stderr.starts_with("udrun: "), "{args:?}: {run:#?}");
        assert!(run.stdout.is_empty(), "{args:?}: {run:#?}");
    }
    let run = launch(&["-n", "0", "true"]);
    assert!(run.stderr.contains("'0' for '-n <N>'"), "{run:#?}");
    let run = launch(&["-n", "2"]);
    assert!(run.stderr.contains("<PROGRAM>"), "{run:#?}");
}

#[test]
fn an_unreachable_host_fails_fast() {
    let run = launch(&["-n", "2", "--host", "no-such-host.invalid", "true"]);
    assert_fails(&run, 1, &["cannot reach host no-such-host.invalid: "]);
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    // Without ssh.
    let run = launch(&[
        "-n",
        "2",
        "--host",
        "no-such-host.invalid",
        "--launcher-exec",
        "/no/such/ssh",
        "true",
    ]);
    assert_fails(
        &run,
        1,
        &["cannot reach host no-such-host.invalid: /no/such/ssh not found"],
    );
}

#[test]
fn tag_output_prefixes_every_line() {
    let run = launch(&[
        "-n",
        "2",
        "--tag-output",
        "sh",
        "-c",
        "echo one; echo two >&2; printf 'no newline'",
    ]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    for rank in 0..2 {
        for (text, stream) in [
            ("one", &run.stdout),
            ("no newline", &run.stdout),
            ("two", &run.stderr),
        ] {
            let line = format!("[{rank}] {text}");
            assert!(stream.lines().any(|l| l == line), "{line:?}: {run:#?}");
        }
    }
    assert_eq!(run.stdout.lines().count(), 4, "{run:#?}");
    // Untagged, output passes unchanged.
    let run = launch(&["-n", "1", "sh", "-c", "printf 'a\\nb'"]);
    assert_eq!(run.stdout, "a\nb");
}

#[test]
fn exports_and_job_variables_reach_the_ranks() {
    let print = r#"echo "$PMI_RANK $UDBTL_JOB_KEY $UDRUN_JOB_KEY $UDRUN_LOCAL_RANK $UDRUN_LOCAL_SIZE ${UDRUN_TEST_VAR-unset}""#;
    let launch = || {
        let run = launch(&[
            "-n",
            "3",
            "-x",
            "UDRUN_TEST_VAR=a b=c",
            "-x",
            "HOME",
            "sh",
            "-c",
            print,
        ]);
        assert_eq!(run.code, Some(0), "{run:#?}");
        let mut keys = HashSet::new();
        for line in run.stdout.lines() {
            let words: Vec<&str> = line.splitn(6, ' ').collect();
            assert_eq!(
                words[1], words[2],
                "UDBTL_JOB_KEY and UDRUN_JOB_KEY differ: {line}"
            );
            assert_ne!(words[1].parse::<u32>().unwrap(), 0, "{line}");
            assert_eq!(words[0], words[3], "local rank: {line}");
            assert_eq!(words[4], "3", "local size: {line}");
            assert_eq!(words[5], "a b=c", "-x: {line}");
            keys.insert(words[1].to_owned());
        }
        assert_eq!(run.stdout.lines().count(), 3, "{run:#?}");
        assert_eq!(keys.len(), 1, "one key per job: {run:#?}");
        keys.into_iter().next().unwrap()
    };
    assert_ne!(launch(), launch(), "two launches, one key");
}

/// The CPUs this process may use, from a `Cpus_allowed_list` value.
fn cpu_list(text: &str) -> Vec<usize> {
    text.trim()
        .split(',')
        .flat_map(|range| match range.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![range.parse().unwrap()],
        })
        .collect()
}

#[test]
fn bind_to_core_pins_each_local_rank() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    let cpus = cpu_list(ours);
    let show = r#"echo "$PMI_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)""#;
    let n = cpus.len() + 1;
    let run = launch(&["-n", &n.to_string(), "--bind-to", "core", "sh", "-c", show]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    // More ranks than CPUs: said once.
    assert_eq!(run.reports().len(), 1, "{run:#?}");
    let notice = format!("{n} local ranks on {} CPUs", cpus.len());
    assert!(run.reports()[0].contains(&notice), "{run:#?}");
    for line in run.stdout.lines() {
        let (rank, list) = line.split_once(' ').unwrap();
        let rank: usize = rank.parse().unwrap();
        assert_eq!(cpu_list(list), [cpus[rank % cpus.len()]], "{line}");
    }
    // --bind-to none (the default) leaves the mask alone.
    let run = launch(&["-n", "1", "sh", "-c", show]);
    assert_eq!(cpu_list(run.stdout.split_once(' ').unwrap().1), cpus);
}

#[test]
fn report_startup_times_the_first_barrier() {
    let run = run_script(&["-n", "4", "--report-startup"], &pmi_rank("", ""));
    assert_eq!(run.code, Some(0), "{run:#?}");
    let reports = run.reports();
    assert_eq!(reports.len(), 1, "{run:#?}");
    let ms = reports[0]
        .strip_prefix("udrun: 4 ranks, first barrier after ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .unwrap_or_else(|| panic!("{run:#?}"));
    assert!(ms.parse::<f64>().unwrap() > 0.0);
}

#[test]
fn hostfile_places_ranks_here_and_rejects_bad_lines() {
    let dir = scratch("hostfile");
    let good = dir.join("good");
    std::fs::write(&good, "# this machine\nlocalhost slots=2\n127.0.0.1\n").unwrap();
    let run = run_script(
        &["-n", "3", "--hostfile", good.to_str().unwrap()],
        &pmi_rank("", ""),
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_all_saw(&run, 3);
    let bad = dir.join("bad");
    std::fs::write(&bad, "localhost\nnode2 cpus=4\n").unwrap();
    let run = launch(&["-n", "2", "--hostfile", bad.to_str().unwrap(), "true"]);
    assert_fails(&run, 2, &["line 2", "cpus=4"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn mpirun_spellings_np_and_h_work_and_tips_survive() {
    let run = launch(&[
        "-np",
        "2",
        "-H",
        "localhost:2",
        "sh",
        "-c",
        "echo $PMI_SIZE",
    ]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.stdout, "2\n2\n");
    // A program's own -np is its own.
    let run = launch(&["-np", "1", "echo", "-np", "3"]);
    assert_eq!(run.stdout, "-np 3\n", "{run:#?}");
    let run = launch(&["-n", "1", "--tag-outptu", "true"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
    assert!(
        run.stderr
            .contains("tip: a similar argument exists: '--tag-output'"),
        "{run:#?}"
    );
}

#[test]
fn more_ranks_than_slots_needs_oversubscribe() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|list| cpu_list(list).len())
        .unwrap();
    let strict = |args: &[&str]| {
        let mut cmd = udrun(args);
        cmd.env_remove("UDRUN_OVERSUBSCRIBE");
        run_command(cmd)
    };
    let over = (cpus + 1).to_string();
    let run = strict(&["-n", &over, "sh", "-c", "echo ran"]);
    assert_fails(
        &run,
        1,
        &[
            &format!(
                "{over} ranks but {cpus} CPU{} here",
                if cpus == 1 { "" } else { "s" }
            ),
            "--oversubscribe",
        ],
    );
    assert!(run.stdout.is_empty(), "{run:#?}");
    let run = strict(&["-n", &over, "--oversubscribe", "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    // slots= is a limit.
    let run = strict(&["-n", "3", "--host", "localhost:2", "sh", "-c", "echo ran"]);
    assert_fails(&run, 1, &["3 ranks but 2 slots", "--oversubscribe"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
    let dir = scratch("slots");
    let file = dir.join("hosts");
    std::fs::write(&file, "localhost slots=4\n").unwrap();
    let run = strict(&["-n", "5", "--hostfile", file.to_str().unwrap(), "true"]);
    assert_fails(&run, 1, &["5 ranks but 4 slots"]);
    let run = strict(&["-n", "4", "--hostfile", file.to_str().unwrap(), "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Runs udrun from bash after `setup` (ulimit, say).
fn udrun_after(setup: &str, args: &[&str]) -> Run {
    let cmd = udrun(&[]);
    let mut shell = Command::new("bash");
    shell
        .arg("-c")
        .arg(format!("{setup}\nexec \"$@\""))
        .arg("bash")
        .arg(cmd.get_program())
        .args(args)
        .envs(
            cmd.get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in cmd.get_envs() {
        if value.is_none() {
            shell.env_remove(key);
        }
    }
    run_command(shell)
}

#[test]
fn a_huge_n_fails_before_forking_and_names_the_limit() {
    let run = launch(&["-n", "4000000000", "sh", "-c", "echo ran"]);
    assert_fails(&run, 1, &["-n 4000000000 needs about", "limit of"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
    let run = udrun_after("ulimit -n 100", &["-n", "20", "sh", "-c", "echo ran"]);
    assert_fails(&run, 1, &["file descriptors", "RLIMIT_NOFILE"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
    // A soft limit below the hard one is raised.
    let run = udrun_after(
        "ulimit -Sn 100; ulimit -Hn 4096",
        &["-n", "20", "sh", "-c", "ulimit -n"],
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stdout.lines().all(|l| l == "4096"), "{run:#?}");
}

#[test]
fn resource_failures_while_starting_name_the_rank() {
    // udrun inherits fds 3..89 of 100: the ranks run out of descriptors.
    let run = udrun_after(
        "ulimit -n 100; for fd in $(seq 3 89); do eval \"exec $fd</dev/null\"; done",
        &["-n", "10", "sleep", "1"],
    );
    assert_eq!(run.code, Some(1), "{run:#?}");
    let reports = run.reports();
    assert_eq!(reports.len(), 1, "{run:#?}");
    assert!(reports[0].contains("rank "), "{run:#?}");
    assert!(reports[0].contains("Too many open files"), "{run:#?}");
}

#[test]
fn stdin_goes_to_rank_0_only() {
    let cmd = udrun(&[
        "-n",
        "2",
        "sh",
        "-c",
        r#"while read -r l; do echo "$PMI_RANK:$l"; done; echo "$PMI_RANK:eof""#,
    ]);
    let run = run_with_stdin(cmd, b"a\nb\n");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let stdout = &run.stdout;
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["0:a", "0:b", "0:eof", "1:eof"], "{stdout}");
}

#[test]
fn x_with_an_unset_variable_is_an_error() {
    let mut cmd = udrun(&["-n", "1", "-x", "UDRUN_TEST_UNSET", "sh", "-c", "echo ran"]);
    cmd.env_remove("UDRUN_TEST_UNSET");
    let run = run_command(cmd);
    assert_fails(&run, 2, &["-x UDRUN_TEST_UNSET", "is not set"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
}

#[test]
fn a_launcher_failure_names_the_launcher_used() {
    let dir = scratch("launcher");
    let quiet = script_file(&dir, "quiet-launcher", "#!/bin/sh\nexit 255\n");
    let quiet = quiet.to_str().unwrap();
    let run = launch(&[
        "-n",
        "1",
        "--host",
        "node",
        "--launcher-exec",
        quiet,
        "true",
    ]);
    assert_fails(
        &run,
        1,
        &[&format!(
            "cannot reach host node: {quiet} exited with code 255"
        )],
    );
    assert!(!run.stderr.contains("ssh exited"), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_error_every_rank_prints_is_printed_once() {
    // After the barrier (so at about the same time), every rank prints the
    // same error and, as another message (after a pause: udrun merges
    // whole messages, what a rank writes in one burst), one of its own,
    // then fails.
    let script = pmi_rank(
        "",
        r#"echo "error: bad input" >&2; sleep 0.3; echo "rank $rank only" >&2; sleep 0.5; exit 3"#,
    );
    let run = run_script(&["-n", "4"], &script);
    assert_eq!(run.code, Some(3), "{run:#?}");
    let errors: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("error: bad input"))
        .collect();
    assert_eq!(errors, ["[ranks 0-3] error: bad input"], "{run:#?}");
    for rank in 0..4 {
        let line = format!("rank {rank} only");
        assert!(run.stderr.lines().any(|l| l == line), "{line}: {run:#?}");
    }
    assert_eq!(run.reports().len(), 1, "{run:#?}");
    // Under --tag-output, every rank's line is shown.
    let run = run_script(&["-n", "2", "--tag-output"], &script);
    for rank in 0..2 {
        let line = format!("[{rank}] error: bad input");
        assert!(run.stderr.lines().any(|l| l == line), "{line}: {run:#?}");
    }
}
