//! Ping-pong between two processes through the fabric API, next to a raw
//! `std::net::UdpSocket` ping-pong measured in the same run.
//!
//! ```text
//! cargo run --release -p udbtl-fabric --example pingpong -- --size 8
//! ```
//!
//! The parent spawns a copy of itself as the echoing peer (pinned to another
//! CPU with `taskset` when it is available), and both sides busy-poll. Each of
//! `--rounds` rounds runs the raw and the fabric ping-pong back to back; the
//! report gives the median over rounds of each round's median one-way latency
//! (half the round trip).

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Instant;

use clap::Parser;
use hdrhistogram::Histogram;
use udbtl_fabric::udp::{UdpConfig, UdpContext, UdpProvider};
use udbtl_fabric::*;

const QKEY: u32 = 0x0133_0133;
const SLOTS: usize = 64;

#[derive(Debug, Parser)]
struct Args {
    /// Payload bytes per message.
    #[arg(long, default_value_t = 8)]
    size: usize,
    /// Timed round trips per round.
    #[arg(long, default_value_t = 20_000)]
    iters: u32,
    /// Untimed round trips before each measurement.
    #[arg(long, default_value_t = 1_000)]
    warmup: u32,
    /// Rounds of (raw, fabric) measurements.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Datagram size of the bandwidth test (0 skips it).
    #[arg(long, default_value_t = 65_000)]
    bw_size: usize,
    /// Datagrams per bandwidth window.
    #[arg(long, default_value_t = 64)]
    window: u32,
    /// Timed windows of the bandwidth test per round.
    #[arg(long, default_value_t = 200)]
    windows: u32,
    /// Use IPv6 loopback.
    #[arg(long)]
    ipv6: bool,
    /// CPU for the echoing peer (`none` to leave it unpinned).
    #[arg(long, default_value = "1")]
    peer_cpu: String,
    /// Internal: run as the echoing peer.
    #[arg(long, hide = true)]
    peer: bool,
}

/// One side of the fabric ping-pong.
struct Fabric {
    ctx: UdpContext,
    cq: CqHandle,
    qp: QpInfo,
    recv: Mr,
    send: Mr,
    ah: Option<AhHandle>,
    pd: PdHandle,
    wcs: [WorkCompletion; 16],
    /// The count carried by the last 4-byte datagram (a bandwidth ack).
    last_ack: Option<u32>,
}

impl Fabric {
    fn new(ipv6: bool, size: usize) -> Self {
        let provider = UdpProvider::new(UdpConfig {
            ipv6,
            ..UdpConfig::default()
        });
        let device = provider.devices().expect("devices").remove(0);
        let mut ctx = provider.open(&device.name).expect("open");
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx.create_cq(1024).expect("cq");
        let cap = QpCap {
            max_send_wr: 128,
            max_recv_wr: SLOTS as u32,
            max_send_sge: 1,
            max_inline_data: 0,
        };
        let qp = ctx
            .create_qp(
                pd,
                &QpInitAttr {
                    send_cq: cq,
                    recv_cq: cq,
                    cap,
                },
            )
            .expect("qp");
        ctx.modify_qp(
            qp.handle,
            &QpTransition::Init {
                pkey_index: 0,
                qkey: QKEY,
                port: 1,
            },
        )
        .expect("init");
        ctx.modify_qp(qp.handle, &QpTransition::Rtr).expect("rtr");
        ctx.modify_qp(qp.handle, &QpTransition::Rts { sq_psn: 0 })
            .expect("rts");
        let slot = GRH_LEN + size;
        let recv = ctx.reg_mr(pd, SLOTS * slot).expect("recv mr");
        let send = ctx.reg_mr(pd, size.max(1)).expect("send mr");
        let wrs: Vec<RecvWr> = (0..SLOTS)
            .map(|i| RecvWr {
                wr_id: i as u64,
                sge: Sge {
                    lkey: recv.lkey,
                    offset: i * slot,
                    len: slot,
                },
            })
            .collect();
        ctx.post_recv(qp.handle, &wrs).expect("post_recv");
        Self {
            ctx,
            cq,
            qp,
            recv,
            send,
            ah: None,
            pd,
            wcs: [WorkCompletion::EMPTY; 16],
            last_ack: None,
        }
    }

