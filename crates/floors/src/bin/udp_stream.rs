//! `udp_stream`: the raw UDP bandwidth floor. A sender streams messages to
//! a receiver that counts what arrives; the floor is the receiver's goodput.
//!
//! ```text
//! udp_stream --listen 127.0.0.1:7100 &
//! udp_stream --connect 127.0.0.1:7100 --mode single|mmsg|gso [--datagram 1472] [--json]
//! ```
//!
//! * `single`: one datagram per `send`/`recv` call.
//! * `mmsg`: `sendmmsg`/`recvmmsg` batches of up to 64 datagrams.
//! * `gso`: `UDP_SEGMENT` on send (quinn-udp `Transmit::segment_size`, up to
//!   64 segments and 65507 B per call) and `UDP_GRO` on receive (quinn-udp
//!   `RecvMeta::stride`). If the kernel refuses either, the program says so
//!   and falls back to one datagram per call on that side.
//!
//! A message of `size` bytes leaves as ⌈size / datagram⌉ datagrams (the last
//! one shorter); smaller messages are one datagram each. For every size the
//! sender streams `window` × `iterations` messages back to back (OSU's
//! counts: 64 × 100 up to 8 KiB, 64 × 20 above), after a warm-up round.
//!
//! Control: a TCP connection to the same address as the UDP port. Per round
//! the sender names the mode, the receiver answers whether `UDP_GRO` is on,
//! the sender streams and then sends `END`; the receiver drains until the
//! socket has been quiet for 20 ms and answers with the bytes and datagrams
//! that arrived and the time from the first to the last; the sender takes
//! the longer of that and its own sending time. The sender prints
//! the results: goodput (MB/s, MB = 10⁶ B) and datagrams/s over that time,
//! and the datagrams lost (sent − received). The receiver serves one sender
//! and exits.

use std::io::{self, IoSliceMut, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};
use udbtl_floors::net::{self, NetError};
use udbtl_floors::record::Record;
use udbtl_floors::sys;

