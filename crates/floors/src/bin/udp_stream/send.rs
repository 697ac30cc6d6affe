//! The sending side: streams datagrams with the batching the mode asks for.

use std::io::{self, Write as _};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use quinn_udp::{Transmit, UdpSockRef, UdpSocketState};
use udbtl_floors::net::{self};
use udbtl_floors::record::Record;
use udbtl_floors::sys;

use crate::{Args, Control, Error, Mode, io_err, spin};

/// How the sender sends, once GSO support is known.
#[derive(Debug)]
pub(crate) struct Sender<'a> {
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
    pub(crate) fn stream(&self, size: usize, count: u64) -> Result<u64, Error> {
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

    pub(crate) fn gso_send(&self, contents: &[u8], segment: usize) -> Result<(), Error> {
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

pub(crate) fn send(addr: &str, args: &Args) -> Result<(), Error> {
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
pub(crate) fn describe(
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