    fn connect(&mut self) {
        let dest = NodeAddr::Ip(self.ctx.ip());
        let attr = AhAttr {
            dest,
            service_level: 0,
            src_path_bits: 0,
            port: 1,
        };
        self.ah = Some(self.ctx.create_ah(self.pd, &attr).expect("ah"));
    }

    fn send(&mut self, qpn: u32, size: usize) {
        let sg = [Gather::Registered(Sge {
            lkey: self.send.lkey,
            offset: 0,
            len: size,
        })];
        let wr = SendWr {
            wr_id: 0,
            sg_list: &sg,
            ah: self.ah.expect("connected"),
            remote_qpn: qpn,
            remote_qkey: QKEY,
            imm: None,
            flags: SendFlags::SIGNALED,
        };
        // The send queue holds 128: reap completions until there is room.
        while let Err(err) = self.ctx.post_send(self.qp.handle, &[wr]) {
            assert!(
                matches!(err.error, FabricError::QueueFull { .. }),
                "post_send: {err}"
            );
            self.poll();
        }
    }

    /// Polls once; reposts receive buffers and returns how many datagrams
    /// arrived.
    fn poll(&mut self) -> usize {
        let n = self.ctx.poll_cq(self.cq, &mut self.wcs).expect("poll_cq");
        let mut got = 0;
        for i in 0..n {
            let wc = self.wcs[i];
            if wc.opcode == WcOpcode::Recv {
                let slot = self.recv.len / SLOTS;
                if wc.payload_len() == 4 {
                    let at = wc.wr_id as usize * slot + GRH_LEN;
                    let bytes = &self.ctx.mr_bytes(self.recv.handle).expect("recv mr")[at..at + 4];
                    self.last_ack = Some(u32::from_le_bytes(bytes.try_into().expect("4 bytes")));
                }
                let sge = Sge {
                    lkey: self.recv.lkey,
                    offset: wc.wr_id as usize * slot,
                    len: slot,
                };
                self.ctx
                    .post_recv(
                        self.qp.handle,
                        &[RecvWr {
                            wr_id: wc.wr_id,
                            sge,
                        }],
                    )
                    .expect("repost");
                got += 1;
            }
        }
        got
    }

    /// Busy-polls until one datagram arrived.
    fn recv(&mut self) {
        while self.poll() == 0 {}
    }
}

fn raw_socket(ipv6: bool) -> UdpSocket {
    let socket = UdpSocket::bind(if ipv6 { "[::1]:0" } else { "127.0.0.1:0" }).expect("bind");
    socket.set_nonblocking(true).expect("nonblocking");
    socket
}

fn set_raw_buffers(socket: &UdpSocket) {
    let sock = socket2::SockRef::from(socket);
    sock.set_recv_buffer_size(4 << 20).expect("SO_RCVBUF");
    sock.set_send_buffer_size(4 << 20).expect("SO_SNDBUF");
}

