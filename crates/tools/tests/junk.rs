//! Junk datagrams at a live job's ports, from the moment they open (issue
//! 17): a 2-rank job under `udrun` runs while a thread of this test sends
//! random bytes, 0 to 9000 long, and trains of short datagrams sent with UDP
//! GSO, about 5000 datagrams a second, at the UDP sockets the job's ranks
//! hold, found in `/proc`. The junk covers `init()`, the address exchange,
//! the first barrier, and then the latency and bandwidth phases of
//! `udbench` (1 B to 4 KiB) or the checked all-to-all of `udstress`, with
//! addresses fetched in bulk or lazily, and datagrams of 64 KiB or of
//! 1500 B (read with UDP GRO, so junk trains arrive as trains).
//!
//! No assertion depends on how fast the job runs (in a release build a
//! udstress job took 0.1 s, before the junk had found a port): rank 1
//! starts only once the test opens a gate, so rank 0 waits for it in
//! `init()` with its sockets open, and gets its junk then; rank 1 gets junk
//! from when its sockets open to the end, however much that is. Every run
//! must finish, with every figure printed or every message checked; every
//! junk datagram sent to rank 0 must show up in its dump as a counted drop
//! (a full socket buffer, or read and dropped as garbage); and neither rank
//! may count more garbage than it was sent. `JUNK_RUNS` sets the number of
//! runs (default 20, half of each program).

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
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

/// The rank a process of the job runs as: its `PMI_RANK`, which udrun
/// gives every rank (udrun itself has none).
fn rank_of(pid: u32) -> Option<u32> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let value = environ
        .split(|b| *b == 0)
        .find_map(|var| var.strip_prefix(b"PMI_RANK="))?;
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Where to send to reach each IPv4 UDP socket that processes `pids`
/// hold: the address the socket is bound to (loopback for a wildcard).
fn udp_sockets(pids: &[u32]) -> Vec<SocketAddrV4> {
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
            if !inodes.contains(*fields.get(9)?) {
                return None;
            }
            // "0100007F:A2B1": the address as the kernel holds it (network
            // order, printed as a native integer), then the port.
            let (ip, port) = fields.get(1)?.split_once(':')?;
            let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes());
            let ip = if ip.is_unspecified() {
                Ipv4Addr::LOCALHOST
            } else {
                ip
            };
            Some(SocketAddrV4::new(ip, u16::from_str_radix(port, 16).ok()?))
        })
        .collect()
}

/// The UDP sockets of rank `rank` of the job under udrun `udrun`.
fn sockets_of_rank(udrun: u32, rank: u32) -> Vec<SocketAddrV4> {
    let ranks: Vec<u32> = family(udrun)
        .into_iter()
        .filter(|pid| rank_of(*pid) == Some(rank))
        .collect();
    udp_sockets(&ranks)
}

/// Junk datagrams, from one socket.
struct Junk {
    socket: UdpSocket,
    gso: UdpSocketState,
    rng: fastrand::Rng,
    buf: Vec<u8>,
    /// Datagrams sent (those the kernel took), and when the first was.
    sent: u64,
    started: Option<Instant>,
}

impl Junk {
    fn new(seed: u64) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gso = UdpSocketState::new(UdpSockRef::from(&socket)).unwrap();
        Self {
            socket,
            gso,
            rng: fastrand::Rng::with_seed(seed),
            buf: vec![0u8; 32 << 10],
            sent: 0,
            started: None,
        }
    }

    /// Sends one junk datagram to each of `to` (random bytes of 0 to
    /// 9000 B, or one time in four a train of 2 to 20 datagrams of 1 to
    /// 1400 B sent with UDP GSO, which a receiver with UDP GRO may read as
    /// one train), then waits as long as keeps the pace at about 5000
    /// datagrams a second; returns how many it sent.
    fn round(&mut self, to: &[SocketAddrV4]) -> u64 {
        let started = *self.started.get_or_insert_with(Instant::now);
        let before = self.sent;
        for &to in to {
            if self.rng.u8(0..4) == 0 {
                let segment = self.rng.usize(1..=1400);
                let len = segment * self.rng.usize(1..20) + self.rng.usize(1..=segment);
                self.rng.fill(&mut self.buf[..len]);
                let train = Transmit {
                    destination: to.into(),
                    ecn: None,
                    contents: &self.buf[..len],
                    segment_size: Some(segment),
                    src_ip: None,
                };
                if self
                    .gso
                    .try_send(UdpSockRef::from(&self.socket), &train)
                    .is_ok()
                {
                    self.sent += len.div_ceil(segment) as u64;
                }
            } else {
                let len = self.rng.usize(0..=9000);
                self.rng.fill(&mut self.buf[..len]);
                if self.socket.send_to(&self.buf[..len], to).is_ok() {
                    self.sent += 1;
                }
            }
        }
        let due = Duration::from_micros(200 * self.sent);
        if let Some(ahead) = due.checked_sub(started.elapsed()) {
            thread::sleep(ahead);
        }
        self.sent - before
    }
}

