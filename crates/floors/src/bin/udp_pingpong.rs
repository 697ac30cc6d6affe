//! `udp_pingpong`: the raw UDP latency floor. One process echoes, the other
//! times round trips; both busy-poll nonblocking sockets, as MPI does (a
//! blocked receiver costs about 32 µs of wake-up on this kind of VM).
//!
//! ```text
//! udp_pingpong --listen 127.0.0.1:7000 &
//! udp_pingpong --connect 127.0.0.1:7000 [--max-size N] [--json]
//! ```
//!
//! Sizes double from 1 B to `--max-size` (default: the largest payload the
//! path carries, 65507 B on loopback, 1472 B across MTU 1500), plus the
//! maximum itself; OSU counts (10 000 after 1 000 up to 8 KiB, 1 000 after
//! 100 above). Reports one-way latency (round trip / 2). The client ends the
//! server with an empty datagram.

use std::io::{self, Write as _};
use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use udbtl_floors::net::{self, NetError};
use udbtl_floors::record::Record;

#[derive(Debug, Parser)]
#[command(version, about = "Raw UDP ping-pong latency floor (busy-polling)")]
#[command(group = clap::ArgGroup::new("role").required(true).args(["listen", "connect"]))]
struct Args {
    /// Echo datagrams received on ADDR (host:port) until the client ends.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Time round trips to the echo server at ADDR (host:port).
    #[arg(long, value_name = "ADDR")]
    connect: Option<String>,
    /// Largest message in bytes (default: the path's payload limit).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_size: Option<u64>,
    /// Smallest message in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    min_size: u64,
    /// Timed iterations for every size (default: OSU's per-size counts).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// Warm-up iterations for every size (default: OSU's per-size counts).
    #[arg(long)]
    skip: Option<u64>,
    /// Give up when a reply (client) or any datagram (server) takes longer
    /// than this many seconds: UDP may lose one.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
    /// Print JSON Lines instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("no reply for {timeout:?} at size {size} (a lost datagram, or no server at {peer})")]
    NoReply {
        size: usize,
        timeout: Duration,
        peer: SocketAddr,
    },
    #[error("nothing received for {0:?}; giving up")]
    Idle(Duration),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    #[error("histogram: {0}")]
    Histogram(String),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match (&args.listen, &args.connect) {
        (Some(addr), _) => serve(addr, &args),
        (None, Some(addr)) => client(addr, &args),
        (None, None) => unreachable!("clap requires one role"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("udp_pingpong: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Spins until a datagram arrives or `limit` passes.
fn spin_recv(
    sock: &UdpSocket,
    buf: &mut [u8],
    limit: Duration,
) -> Result<Option<(usize, SocketAddr)>, Error> {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        match sock.recv_from(buf) {
            Ok(got) => return Ok(Some(got)),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            // An ICMP port unreachable from an earlier send: no peer (yet).
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
            Err(source) => {
                return Err(Error::Io {
                    what: "recv",
                    source,
                });
            }
        }
        polls = polls.wrapping_add(1);
        // Reading the clock on every poll would slow the spin for nothing.
        if polls % 1024 == 0 && start.elapsed() > limit {
            return Ok(None);
        }
    }
}

/// Sends, retrying while the send buffer is full.
fn spin_send(sock: &UdpSocket, buf: &[u8], to: Option<SocketAddr>) -> Result<(), Error> {
    loop {
        let r = match to {
            Some(to) => sock.send_to(buf, to),
            None => sock.send(buf),
        };
        match r {
            Ok(_) => return Ok(()),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(source) => {
                return Err(Error::Io {
                    what: "send",
                    source,
                });
            }
        }
    }
}

fn serve(addr: &str, args: &Args) -> Result<(), Error> {
    let addr = net::resolve(addr)?;
    let sock = net::udp_socket(Some(addr), None)?;
    // The bound address, so that port 0 (any free port) can be used.
    let addr = sock.local_addr().map_err(|source| Error::Io {
        what: "getsockname",
        source,
    })?;
    eprintln!("udp_pingpong: echoing on {addr}");
    let mut buf = vec![0u8; net::UDP_MAX_V6 + 1];
    let limit = Duration::from_secs(args.timeout);
    loop {
        let Some((n, from)) = spin_recv(&sock, &mut buf, limit)? else {
            return Err(Error::Idle(limit));
        };
        if n == 0 {
            return Ok(());
        }
        spin_send(&sock, &buf[..n], Some(from))?;
    }
}

fn client(addr: &str, args: &Args) -> Result<(), Error> {
    let peer = net::resolve(addr)?;
    let bind = if peer.is_ipv6() {
        SocketAddr::from(([0u16; 8], 0))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    };
    let sock = net::udp_socket(Some(bind), Some(peer))?;
    let (limit, _) = net::payload_limit(&sock, peer)?;
    let max = match args.max_size {
        Some(m) => net::check_size(
            "--max-size",
            usize::try_from(m).unwrap_or(usize::MAX),
            &sock,
            peer,
        )
        .map(|_| m as usize)?,
        None => limit,
    };
    let min = usize::try_from(args.min_size).unwrap_or(usize::MAX);
    let timeout = Duration::from_secs(args.timeout);
    let out = io::stdout();
    let mut out = out.lock();
    if !args.json {
        let _ = writeln!(
            out,
            "# udp_pingpong: raw UDP to {peer}, busy-poll, one-way = round trip / 2"
        );
        let _ = writeln!(
            out,
            "# {:<10}{:>12}{:>12}{:>12}{:>12}{:>12}",
            "Size", "Avg (us)", "Min (us)", "p50 (us)", "p99 (us)", "Max (us)"
        );
    }
    let mut send = vec![0xa5u8; max];
    let mut recv = vec![0u8; max + 1];
    for size in net::sizes(min, max) {
        let (osu_iters, osu_skip) = net::latency_iterations(size);
        let iters = args.iterations.unwrap_or(osu_iters);
        let skip = args.skip.unwrap_or(osu_skip);
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
            .map_err(|e| Error::Histogram(e.to_string()))?;
        let mut total_ns: u128 = 0;
        for i in 0..skip + iters {
            send[0] = i as u8;
            let t0 = Instant::now();
            spin_send(&sock, &send[..size], None)?;
            loop {
                match spin_recv(&sock, &mut recv, timeout)? {
                    None => {
                        return Err(Error::NoReply {
                            size,
                            timeout,
                            peer,
                        });
                    }
                    // A late echo of an earlier size or iteration: not ours.
                    Some((n, _)) if n != size || recv[0] != send[0] => {}
                    Some(_) => break,
                }
            }
            let rtt = t0.elapsed().as_nanos();
            if i >= skip {
                total_ns += rtt;
                // One-way, in ns (half the round trip).
                let _ = hist.record(((rtt / 2) as u64).max(1));
            }
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        let rec = Record {
            tool: "udp_pingpong".into(),
            bench: "latency".into(),
            size: size as u64,
            iterations: Some(iters),
            avg_us: Some(total_ns as f64 / 2.0 / iters as f64 / 1000.0),
            min_us: Some(us(hist.min())),
            max_us: Some(us(hist.max())),
            p50_us: Some(us(hist.value_at_quantile(0.5))),
            p99_us: Some(us(hist.value_at_quantile(0.99))),
            ..Record::default()
        };
        let f = |v: Option<f64>| v.unwrap_or(f64::NAN);
        let _ = if args.json {
            writeln!(out, "{}", rec.to_line())
        } else {
            writeln!(
                out,
                "{:<12}{:>12.2}{:>12.2}{:>12.2}{:>12.2}{:>12.2}",
                size,
                f(rec.avg_us),
                f(rec.min_us),
                f(rec.p50_us),
                f(rec.p99_us),
                f(rec.max_us)
            )
        };
        let _ = out.flush();
    }
    // The empty datagram ends the server; a few in case one is lost.
    for _ in 0..3 {
        let _ = sock.send(&[]);
    }
    Ok(())
}