/// How datagrams cross the kernel boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// One datagram per system call.
    Single,
    /// sendmmsg/recvmmsg batches.
    Mmsg,
    /// UDP_SEGMENT on send, UDP_GRO on receive.
    Gso,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Mmsg => "mmsg",
            Self::Gso => "gso",
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Raw UDP streaming bandwidth floor (single, sendmmsg, GSO/GRO)"
)]
#[command(group = clap::ArgGroup::new("role").required(true).args(["listen", "connect"]))]
struct Args {
    /// Receive on ADDR (UDP, and TCP for control), serve one sender, exit.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Stream to the receiver at ADDR and print the results.
    #[arg(long, value_name = "ADDR")]
    connect: Option<String>,
    /// How datagrams are sent and received.
    #[arg(long, value_enum, default_value_t = Mode::Single)]
    mode: Mode,
    /// Datagram (GSO segment) payload in bytes: 1472 fits MTU 1500, 65507 is
    /// the most over IPv4 (loopback).
    #[arg(long, value_name = "BYTES", default_value_t = 1472, value_parser = clap::value_parser!(u64).range(1..))]
    datagram: u64,
    /// Smallest message in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    min_size: u64,
    /// Largest message in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    max_size: u64,
    /// Windows per size (default: OSU's 100 up to 8 KiB, 20 above).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// Messages per window.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    window: u64,
    /// Use neither UDP_SEGMENT nor UDP_GRO in gso mode, as when the kernel
    /// refuses them (to test the fallback).
    #[arg(long)]
    no_offload: bool,
    /// Give up after this many seconds without an answer.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
    /// Print JSON Lines instead of the table (notes go to stderr).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    #[error("control connection: {0}")]
    Protocol(String),
    #[error("no answer from the receiver within {0:?}")]
    Timeout(Duration),
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io { what, source }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match (&args.listen, &args.connect) {
        (Some(addr), _) => receive(addr, &args),
        (None, Some(addr)) => send(addr, &args),
        (None, None) => unreachable!("clap requires one role"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("udp_stream: {err}");
            ExitCode::FAILURE
        }
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// Line-based control over a nonblocking TCP stream.
#[derive(Debug)]
struct Control {
    stream: TcpStream,
    pending: Vec<u8>,
}

impl Control {
    fn new(stream: TcpStream) -> Result<Self, Error> {
        stream
            .set_nonblocking(true)
            .map_err(io_err("control O_NONBLOCK"))?;
        let _ = stream.set_nodelay(true);
        Ok(Self {
            stream,
            pending: Vec::new(),
        })
    }

    fn send(&mut self, line: &str) -> Result<(), Error> {
        let mut rest = format!("{line}\n").into_bytes();
        while !rest.is_empty() {
            match self.stream.write(&rest) {
                Ok(n) => drop(rest.drain(..n)),
                Err(e) if would_block(&e) => std::thread::yield_now(),
                Err(source) => {
                    return Err(Error::Io {
                        what: "control write",
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// A complete line if one has arrived; `Protocol` error at EOF.
    fn poll(&mut self) -> Result<Option<String>, Error> {
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..i]).into_owned()));
            }
            let mut buf = [0u8; 256];
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(Error::Protocol("closed by the peer".into())),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if would_block(&e) => return Ok(None),
                Err(source) => {
                    return Err(Error::Io {
                        what: "control read",
                        source,
                    });
                }
            }
        }
    }

    fn wait(&mut self, limit: Duration) -> Result<String, Error> {
        let start = Instant::now();
        loop {
            if let Some(line) = self.poll()? {
                return Ok(line);
            }
            if start.elapsed() > limit {
                return Err(Error::Timeout(limit));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// What arrived in one round.
#[derive(Debug, Default)]
struct Tally {
    bytes: u64,
    datagrams: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Tally {
    fn add(&mut self, bytes: usize, datagrams: usize) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.bytes += bytes as u64;
        self.datagrams += datagrams as u64;
    }
}

/// The receiver: serves one sender's rounds, then exits.
fn receive(addr: &str, args: &Args) -> Result<(), Error> {
    let addr = net::resolve(addr)?;
    let sock = net::udp_socket(Some(addr), None)?;
    // The bound address, so that port 0 (any free port) can be used; the
    // control port is the same number over TCP.
    let addr = sock.local_addr().map_err(io_err("getsockname"))?;
    let listener = TcpListener::bind(addr).map_err(io_err("bind the control port"))?;
    // quinn-udp turns UDP_GRO on if it can; off again outside gso rounds,
    // so single and mmsg measure what they name.
    let state =
        UdpSocketState::new(UdpSockRef::from(&sock)).map_err(io_err("quinn-udp socket state"))?;
    let _ = sys::set_udp_gro(&sock, false);
    eprintln!("udp_stream: receiving on {addr}");
    let (stream, _) = listener
        .accept()
        .map_err(io_err("accept the control connection"))?;
    let mut ctl = Control::new(stream)?;
    let limit = Duration::from_secs(args.timeout);
    const SLOT: usize = 1 << 16;
    let mut bufs: Vec<Vec<u8>> = (0..sys::MAX_BATCH).map(|_| vec![0u8; SLOT]).collect();
    let mut lens = [0usize; sys::MAX_BATCH];
    let mut metas = vec![RecvMeta::default(); quinn_udp::BATCH_SIZE.min(sys::MAX_BATCH)];
    loop {
        let line = ctl.wait(limit)?;
        let mut words = line.split_whitespace();
        let mode = match (words.next(), words.next()) {
            (Some("BYE"), _) => return Ok(()),
            (Some("ROUND"), Some("single")) => Mode::Single,
            (Some("ROUND"), Some("mmsg")) => Mode::Mmsg,
            (Some("ROUND"), Some("gso")) => Mode::Gso,
            _ => return Err(Error::Protocol(format!("unexpected {line:?}"))),
        };
        let offload = words.next() != Some("no-offload");
        let gro = if mode == Mode::Gso && offload {
            match sys::set_udp_gro(&sock, true) {
                Ok(()) => "on".to_owned(),
                Err(e) => format!("refused({})", e.raw_os_error().unwrap_or(0)),
            }
        } else {
            let _ = sys::set_udp_gro(&sock, false);
            "off".to_owned()
        };
        ctl.send(&format!("READY gro={gro}"))?;
        let mut tally = Tally::default();
        let mut ended: Option<Instant> = None;
        let quiet = Duration::from_millis(20);
        loop {
            let got = match mode {
                Mode::Single => match sock.recv(&mut bufs[0]) {
                    Ok(n) => {
                        tally.add(n, 1);
                        true
                    }
                    Err(e) if would_block(&e) => false,
                    Err(source) => {
                        return Err(Error::Io {
                            what: "recv",
                            source,
                        });
                    }
                },
                Mode::Mmsg => match sys::recv_mmsg(&sock, &mut bufs, &mut lens) {
                    Ok(n) => {
                        tally.add(lens[..n].iter().sum(), n);
                        true
                    }
                    Err(e) if would_block(&e) => false,
                    Err(source) => {
                        return Err(Error::Io {
                            what: "recvmmsg",
                            source,
                        });
                    }
                },
                Mode::Gso => {
                    let mut iovs: Vec<IoSliceMut<'_>> = bufs
                        .iter_mut()
                        .take(metas.len())
                        .map(|b| IoSliceMut::new(b))
                        .collect();
                    match state.recv(UdpSockRef::from(&sock), &mut iovs, &mut metas) {
                        Ok(n) => {
                            for m in &metas[..n] {
                                let segs = if m.stride > 0 {
                                    m.len.div_ceil(m.stride)
                                } else {
                                    1
                                };
                                tally.add(m.len, segs);
                            }
                            true
                        }
                        Err(e) if would_block(&e) => false,
                        Err(source) => {
                            return Err(Error::Io {
                                what: "recv (quinn-udp)",
                                source,
                            });
                        }
                    }
                }
            };
            if got {
                continue;
            }
            // The socket is empty: look at the control line, and end the
            // round once the sender is done and nothing came for a while.
            if ended.is_none() {
                if let Some(line) = ctl.poll()? {
                    if line.starts_with("END") {
                        ended = Some(Instant::now());
                    } else {
                        return Err(Error::Protocol(format!("expected END, got {line:?}")));
                    }
                }
            }
            if let Some(end) = ended {
                let since = tally.last.map_or(end, |l| l.max(end));
                if since.elapsed() > quiet {
                    break;
                }
            }
        }
        let span = match (tally.first, tally.last) {
            (Some(f), Some(l)) => l.duration_since(f).as_nanos(),
            _ => 0,
        };
        ctl.send(&format!("GOT {} {} {span}", tally.bytes, tally.datagrams))?;
    }
}

/// Sends one datagram (or GSO train), spinning while the buffer is full.
fn spin<F: FnMut() -> io::Result<usize>>(what: &'static str, mut f: F) -> Result<usize, Error> {
    loop {
        match f() {
            Ok(n) => return Ok(n),
            Err(e) if would_block(&e) => {}
            Err(source) => return Err(Error::Io { what, source }),
        }
    }
}

/// How the sender sends, once GSO support is known.
#[derive(Debug)]
struct Sender<'a> {
    sock: &'a UdpSocket,
    peer: SocketAddr,
    state: UdpSocketState,
    mode: Mode,
    /// Segments per GSO call (1: no GSO).
    gso_segments: usize,
    datagram: usize,
    buf: Vec<u8>,
}

impl Sender<'_> {
    /// Streams `count` messages of `size`; returns the datagrams sent.
    fn stream(&self, size: usize, count: u64) -> Result<u64, Error> {
        let d = self.datagram;
        // Datagram lengths of one message.
        let chunks: Vec<usize> = (0..size.div_ceil(d)).map(|i| d.min(size - i * d)).collect();
        let mut sent = 0u64;
        match self.mode {
            Mode::Single => {
                for _ in 0..count {
                    for &len in &chunks {
                        spin("send", || self.sock.send(&self.buf[..len]))?;
                        sent += 1;
                    }
                }
            }
            Mode::Gso if self.gso_segments <= 1 => {
                for _ in 0..count {
                    for &len in &chunks {
                        spin("send", || self.sock.send(&self.buf[..len]))?;
                        sent += 1;
                    }
                }
            }
            Mode::Mmsg => {
                let mut batch: Vec<&[u8]> = Vec::with_capacity(sys::MAX_BATCH);
                let total = count * chunks.len() as u64;
                let mut lens = chunks.iter().cycle();
                let mut left = total;
                while left > 0 {
                    batch.clear();
                    while batch.len() < sys::MAX_BATCH && (batch.len() as u64) < left {
                        let len = lens.next().copied().unwrap_or(d.min(size));
                        batch.push(&self.buf[..len]);
                    }
                    let mut off = 0;
                    while off < batch.len() {
                        off += spin("sendmmsg", || sys::send_mmsg(self.sock, &batch[off..]))?;
                    }
                    left -= batch.len() as u64;
                    sent += batch.len() as u64;
                }
            }
            Mode::Gso => {
                if size <= d {
                    // Whole messages as equal segments, as many per call as fit.
                    let per = self.gso_segments.min(net::UDP_MAX_V4 / size).max(1);
                    let mut left = count;
                    while left > 0 {
                        let k = per.min(usize::try_from(left).unwrap_or(per));
                        self.gso_send(&self.buf[..k * size], size)?;
                        left -= k as u64;
                        sent += k as u64;
                    }
                } else {
                    // Each message in trains of full segments, the last shorter.
                    let train = self.gso_segments.min(net::UDP_MAX_V4 / d).max(1) * d;
                    for _ in 0..count {
                        let mut off = 0;
                        while off < size {
                            let len = train.min(size - off);
                            self.gso_send(&self.buf[..len], d)?;
                            sent += len.div_ceil(d) as u64;
                            off += len;
                        }
                    }
                }
            }
        }
        Ok(sent)
    }

    fn gso_send(&self, contents: &[u8], segment: usize) -> Result<(), Error> {
        let t = Transmit {
            destination: self.peer,
            ecn: None,
            contents,
            segment_size: (contents.len() > segment).then_some(segment),
            src_ip: None,
        };
        spin("sendmsg with UDP_SEGMENT (quinn-udp)", || {
            self.state
                .try_send(UdpSockRef::from(self.sock), &t)
                .map(|()| 0)
        })?;
        Ok(())
    }
}

fn send(addr: &str, args: &Args) -> Result<(), Error> {
    let peer = net::resolve(addr)?;
    let limit = Duration::from_secs(args.timeout);
    let bind = if peer.is_ipv6() {
        SocketAddr::from(([0u16; 8], 0))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    };
    let sock = net::udp_socket(Some(bind), Some(peer))?;
    let datagram = usize::try_from(args.datagram).unwrap_or(usize::MAX);
    net::check_size("--datagram", datagram, &sock, peer)?;
    // The receiver may still be starting: retry for a few seconds.
    let start = Instant::now();
    let stream = loop {
        match TcpStream::connect_timeout(&peer, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(source) => {
                return Err(Error::Io {
                    what: "connect to the receiver's control port",
                    source,
                });
            }
        }
    };
    let mut ctl = Control::new(stream)?;
    let state =
        UdpSocketState::new(UdpSockRef::from(&sock)).map_err(io_err("quinn-udp socket state"))?;
    let _ = sys::set_udp_gro(&sock, false);
    let offload = args.mode == Mode::Gso && !args.no_offload;
    let gso_segments = if offload { state.max_gso_segments() } else { 1 };
    let max = usize::try_from(args.max_size).unwrap_or(usize::MAX);
    let sender = Sender {
        sock: &sock,
        peer,
        state,
        mode: args.mode,
        gso_segments,
        datagram,
        buf: vec![0x5a; max.max(datagram).min(net::UDP_MAX_V6)],
    };

    let out = io::stdout();
    let mut out = out.lock();
    let mut said_path = false;
    for size in net::sizes(usize::try_from(args.min_size).unwrap_or(1), max) {
        let (osu_iters, osu_skip) = net::bw_iterations(size);
        let iters = args.iterations.unwrap_or(osu_iters);
        let skip = if args.iterations.is_some() {
            1
        } else {
            osu_skip
        };
        let mut result = (0, 0, 0, 0u64);
        for (round, windows) in [skip, iters].into_iter().enumerate() {
            ctl.send(&format!(
                "ROUND {}{}",
                args.mode.name(),
                if offload { "" } else { " no-offload" }
            ))?;
            let ready = ctl.wait(limit)?;
            let gro = ready
                .strip_prefix("READY gro=")
                .ok_or_else(|| Error::Protocol(format!("expected READY, got {ready:?}")))?
                .to_owned();
            if !said_path {
                said_path = true;
                let path = describe(args.mode, args.no_offload, gso_segments, datagram, &gro);
                if args.json {
                    eprintln!("udp_stream: path: {path}");
                } else {
                    let _ = writeln!(
                        out,
                        "# udp_stream: raw UDP to {peer}, mode {}, datagram {datagram} B",
                        args.mode.name()
                    );
                    let _ = writeln!(out, "# path: {path}");
                    let _ = writeln!(
                        out,
                        "# {:<10}{:>14}{:>16}{:>12}{:>12}",
                        "Size", "MB/s", "Datagrams/s", "Sent", "Lost"
                    );
                }
            }
            let count = windows * args.window;
            let t0 = Instant::now();
            let sent = sender.stream(size, count)?;
            let sender_ns = t0.elapsed().as_nanos();
            ctl.send(&format!("END {sent}"))?;
            let got = ctl.wait(limit)?;
            let nums: Vec<u128> = got
                .strip_prefix("GOT ")
                .unwrap_or("")
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            let [bytes, dgrams, span] = nums[..] else {
                return Err(Error::Protocol(format!("expected GOT, got {got:?}")));
            };
            if round == 1 {
                // The slower side sets the pace: a short round can reach the
                // receiver in one burst (or one GRO'd arrival, with no span).
                let span = span.max(sender_ns);
                result = (bytes, dgrams, span, sent);
            }
        }
        let (bytes, dgrams, span_ns, sent) = result;
        let secs = span_ns as f64 / 1e9;
        let rate = |x: u128| {
            if secs > 0.0 {
                x as f64 / secs
            } else {
                f64::NAN
            }
        };
        let rec = Record {
            tool: "udp_stream".into(),
            bench: "bw".into(),
            mode: Some(args.mode.name().into()),
            size: size as u64,
            datagram: Some(datagram as u64),
            mb_per_s: Some(rate(bytes) / 1e6),
            datagrams_per_s: Some(rate(dgrams)),
            lost: Some(sent.saturating_sub(dgrams as u64)),
            ..Record::default()
        };
        let _ = if args.json {
            writeln!(out, "{}", rec.to_line())
        } else {
            writeln!(
                out,
                "{:<12}{:>14.2}{:>16.0}{:>12}{:>12}",
                size,
                rate(bytes) / 1e6,
                rate(dgrams),
                sent,
                sent.saturating_sub(dgrams as u64)
            )
        };
        let _ = out.flush();
    }
    ctl.send("BYE")?;
    Ok(())
}

/// One line saying which send and receive path ran.
fn describe(
    mode: Mode,
    no_offload: bool,
    gso_segments: usize,
    datagram: usize,
    gro: &str,
) -> String {
    match mode {
        Mode::Single => "send: one datagram per send(); recv: one per recv()".into(),
        Mode::Mmsg => format!(
            "send: sendmmsg batches of up to {}; recv: recvmmsg batches",
            sys::MAX_BATCH
        ),
        Mode::Gso => {
            let send = if no_offload {
                "send: fallback, one datagram per send() (--no-offload)".to_owned()
            } else if gso_segments > 1 {
                let per = gso_segments.min(net::UDP_MAX_V4 / datagram).max(1);
                format!(
                    "send: UDP_SEGMENT on, up to {per} segments of {datagram} B per sendmsg (quinn-udp)"
                )
            } else {
                "send: fallback, kernel refuses UDP_SEGMENT: one datagram per send()".to_owned()
            };
            let recv = match gro {
                "on" => "recv: UDP_GRO on (quinn-udp stride)".to_owned(),
                "off" => "recv: UDP_GRO off (fallback)".to_owned(),
                other => format!("recv: fallback, kernel refuses UDP_GRO ({other})"),
            };
            format!("{send}; {recv}")
        }
    }
}
