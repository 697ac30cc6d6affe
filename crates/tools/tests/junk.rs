//! Junk datagrams at a live job's ports, from the moment they open (issue
//! 17): a 2-rank job under `udrun` runs while a thread of this test sends
//! random bytes, 0 to 9000 long, and trains of short datagrams sent with UDP
//! GSO, about 5000 datagrams a second, at every UDP port the job's
//! processes hold. The ports are rediscovered every 50 ms from
//! `/proc`, so the junk covers `init()`, the address exchange, the first
//! barrier, and then the latency and bandwidth phases of `udbench` (1 B to
//! 4 KiB) or the checked all-to-all of `udstress`, with addresses fetched
//! in bulk or lazily, and datagrams of 64 KiB or of 1500 B (read with UDP
//! GRO, so junk trains arrive as trains).
//!
//! Every run must finish, with every figure printed or every message
//! checked, and the junk must show up in the ranks' dumps as counted drops:
//! under udbench, whose junk stops before the job ends, every junk datagram
//! sent, whether the kernel dropped it at a full socket buffer or the ranks
//! read it and dropped it as garbage. `JUNK_RUNS` sets the number of runs
//! (default 20, half of each program).

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use quinn_udp::{Transmit, UdpSockRef, UdpSocketState};

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

/// Every process below `pid`, `pid` included.
fn family(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        all.extend(common::children(all[i]));
        i += 1;
    }
    all
}

/// The IPv4 UDP ports bound by sockets of the processes `pids`.
fn udp_ports(pids: &[u32]) -> Vec<u16> {
    let mut inodes = HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                let link = link.to_string_lossy().into_owned();
                if let Some(inode) = link
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
    }
    let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields.get(1)?.rsplit(':').next()?;
            inodes
                .contains(*fields.get(9)?)
                .then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect()
}

/// Sends junk at the ports of `pid`'s processes until `stop`, counting the
/// datagrams in `sent`: random bytes of 0 to 9000 B, and one time in four a
/// train of 2 to 20 datagrams of 1 to 1400 B sent with UDP GSO, which a
/// receiver with UDP GRO may read as one train.
fn junk(pid: u32, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gso = UdpSocketState::new(UdpSockRef::from(&socket)).unwrap();
        let mut rng = fastrand::Rng::with_seed(u64::from(pid));
        let mut buf = vec![0u8; 32 << 10];
        let mut ports = Vec::new();
        let mut rescan = Instant::now();
        let start = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if rescan <= Instant::now() {
                ports = udp_ports(&family(pid));
                rescan = Instant::now() + Duration::from_millis(50);
            }
            if ports.is_empty() {
                thread::sleep(Duration::from_millis(1));
                continue;
            }
            for &port in &ports {
                let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
                if rng.u8(0..4) == 0 {
                    let segment = rng.usize(1..=1400);
                    let len = segment * rng.usize(1..20) + rng.usize(1..=segment);
                    rng.fill(&mut buf[..len]);
                    let train = Transmit {
                        destination: to.into(),
                        ecn: None,
                        contents: &buf[..len],
                        segment_size: Some(segment),
                        src_ip: None,
                    };
                    if gso.try_send(UdpSockRef::from(&socket), &train).is_ok() {
                        sent.fetch_add(len.div_ceil(segment) as u64, Ordering::Relaxed);
                    }
                } else {
                    let len = rng.usize(0..=9000);
                    rng.fill(&mut buf[..len]);
                    if socket.send_to(&buf[..len], to).is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // About 5000 datagrams a second in all.
            let due = Duration::from_micros(200 * sent.load(Ordering::Relaxed));
            if let Some(ahead) = due.checked_sub(start.elapsed()) {
                thread::sleep(ahead);
            }
        }
    })
}