fn raw_recv(socket: &UdpSocket, buf: &mut [u8]) {
    loop {
        match socket.recv(buf) {
            Ok(_) => return,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
}

/// Counts datagrams of one bandwidth window: until `window` arrived or the
/// line went quiet (UD may lose some).
fn count_window(window: u32, mut poll: impl FnMut() -> usize) -> u32 {
    let mut got = 0;
    let mut last = Instant::now();
    while got < window as usize && last.elapsed() < IDLE {
        let n = poll();
        if n > 0 {
            got += n;
            last = Instant::now();
        }
    }
    got as u32
}

const IDLE: std::time::Duration = std::time::Duration::from_millis(20);

fn peer(args: &Args) {
    let raw = raw_socket(args.ipv6);
    set_raw_buffers(&raw);
    let mut fabric = Fabric::new(args.ipv6, args.size.max(args.bw_size));
    fabric.connect();
    println!(
        "ADDR {} {}",
        raw.local_addr().expect("addr").port(),
        fabric.qp.qp_num
    );
    std::io::stdout().flush().expect("flush");
    let mut buf = vec![0u8; args.size.max(1)];
    for line in std::io::stdin().lines() {
        let line = line.expect("stdin");
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["RAW", port, n] => {
                let dest = SocketAddr::new(loopback(args.ipv6), port.parse().expect("port"));
                for _ in 0..n.parse::<u32>().expect("count") {
                    raw_recv(&raw, &mut buf);
                    raw.send_to(&buf[..args.size], dest).expect("send_to");
                }
            }
            ["UD", qpn, n] => {
                let qpn = qpn.parse().expect("qpn");
                for _ in 0..n.parse::<u32>().expect("count") {
                    fabric.recv();
                    fabric.send(qpn, args.size);
                }
            }
            ["RAWBW", port, n, window] => {
                let dest = SocketAddr::new(loopback(args.ipv6), port.parse().expect("port"));
                let window = window.parse().expect("window");
                let mut big = vec![0u8; 65_536];
                for _ in 0..n.parse::<u32>().expect("count") {
                    let got = count_window(window, || usize::from(raw.recv(&mut big).is_ok()));
                    raw.send_to(&got.to_le_bytes(), dest).expect("send_to");
                }
            }
            ["UDBW", qpn, n, window] => {
                let qpn = qpn.parse().expect("qpn");
                let window = window.parse().expect("window");
                for _ in 0..n.parse::<u32>().expect("count") {
                    let got = count_window(window, || fabric.poll());
                    let at = fabric
                        .ctx
                        .mr_bytes_mut(fabric.send.handle)
                        .expect("send mr");
                    at[..4].copy_from_slice(&got.to_le_bytes());
                    fabric.send(qpn, 4);
                }
            }
            ["QUIT"] => return,
            _ => panic!("peer: unexpected command {line:?}"),
        }
        println!("DONE");
        std::io::stdout().flush().expect("flush");
    }
}

fn loopback(ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::from([0, 0, 0, 0, 0, 0, 0, 1u16])
    } else {
        IpAddr::from([127, 0, 0, 1])
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args = Args::parse();
    if args.peer {
        return peer(&args);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut peer_args = vec!["--peer".to_string(), "--size".into(), args.size.to_string()];
    if args.ipv6 {
        peer_args.push("--ipv6".into());
    }
    let pinned = args.peer_cpu != "none" && Command::new("taskset").arg("-V").output().is_ok();
    let mut command = if pinned {
        let mut c = Command::new("taskset");
        c.args(["-c", &args.peer_cpu]).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let mut child = command
        .args(&peer_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn peer");
    let mut to_peer = child.stdin.take().expect("stdin");
    let mut from_peer = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr_line = from_peer.next().expect("peer address").expect("read");
    let words: Vec<&str> = addr_line.split_whitespace().collect();
    let (peer_port, peer_qpn): (u16, u32) = match words.as_slice() {
        ["ADDR", port, qpn] => (port.parse().expect("port"), qpn.parse().expect("qpn")),
        _ => panic!("bad peer line {addr_line:?}"),
    };
    let raw = raw_socket(args.ipv6);
    set_raw_buffers(&raw);
    let raw_dest = SocketAddr::new(loopback(args.ipv6), peer_port);
    let mut fabric = Fabric::new(args.ipv6, args.size.max(args.bw_size));
    fabric.connect();
    let mut buf = vec![0u8; args.size.max(1)];
    let total = args.warmup + args.iters;

    let mut raw_medians = Vec::new();
    let mut ud_medians = Vec::new();
    let mut raw_hist = Histogram::<u64>::new(3).expect("histogram");
    let mut ud_hist = Histogram::<u64>::new(3).expect("histogram");
    for _ in 0..args.rounds {
        for kind in ["RAW", "UD"] {
            let target = if kind == "RAW" {
                u32::from(raw.local_addr().expect("addr").port())
            } else {
                fabric.qp.qp_num
            };
            writeln!(to_peer, "{kind} {target} {total}").expect("command");
            let mut round = Histogram::<u64>::new(3).expect("histogram");
            for i in 0..total {
                let start = Instant::now();
                if kind == "RAW" {
                    raw.send_to(&buf[..args.size], raw_dest).expect("send_to");
                    raw_recv(&raw, &mut buf);
                } else {
                    fabric.send(peer_qpn, args.size);
                    fabric.recv();
                }
                if i >= args.warmup {
                    round
                        .record(start.elapsed().as_nanos() as u64)
                        .expect("record");
                }
            }
            let done = from_peer.next().expect("peer done").expect("read");
            assert_eq!(done, "DONE");
            let one_way_us = round.value_at_quantile(0.5) as f64 / 2000.0;
            if kind == "RAW" {
                raw_medians.push(one_way_us);
                raw_hist.add(&round).expect("add");
            } else {
                ud_medians.push(one_way_us);
                ud_hist.add(&round).expect("add");
            }
        }
    }
    let mut raw_bw = Vec::new();
    let mut ud_bw = Vec::new();
    if args.bw_size > 0 {
        let big = vec![0u8; args.bw_size];
        for _ in 0..args.rounds {
            for kind in ["RAWBW", "UDBW"] {
                let target = if kind == "RAWBW" {
                    u32::from(raw.local_addr().expect("addr").port())
                } else {
                    fabric.qp.qp_num
                };
                writeln!(
                    to_peer,
                    "{kind} {target} {} {}",
                    args.windows + 2,
                    args.window
                )
                .expect("command");
                let mut bytes = 0u64;
                let mut start = Instant::now();
                for w in 0..args.windows + 2 {
                    if w == 2 {
                        // Two untimed windows warm the buffers up.
                        start = Instant::now();
                        bytes = 0;
                    }
                    let got = if kind == "RAWBW" {
                        for _ in 0..args.window {
                            // A full socket buffer is a lost datagram, as on UD.
                            let _ = raw.send_to(&big, raw_dest);
                        }
                        let mut ack = [0u8; 4];
                        raw_recv(&raw, &mut ack);
                        u32::from_le_bytes(ack)
                    } else {
                        for _ in 0..args.window {
                            fabric.send(peer_qpn, args.bw_size);
                        }
                        fabric.last_ack = None;
                        while fabric.last_ack.is_none() {
                            fabric.poll();
                        }
                        fabric.last_ack.unwrap_or(0)
                    };
                    bytes += u64::from(got) * args.bw_size as u64;
                }
                let mbps = bytes as f64 / start.elapsed().as_secs_f64() / 1e6;
                if kind == "RAWBW" {
                    raw_bw.push(mbps)
                } else {
                    ud_bw.push(mbps)
                }
                assert_eq!(from_peer.next().expect("peer done").expect("read"), "DONE");
            }
        }
    }
    writeln!(to_peer, "QUIT").expect("quit");
    let _ = child.wait();

    let raw_median = median(&mut raw_medians);
    let ud_median = median(&mut ud_medians);
    let pct = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 2000.0;
    println!(
        "# fabric ping-pong, {} B, {} rounds x {} iterations, peer {}",
        args.size,
        args.rounds,
        args.iters,
        if pinned {
            format!("pinned to CPU {}", args.peer_cpu)
        } else {
            "unpinned".into()
        }
    );
    println!("# one-way latency (half RTT), microseconds");
    println!(
        "{:<24} {:>8} {:>8} {:>8} {:>8}",
        "transport", "median", "p50", "p99", "min"
    );
    for (name, median, hist) in [
        ("std UdpSocket", raw_median, &raw_hist),
        ("udbtl fabric (udp)", ud_median, &ud_hist),
    ] {
        println!(
            "{name:<24} {median:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            pct(hist, 0.5),
            pct(hist, 0.99),
            hist.min() as f64 / 2000.0
        );
    }
    println!(
        "ratio fabric/raw (median of round medians): {:.3}",
        ud_median / raw_median
    );
    if !raw_bw.is_empty() {
        let (raw_bw, ud_bw) = (median(&mut raw_bw), median(&mut ud_bw));
        println!(
            "# bandwidth, {} B datagrams, windows of {}, MB/s (1e6 B/s) of datagrams received",
            args.bw_size, args.window
        );
        println!("{:<24} {:>10.0}", "std UdpSocket", raw_bw);
        println!("{:<24} {:>10.0}", "udbtl fabric (udp)", ud_bw);
        println!("ratio fabric/raw: {:.3}", ud_bw / raw_bw);
    }
}
