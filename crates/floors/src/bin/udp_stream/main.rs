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

use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod recv;
mod send;

use clap::{Parser, ValueEnum};
use udbtl_floors::net::NetError;

/// How datagrams cross the kernel boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// One datagram per system call.
    Single,
    /// sendmmsg/recvmmsg batches.
    Mmsg,
    /// UDP_SEGMENT on send, UDP_GRO on receive.
    Gso,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
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
pub(crate) struct Args {
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
pub(crate) enum Error {
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

pub(crate) fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io { what, source }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match (&args.listen, &args.connect) {
        (Some(addr), _) => recv::receive(addr, &args),
        (None, Some(addr)) => send::send(addr, &args),
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

pub(crate) fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// Line-based control over a nonblocking TCP stream.
#[derive(Debug)]
pub(crate) struct Control {
    stream: TcpStream,
    pending: Vec<u8>,
}

impl Control {
    pub(crate) fn new(stream: TcpStream) -> Result<Self, Error> {
        stream
            .set_nonblocking(true)
            .map_err(io_err("control O_NONBLOCK"))?;
        let _ = stream.set_nodelay(true);
        Ok(Self {
            stream,
            pending: Vec::new(),
        })
    }

    pub(crate) fn send(&mut self, line: &str) -> Result<(), Error> {
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
    pub(crate) fn poll(&mut self) -> Result<Option<String>, Error> {
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

    pub(crate) fn wait(&mut self, limit: Duration) -> Result<String, Error> {
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

/// Sends one datagram (or GSO train), spinning while the buffer is full.
pub(crate) fn spin<F: FnMut() -> io::Result<usize>>(
    what: &'static str,
    mut f: F,
) -> Result<usize, Error> {
    loop {
        match f() {
            Ok(n) => return Ok(n),
            Err(e) if would_block(&e) => {}
            Err(source) => return Err(Error::Io { what, source }),
        }
    }
}