/// How much junk rank 0 gets while it waits for rank 1 in `init()`.
const GATED_JUNK: u64 = 300;

/// Junk datagrams sent, by the rank they were sent to.
#[derive(Default)]
struct Sent {
    /// To rank 0, all while it waited in `init()`.
    rank_0: AtomicU64,
    /// To rank 1, from when its sockets opened to the end of the job.
    rank_1: AtomicU64,
}

/// Sends junk at the job under udrun `udrun`, in which rank 1 waits for
/// the file `gate` before it starts:
///
/// 1. rank 0, once its sockets opened, waits for rank 1 in `init()`'s
///    PMI barrier: it gets [`GATED_JUNK`] datagrams, and then the gate
///    opens. Each of them reaches a socket of a live rank, whose later
///    traffic from rank 1 arrives behind it, so each must be counted.
/// 2. rank 1 gets junk from when its sockets open (they are looked for
///    every millisecond until found, then every 50 ms) until `stop`: how
///    much reaches it before the job ends depends on how fast the job
///    runs, so nothing about it is asserted but that the ranks did not
///    count more garbage than was sent.
///
/// Nothing waits for time to pass: the job waits for the junk.
fn junk(udrun: u32, gate: PathBuf, stop: Arc<AtomicBool>, sent: Arc<Sent>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut junk = Junk::new(u64::from(udrun));
        let mut sockets = Vec::new();
        while sent.rank_0.load(Ordering::Relaxed) < GATED_JUNK {
            if stop.load(Ordering::Relaxed) {
                // The job ended (or failed) before rank 0 opened a socket.
                return;
            }
            if sockets.is_empty() {
                // Once found, they stay: rank 0 cannot go on without rank 1.
                sockets = sockets_of_rank(udrun, 0);
            }
            if sockets.is_empty() {
                thread::sleep(Duration::from_millis(1));
                continue;
            }
            let n = junk.round(&sockets);
            sent.rank_0.fetch_add(n, Ordering::Relaxed);
        }
        std::fs::write(&gate, b"").unwrap();
        let mut junk = Junk::new(u64::from(udrun) + 1);
        let (mut sockets, mut rescan) = (Vec::new(), Instant::now());
        while !stop.load(Ordering::Relaxed) {
            if rescan <= Instant::now() {
                sockets = sockets_of_rank(udrun, 1);
                let every = if sockets.is_empty() { 1 } else { 50 };
                rescan = Instant::now() + Duration::from_millis(every);
            }
            if sockets.is_empty() {
                thread::sleep(Duration::from_millis(1));
                continue;
            }
            let n = junk.round(&sockets);
            sent.rank_1.fetch_add(n, Ordering::Relaxed);
        }
    })
}

/// Runs the program for rank 1 only once the file `$JUNK_GATE` exists, and
/// for rank 0 at once (`sh -c GATE program args...`).
const GATE: &str = r#"if [ "$PMI_RANK" = 1 ]; then
    while [ ! -e "$JUNK_GATE" ]; do sleep 0.005; done
fi
exec "$0" "$@""#;

/// `line` without the `[rank] ` udrun's `--tag-output` puts in front, and
/// that rank.
fn untag(line: &str) -> Option<(u32, &str)> {
    let (rank, rest) = line.strip_prefix('[')?.split_once("] ")?;
    Some((rank.parse().ok()?, rest))
}

/// The sum, over rank `rank`'s dump lines (tagged by udrun's
/// `--tag-output`) that start with `line` (after spaces), of the numbers
/// that follow each of `names` on them.
fn dump_sum(dump: &str, rank: u32, line: &str, names: &[&str]) -> u64 {
    dump.lines()
        .filter_map(untag)
        .filter(|(r, l)| *r == rank && l.trim_start().starts_with(line))
        .flat_map(|(_, l)| {
            names.iter().filter_map(move |name| {
                let at = l.find(&format!(" {name} "))? + name.len() + 2;
                l[at..].split_whitespace().next()?.parse::<u64>().ok()
            })
        })
        .sum()
}

