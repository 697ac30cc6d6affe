//! The receiving side: counts what arrives, with the batching the mode
//! asks for, and reports it.

use std::io::IoSliceMut;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState};
use udbtl_floors::net::{self};
use udbtl_floors::sys;

use crate::{Args, Control, Error, Mode, io_err, would_block};

/// What arrived in one round.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    bytes: u64,
    datagrams: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Tally {
    pub(crate) fn add(&mut self, bytes: usize, datagrams: usize) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.bytes += bytes as u64;
        self.datagrams += datagrams as u64;
    }
}

/// The receiver: serves one sender's rounds, then exits.
pub(crate) fn receive(addr: &str, args: &Args) -> Result<(), Error> {
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
