//! 8-byte ping-pong between two processes through the BTL over UDP, with
//! reliability on and off, measured side by side in one run.
//!
//! ```text
//! taskset -c 0 cargo run --release -p udbtl-btl --example btl_pingpong
//! ```
//!
//! Each process builds two components, one reliable and one not, and the
//! parent (pinned where `taskset -c 0` put it) spawns its peer pinned to the
//! second CPU. Both busy-poll. Rounds alternate between the two; the report
//! gives the median over rounds of each round's median one-way latency (half
//! the round trip), and their ratio.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;
use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;

const PING: Tag = Tag(Tag::PML.0 + 1);
const SIZE: usize = 8;

struct Side {
    btl: Component<UdpProvider>,
    peer: Option<EndpointId>,
    arrived: Arc<AtomicUsize>,
}

impl Side {
    fn new(reliable: bool) -> Self {
        let config = BtlConfig {
            reliable: Some(reliable),
            rd_num: Some(256),
            ..BtlConfig::default()
        };
        let params = Params::load(&config).expect("parameters");
        let mut btl = Component::init(UdpProvider::new(udp_config(&params)), params).expect("btl");
        let arrived = Arc::new(AtomicUsize::new(0));
        let counter = arrived.clone();
        btl.modules_mut()[0].register(
            PING,
            Box::new(move |_: &RecvEvent<'_>| {
                counter.fetch_add(1, Ordering::Relaxed);
            }),
        );
        Self {
            btl,
            peer: None,
            arrived,
        }
    }

    fn connect(&mut self, blob: &[u8]) {
        self.peer = self.btl.add_procs(&[Some(blob)]).expect("add_procs")[0].endpoints[0];
    }

    fn send(&mut self) {
        let peer = self.peer.expect("connected");
        let module = &mut self.btl.modules_mut()[0];
        let des = loop {
            if let Some(des) = module.alloc(NO_ORDER, SIZE, DesFlags::BTL_OWNERSHIP) {
                break des;
            }
            module.progress();
        };
        module.segment_mut(des).expect("segment").fill(7);
        module.send(peer, des, PING).expect("send");
    }

    /// Busy-polls until the `n`th datagram since start arrived.
    fn wait(&mut self, n: usize) {
        while self.arrived.load(Ordering::Relaxed) < n {
            self.btl.progress();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn peer() {
    let mut sides = [Side::new(true), Side::new(false)];
    println!(
        "MODEX {} {}",
        hex(&sides[0].btl.modex()),
        hex(&sides[1].btl.modex())
    );
    std::io::stdout().flush().expect("flush");
    for line in std::io::stdin().lines() {
        let line = line.expect("stdin");
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["CONNECT", r, u] => {
                sides[0].connect(&unhex(r));
                sides[1].connect(&unhex(u));
            }
            ["RUN", which, n] => {
                let side = &mut sides[which.parse::<usize>().expect("side")];
                let start = side.arrived.load(Ordering::Relaxed);
                for i in 1..=n.parse::<usize>().expect("count") {
                    side.wait(start + i);
                    side.send();
                }
            }
            ["QUIT"] => {
                for side in &mut sides {
                    for module in side.btl.modules_mut() {
                        module.quiesce(std::time::Duration::from_secs(1));
                    }
                }
                return;
            }
            _ => panic!("unexpected {line:?}"),
        }
        println!("DONE");
        std::io::stdout().flush().expect("flush");
    }
}

fn main() {
    if std::env::args().any(|a| a == "--peer") {
        return peer();
    }
    let rounds = 7;
    let (iters, warmup) = (20_000usize, 2_000usize);
    let exe = std::env::current_exe().expect("exe");
    let pinned = Command::new("taskset").arg("-V").output().is_ok();
    let mut command = if pinned {
        let mut c = Command::new("taskset");
        c.args(["-c", "1"]).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let mut child = command
        .arg("--peer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut to_peer = child.stdin.take().expect("stdin");
    let mut from_peer = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = from_peer.next().expect("modex").expect("read");
    let words: Vec<&str> = line.split_whitespace().collect();
    let ["MODEX", r, u] = words.as_slice() else {
        panic!("bad peer line {line:?}")
    };
    let mut sides = [Side::new(true), Side::new(false)];
    sides[0].connect(&unhex(r));
    sides[1].connect(&unhex(u));
    writeln!(
        to_peer,
        "CONNECT {} {}",
        hex(&sides[0].btl.modex()),
        hex(&sides[1].btl.modex())
    )
    .expect("write");
    assert_eq!(from_peer.next().expect("done").expect("read"), "DONE");

    let mut medians = [Vec::new(), Vec::new()];
    // `BTL_PINGPONG_ONLY=0` (reliable) or `1` (unreliable) runs one side,
    // for profiling.
    let only: Option<usize> = std::env::var("BTL_PINGPONG_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    for _ in 0..rounds {
        for which in [0, 1].into_iter().filter(|w| only.is_none_or(|o| o == *w)) {
            writeln!(to_peer, "RUN {which} {}", iters + warmup).expect("write");
            let side = &mut sides[which];
            let start = side.arrived.load(Ordering::Relaxed);
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            for i in 1..=iters + warmup {
                let t = Instant::now();
                side.send();
                side.wait(start + i);
                if i > warmup {
                    hist.record(t.elapsed().as_nanos() as u64).expect("record");
                }
            }
            assert_eq!(from_peer.next().expect("done").expect("read"), "DONE");
            medians[which].push(hist.value_at_quantile(0.5) as f64 / 2000.0);
        }
    }
    writeln!(to_peer, "QUIT").expect("quit");
    let _ = child.wait();
    if only.is_some() {
        println!("{medians:?}");
        return;
    }
    let reliable = median(&mut medians[0]);
    let unreliable = median(&mut medians[1]);
    println!(
        "# BTL ping-pong over udp loopback, {SIZE} B, {rounds} rounds x {iters} iterations, peer {}",
        if pinned {
            "pinned to CPU 1"
        } else {
            "unpinned"
        }
    );
    println!("# one-way latency (half RTT), median of round medians, microseconds");
    println!("reliable    {reliable:.3}");
    println!("unreliable  {unreliable:.3}");
    println!("ratio reliable/unreliable: {:.3}", reliable / unreliable);
    let s = sides[0].btl.modules()[0].stats();
    println!(
        "# reliable side: {} data datagrams posted, {} transmit failures",
        s.sends_posted, s.transmit_failures
    );
}
