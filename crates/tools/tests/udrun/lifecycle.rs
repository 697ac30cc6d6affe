//! How a job ends: the status udrun ends with when a rank exits non-zero,
//! dies of a signal, calls PMI abort, leaves PMI without finalize or never
//! joins it, or cannot be started; what ends a job from outside (SIGINT,
//! `--timeout`, a closed stdout, a killed udrun); and that nothing a rank
//! started outlives the job.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rustix::process::{Signal, kill_process};

use crate::harness::{
    NOT_WAITED_OUT, Udrun, assert_all_saw, assert_fails, collect, eventually, gone, launch,
    pmi_rank, run_script, udrun, zombie,
};

/// PIDs of the processes whose environment holds `UDRUN_JOB_KEY=<key>`.
fn processes_with_key(key: &str) -> Vec<u32> {
    let needle = format!("UDRUN_JOB_KEY={key}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

#[test]
fn ranks_exchange_values_through_pmi() {
    let script = pmi_rank("", "");
    for n in [1, 2, 4, 16] {
        let run = run_script(&["-n", &n.to_string()], &script);
        assert_eq!(run.code, Some(0), "{run:#?}");
        assert_all_saw(&run, n);
        assert!(run.stderr.is_empty(), "{run:#?}");
    }
}

#[test]
fn a_non_zero_exit_ends_the_job_with_that_code() {
    let script = pmi_rank(r#"[ "$rank" = 2 ] && exit 3"#, "");
    let run = run_script(&["-n", "4"], &script);
    assert_fails(
        &run,
        3,
        &["rank 2 (pid ", "exited with code 3", "killing the job"],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
}

#[test]
fn a_death_by_signal_ends_the_job_with_128_plus_the_signal() {
    let segv = pmi_rank(r#"[ "$rank" = 1 ] && { ulimit -c 0; kill -SEGV $$; }"#, "");
    let run = run_script(&["-n", "3"], &segv);
    assert_fails(
        &run,
        139,
        &["rank 1 (pid ", "killed by signal 11 (SIGSEGV)"],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");

    let kill = pmi_rank(r#"[ "$rank" = 0 ] && kill -KILL $$"#, "");
    let run = run_script(&["-n", "2"], &kill);
    assert_fails(&run, 137, &["rank 0 (pid ", "killed by signal 9 (SIGKILL)"]);
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
}

#[test]
fn pmi_abort_ends_the_job_with_its_code() {
    let script = pmi_rank(
        r#"[ "$rank" = 1 ] && { echo "cmd=abort exitcode=7 message=it_broke" >&$fd; sleep 1000; }"#,
        "",
    );
    let run = run_script(&["-n", "3"], &script);
    assert_fails(
        &run,
        7,
        &["rank 1 (pid ", "called abort with code 7: it_broke"],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
}

#[test]
fn leaving_pmi_without_finalize_fails_the_job() {
    // Exit 0 after using PMI but without finalize: hydra's rule.
    let script = pmi_rank(r#"[ "$rank" = 1 ] && exit 0"#, "");
    let run = run_script(&["-n", "2"], &script);
    assert_fails(&run, 1, &["rank 1 (pid ", "without calling PMI finalize"]);
    // Closing the connection and living on.
    let script = pmi_rank(r#"[ "$rank" = 0 ] && { exec {fd}>&-; sleep 1000; }"#, "");
    let run = run_script(&["-n", "2"], &script);
    assert_fails(&run, 1, &["rank 0 (pid ", "closed its PMI connection"]);
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    // A program that never uses PMI is judged by its exit status only.
    let run = launch(&["-n", "2", "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stderr.is_empty(), "{run:#?}");
}

#[test]
fn sigint_kills_a_hung_job_and_leaves_nothing_behind() {
    const N: usize = 3;
    // After init, each rank prints its PID, its background child's PID and
    // the job key, then waits forever.
    let script = pmi_rank(
        r#"sleep 1000 & echo "pids $$ $! key $UDRUN_JOB_KEY"; wait"#,
        "",
    );
    let mut udrun = Udrun::start(udrun(&["-n", &N.to_string(), "bash", "-c", &script]));
    let (tx, lines) = mpsc::channel();
    let stdout = BufReader::new(udrun.child.stdout.take().unwrap());
    thread::spawn(move || {
        for line in stdout.lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let mut pids = Vec::new();
    let mut keys = HashSet::new();
    for _ in 0..N {
        let line = lines
            .recv_timeout(Duration::from_secs(5))
            .expect("rank output");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((words[0], words[3]), ("pids", "key"), "{line}");
        pids.extend([words[1].parse::<u32>().unwrap(), words[2].parse().unwrap()]);
        keys.insert(words[4].to_owned());
    }
    assert_eq!(keys.len(), 1);
    let key = keys.into_iter().next().unwrap();
    // (A process in the middle of an exec may briefly show no environment.)
    eventually("every rank and child carries the key", || {
        processes_with_key(&key).len() == 2 * N
    });

    kill_process(udrun.pid(), Signal::INT).unwrap();
    let (code, elapsed) = udrun.wait();
    let stderr = stderr.join().unwrap();
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(stderr, "udrun: interrupted by SIGINT; job killed\n");
    assert!(elapsed < NOT_WAITED_OUT, "{elapsed:?}");
    // Ranks and their children are gone and reaped (udrun is a subreaper).
    eventually(&format!("processes left: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid))
    });
    assert_eq!(processes_with_key(&key), Vec::<u32>::new());
}

#[test]
fn a_program_that_cannot_start_gets_127() {
    let run = launch(&["-n", "2", "/no/such/program"]);
    assert_eq!(run.code, Some(127), "{run:#?}");
    assert_eq!(
        run.stderr,
        "udrun: cannot start /no/such/program: No such file or directory\n"
    );
    // Found but not executable: 126, as in a shell.
    let run = launch(&["-n", "1", "/"]);
    assert_eq!(run.code, Some(126), "{run:#?}");
    assert_eq!(run.stderr, "udrun: cannot start /: Permission denied\n");
}

#[test]
fn what_a_rank_leaves_behind_is_killed_and_reaped() {
    let run = launch(&["-n", "2", "sh", "-c", "sleep 1000 & echo $!"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    let pids: Vec<u32> = run.stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{run:#?}");
    eventually(&format!("left behind: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid))
    });
}

#[test]
fn a_closed_stdout_stops_the_ranks_as_in_a_pipeline() {
    // `udrun -n 1 yes | head -c 10`: the rank gets SIGPIPE, and the job
    // ends quietly with the status a pipeline's writer gets.
    let mut udrun = Udrun::start(udrun(&["-n", "1", "yes"]));
    let mut stdout = udrun.child.stdout.take().unwrap();
    let mut head = [0; 10];
    stdout.read_exact(&mut head).unwrap();
    drop(stdout);
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let (code, elapsed) = udrun.wait();
    let stderr = stderr.join().unwrap();
    assert_eq!(code, Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(elapsed < NOT_WAITED_OUT, "{elapsed:?}");
}

#[test]
fn a_rank_that_never_joins_pmi_ends_the_job() {
    // Rank 1 exits 0 without touching PMI while rank 0 waits in the first
    // barrier: once rank 0 has called init, that ends the job.
    for exit_first in [
        r#"[ "$PMI_RANK" = 1 ] && exit 0; [ "$PMI_RANK" = 0 ] && sleep 0.5"#,
        r#"[ "$PMI_RANK" = 1 ] && { sleep 0.5; exit 0; }"#,
    ] {
        let script = format!("{exit_first}\n{}", pmi_rank("", ""));
        let run = run_script(&["-n", "2"], &script);
        assert_fails(
            &run,
            1,
            &[
                "rank 1 (pid ",
                "exited without calling PMI init, which rank 0 did",
            ],
        );
        assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    }
}

#[test]
fn timeout_ends_a_long_job_with_124() {
    let mut udrun = Udrun::start(udrun(&[
        "-n",
        "2",
        "--timeout",
        "1",
        "sh",
        "-c",
        "echo $$; exec sleep 1000",
    ]));
    let stdout = collect(udrun.child.stdout.take().unwrap());
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let (code, elapsed) = udrun.wait();
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert_eq!(code, Some(124), "{stderr}");
    assert_eq!(
        stderr,
        "udrun: the job ran longer than --timeout 1 s; killing the job\n"
    );
    assert!(elapsed < NOT_WAITED_OUT, "{elapsed:?}");
    let pids: Vec<u32> = stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{stdout}");
    eventually(&format!("ranks left: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid))
    });
    // A job that ends in time is not touched.
    let run = launch(&["-n", "2", "--timeout", "30", "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stderr.is_empty(), "{run:#?}");
    let run = launch(&["-n", "2", "--timeout", "0", "true"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
}

#[test]
fn local_ranks_die_with_a_killed_udrun() {
    let mut udrun = Udrun::start(udrun(&["-n", "2", "sh", "-c", "echo $$; exec sleep 1000"]));
    let mut stdout = BufReader::new(udrun.child.stdout.take().unwrap());
    let mut pids = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        pids.push(line.trim().parse::<u32>().unwrap());
    }
    kill_process(udrun.pid(), Signal::KILL).unwrap();
    udrun.wait();
    // Killed at once; whoever adopted them reaps them.
    eventually(&format!("ranks outlived udrun: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid) || zombie(pid))
    });
}