/// Collects `child`'s standard output on a thread, raising `stop` (if
/// any) once udbench's bandwidth phase has printed its 1 KiB row: the junk
/// then covers the start of that phase, and the 2 and 4 KiB rows that
/// remain give the ranks time to read what is left of it.
fn read_stdout(child: &mut Child, stop: Option<Arc<AtomicBool>>) -> thread::JoinHandle<String> {
    let stdout = child.stdout.take().unwrap();
    thread::spawn(move || {
        let mut all = String::new();
        let mut bandwidth = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            bandwidth |= line.starts_with("# udbench bw");
            if bandwidth && line.starts_with("1024 ") {
                if let Some(stop) = &stop {
                    stop.store(true, Ordering::Relaxed);
                }
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    })
}

/// The sum over every dump line starting with `line` (after spaces) of the
/// numbers that follow each of `names` on it. A line udrun merged from
/// several ranks ("[ranks 0-1] ...", when they printed the same) counts
/// once per rank.
fn dump_sum(dump: &str, line: &str, names: &[&str]) -> u64 {
    dump.lines()
        .map(|l| match l.strip_prefix("[ranks 0-1]") {
            Some(rest) => (2, rest.trim_start()),
            None => (1, l.trim_start()),
        })
        .filter(|(_, l)| l.starts_with(line))
        .flat_map(|(ranks, l)| {
            names.iter().filter_map(move |name| {
                let at = l.find(&format!(" {name} "))? + name.len() + 2;
                let n = l[at..].split_whitespace().next()?.parse::<u64>().ok()?;
                Some(ranks * n)
            })
        })
        .sum()
}

#[test]
fn a_job_finishes_with_everything_checked_while_junk_hits_its_ports_from_the_start() {
    let runs: u32 = std::env::var("JUNK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let udbench = env!("CARGO_BIN_EXE_udbench");
    let udstress = env!("CARGO_BIN_EXE_udstress");
    for run in 0..runs {
        let is_udbench = run % 2 == 0;
        let args: Vec<&str> = if is_udbench {
            vec![
                "-n",
                "2",
                udbench,
                "--max-size",
                "4k",
                "--iterations",
                "100",
            ]
        } else {
            vec!["-n", "2", udstress, "alltoall", "--messages", "3000"]
        };
        // Every other run of each program fetches addresses lazily, so that
        // junk also meets connections made on a peer's first datagram, and
        // uses 1500-byte datagrams, so that the ranks read with UDP GRO and
        // junk trains arrive as trains.
        let (modex, mtu) = if run % 4 < 2 {
            ("bulk", None)
        } else {
            ("lazy", Some("1500"))
        };
        let mut env = vec![("UDBTL_DUMP", "1"), ("UDBTL_MODEX", modex)];
        env.extend(mtu.map(|mtu| ("UDBTL_UDP_MTU", mtu)));
        let mut child = common::start(&args, &env);
        let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let sender = junk(child.id(), stop.clone(), Arc::clone(&sent));
        // udbench's junk stops near the end of the bandwidth phase, so that
        // the ranks read every junk datagram before their dumps: then each
        // one must be counted. udstress's lasts to the end.
        let reader = read_stdout(&mut child, is_udbench.then(|| stop.clone()));
        let finished = common::finish(child, Duration::from_secs(60));
        stop.store(true, Ordering::Relaxed);
        sender.join().unwrap();
        let stdout = reader.join().unwrap();
        let (_, stderr) = common::text(&finished.output);
        assert!(
            !finished.timed_out && finished.output.status.success(),
            "run {run} ({}) failed or hung:\n{stdout}\n{stderr}",
            args[2]
        );
        if is_udbench {
            // Every latency and bandwidth row, 1 B to 4 KiB: 13 each.
            let rows = stdout
                .lines()
                .filter(|l| {
                    l.split_whitespace()
                        .next()
                        .is_some_and(|w| w.parse::<u64>().is_ok())
                })
                .count();
            assert_eq!(rows, 26, "run {run}: missing rows\n{stdout}");
        } else {
            assert!(
                stdout.matches("udstress alltoall").count() >= 2,
                "run {run}: both ranks report their checks\n{stdout}\n{stderr}"
            );
        }
        // Where junk ends up: refused by a full socket buffer, or read and
        // dropped as garbage, by the fabric (a bad key, a malformed UD
        // header, too long) or the BTL (a malformed header, another job's
        // key). Real datagrams may meet a full socket buffer too, or find
        // no receive posted, but are never garbage.
        let garbage = dump_sum(&stderr, "fabric", &["bad qkey", "malformed", "too long"])
            + dump_sum(&stderr, "receives", &["malformed", "bad job key"]);
        let refused = dump_sum(&stderr, "fabric", &["socket full", "no buffer"]);
        let counted = garbage + refused;
        let delivered = dump_sum(&stderr, "receives", &["delivered"]);
        let sent = sent.load(Ordering::Relaxed);
        eprintln!(
            "run {run} ({}, {modex} modex, udp_mtu {}, {:.1} s): junk sent {sent}; counted \
             {counted} (garbage {garbage}, socket full or no buffer {refused}); messages \
             delivered {delivered}",
            args[2].rsplit('/').next().unwrap_or_default(),
            mtu.unwrap_or("unset"),
            finished.elapsed.as_secs_f64()
        );
        if std::env::var_os("JUNK_VERBOSE").is_some() {
            eprintln!("{stderr}");
        }
        assert!(sent > 0, "run {run}: the junk found no port");
        assert!(
            counted > 0,
            "run {run}: junk arrived but nothing was counted\n{stderr}"
        );
        assert!(
            garbage <= sent,
            "run {run}: more garbage counted ({garbage}) than junk sent ({sent})\n{stderr}"
        );
        if is_udbench {
            assert!(
                counted >= sent,
                "run {run}: junk sent {sent}, only {counted} counted\n{stderr}"
            );
        }
    }
}