/// Where rank `rank`'s junk ended up, from its dump: read and dropped as
/// garbage, by the fabric (a bad key, a malformed UD header, too long) or
/// the BTL (a malformed header, another job's key), and all that was
/// dropped for want of room (a full socket buffer, no receive posted).
/// Real datagrams may meet a full socket buffer too, or find no receive
/// posted, but are never garbage.
fn junk_counted(dump: &str, rank: u32) -> (u64, u64) {
    let garbage = dump_sum(dump, rank, "fabric", &["bad qkey", "malformed", "too long"])
        + dump_sum(dump, rank, "receives", &["malformed", "bad job key"]);
    let refused = dump_sum(dump, rank, "fabric", &["socket full", "no buffer"]);
    (garbage, refused)
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
        let program: Vec<&str> = if is_udbench {
            vec![udbench, "--max-size", "4k", "--iterations", "100"]
        } else {
            vec![udstress, "alltoall", "--messages", "3000"]
        };
        let mut args = vec!["-n", "2", "--tag-output", "sh", "-c", GATE];
        args.extend(&program);
        // Every other run of each program fetches addresses lazily, so that
        // junk also meets connections made on a peer's first datagram, and
        // uses 1500-byte datagrams, so that the ranks read with UDP GRO and
        // junk trains arrive as trains.
        let (modex, mtu) = if run % 4 < 2 {
            ("bulk", None)
        } else {
            ("lazy", Some("1500"))
        };
        let gate =
            std::env::temp_dir().join(format!("udbtl-junk-gate-{}-{run}", std::process::id()));
        let _ = std::fs::remove_file(&gate);
        let gate_var = gate.display().to_string();
        let mut env = vec![
            ("UDBTL_DUMP", "1"),
            ("UDBTL_MODEX", modex),
            ("JUNK_GATE", gate_var.as_str()),
        ];
        env.extend(mtu.map(|mtu| ("UDBTL_UDP_MTU", mtu)));
        let child = common::start(&args, &env);
        let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::<Sent>::default());
        let sender = junk(child.id(), gate.clone(), stop.clone(), sent.clone());
        let finished = common::finish(child, Duration::from_secs(60));
        stop.store(true, Ordering::Relaxed);
        sender.join().unwrap();
        let _ = std::fs::remove_file(&gate);
        let (stdout, stderr) = common::text(&finished.output);
        let name = program[0].rsplit('/').next().unwrap_or_default();
        assert!(
            !finished.timed_out && finished.output.status.success(),
            "run {run} ({name}) failed or hung:\n{stdout}\n{stderr}"
        );
        if is_udbench {
            // Every latency and bandwidth row, 1 B to 4 KiB: 13 each.
            let rows = stdout
                .lines()
                .filter_map(untag)
                .filter(|(_, l)| {
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
        let (to_0, to_1) = (
            sent.rank_0.load(Ordering::Relaxed),
            sent.rank_1.load(Ordering::Relaxed),
        );
        let (garbage_0, refused_0) = junk_counted(&stderr, 0);
        let (garbage_1, refused_1) = junk_counted(&stderr, 1);
        eprintln!(
            "run {run} ({name}, {modex} modex, udp_mtu {}, {:.1} s): rank 0 got {to_0} junk \
             datagrams in init() and counted {} (garbage {garbage_0}, socket full or no \
             buffer {refused_0}); rank 1 got {to_1} and counted {} (garbage {garbage_1}, \
             socket full or no buffer {refused_1})",
            mtu.unwrap_or("unset"),
            finished.elapsed.as_secs_f64(),
            garbage_0 + refused_0,
            garbage_1 + refused_1,
        );
        if std::env::var_os("JUNK_VERBOSE").is_some() {
            eprintln!("{stderr}");
        }
        // The job waited for this junk: it does not depend on speed.
        assert!(to_0 >= GATED_JUNK, "run {run}: the gate opened early");
        assert!(
            garbage_0 + refused_0 >= to_0,
            "run {run}: rank 0 got {to_0} junk datagrams, counted only {}\n{stderr}",
            garbage_0 + refused_0
        );
        assert!(
            garbage_0 <= to_0 && garbage_1 <= to_1,
            "run {run}: more garbage counted than junk sent (rank 0: {garbage_0} of \
             {to_0}, rank 1: {garbage_1} of {to_1})\n{stderr}"
        );
    }
}
