//! A stranger on the host who forges datagrams to a job's udbtl sockets.
//!
//! It finds the ranks' UDP sockets in `/proc`, as any local user can
//! (`proc_net.rs`), and knows the job key and the ranks' process ids. With a raw socket
//! (`CAP_NET_RAW`) it sends from one rank's own address and port to
//! another's, so the receiver takes each datagram for that rank's. What it
//! cannot know is where the streams between the ranks are: it guesses the
//! sequence numbers that were right while every stream started at 0.
//!
//! For the tests of the Open MPI component and of the test drivers:
//! included with `#[path]`, since tests of different crates share no
//! module otherwise.

#![allow(dead_code)]

use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use udbtl_wire::datagram;
use udbtl_wire::rel::{self, FLAG_ACK_ONLY, FLAG_CHECKSUM, FLAG_RESET};
use udbtl_wire::{SeqNum, btl, ud};

/// The seed's fixed Q_Key. A job whose datagrams a forger is to get past
/// the admission is started with it (`UDBTL_IB_QKEY`, which also leaves
/// the job key unmasked): the forger then knows everything but where the
/// streams are. At the defaults each module draws its own Q_Key and mask,
/// and these forgeries die in the fabric as `bad qkey`.
pub(crate) const QKEY: u32 = 0x0133_0133;
/// [`QKEY`] as the environment variable that fixes it.
pub(crate) const FIXED_QKEY: (&str, &str) = ("UDBTL_IB_QKEY", "0x01330133");
/// Sequence numbers guessed per kind of forgery.
pub(crate) const GUESSES: u32 = 16;

/// The process ids the ranks wrote into `dir` as `pid.<rank>`, once all
/// `ranks` have; `None` if `gone` says the job ended first.
pub(crate) fn rank_pids(
    dir: &Path,
    ranks: u32,
    mut gone: impl FnMut() -> bool,
) -> Option<Vec<u32>> {
    loop {
        let pids: Vec<u32> = (0..ranks)
            .filter_map(|rank| std::fs::read_to_string(dir.join(format!("pid.{rank}"))).ok())
            .filter_map(|text| text.trim().parse().ok())
            .collect();
        if pids.len() == ranks as usize {
            return Some(pids);
        }
        if gone() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The job key in process `pid`'s environment (`UDBTL_JOB_KEY`, which
/// udrun sets), as its owner or root can read it.
pub(crate) fn job_key_of(pid: u32) -> Option<u32> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|b| *b == 0)
        .filter_map(|var| std::str::from_utf8(var).ok())
        .find_map(|var| var.strip_prefix("UDBTL_JOB_KEY="))
        .and_then(|key| key.parse().ok())
}

/// A reliable datagram without data, as udbtl's UDP provider carries it
/// (UD header, BTL header, reliability header), from process `src` of the
/// job `job_key`, with a valid checksum.
pub(crate) fn control_datagram(job_key: u32, src: u32, header: rel::Repr) -> Vec<u8> {
    let mut head = [0u8; datagram::HEADER_LEN];
    btl::Repr {
        tag: 0,
        job_key,
        reliable: true,
    }
    .emit(&mut btl::Packet::new_unchecked(&mut head[..]));
    let header = rel::Repr {
        src,
        flags: header.flags | FLAG_CHECKSUM,
        ..header
    };
    let mut ext = datagram::extension_mut(&mut head).expect("room for the headers");
    header.emit(&mut ext);
    datagram::fill_checksum(&mut head, &[]);
    let mut bytes = ud_header().to_vec();
    bytes.extend_from_slice(&head);
    bytes
}

/// The UD header udbtl's UDP provider puts first in every datagram, with
/// the default queue key.
pub(crate) fn ud_header() -> [u8; ud::HEADER_LEN] {
    ud::Repr {
        pkey: 0xffff,
        qkey: QKEY,
        imm: None,
    }
    .to_bytes()
}

/// Sends UDP datagrams from any address and port: a raw socket that writes
/// its own IP header.
pub(crate) struct Spoofer {
    socket: Socket,
}

impl Spoofer {
    /// The reason it cannot, where raw sockets are refused (no
    /// `CAP_NET_RAW`).
    pub(crate) fn open() -> Result<Self, String> {
        let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))
            .map_err(|err| format!("a raw socket needs CAP_NET_RAW (run as root): {err}"))?;
        socket
            .set_header_included_v4(true)
            .map_err(|err| format!("IP_HDRINCL: {err}"))?;
        Ok(Self { socket })
    }

    /// Sends `payload` in a UDP datagram from `from` to `to`. The kernel
    /// fills in the IP header's length, id and checksum; the UDP checksum
    /// is left out, as IPv4 allows.
    pub(crate) fn send(
        &self,
        from: SocketAddrV4,
        to: SocketAddrV4,
        payload: &[u8],
    ) -> io::Result<()> {
        let udp_len = u16::try_from(8 + payload.len()).expect("a short datagram");
        let mut packet = Vec::with_capacity(28 + payload.len());
        packet.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        packet.extend_from_slice(&from.ip().octets());
        packet.extend_from_slice(&to.ip().octets());
        packet.extend_from_slice(&from.port().to_be_bytes());
        packet.extend_from_slice(&to.port().to_be_bytes());
        packet.extend_from_slice(&udp_len.to_be_bytes());
        packet.extend_from_slice(&[0, 0]);
        packet.extend_from_slice(payload);
        let dest = SockAddr::from(SocketAddr::V4(SocketAddrV4::new(*to.ip(), 0)));
        self.socket.send_to(&packet, &dest).map(|_| ())
    }
}

/// What [`forge_resets_and_acks`] sent.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Forged {
    pub(crate) resets: usize,
    pub(crate) acks: usize,
}

/// From every socket of each rank to every socket of each other rank
/// (`ranks[i]` is rank `i`'s process id and sockets): resets at sequence
/// numbers `0..GUESSES` and acknowledgements of `1..=GUESSES`, each with a
/// valid checksum and all the credit a window can give. Before streams
/// started at random numbers, the first reset ended the job, and the
/// acknowledgements released data the peer never had.
pub(crate) fn forge_resets_and_acks(
    spoofer: &Spoofer,
    job_key: u32,
    ranks: &[(u32, Vec<SocketAddrV4>)],
) -> io::Result<Forged> {
    let mut forged = Forged::default();
    for (victim, (_, to_sockets)) in ranks.iter().enumerate() {
        for (rank, (proc_id, from_sockets)) in ranks.iter().enumerate() {
            if rank == victim {
                continue;
            }
            for guess in 0..GUESSES {
                let reset = rel::Repr {
                    seq: SeqNum(guess),
                    flags: FLAG_ACK_ONLY | FLAG_RESET,
                    ..rel::Repr::default()
                };
                let ack = rel::Repr {
                    ack: SeqNum(guess + 1),
                    credit: u16::MAX,
                    flags: FLAG_ACK_ONLY,
                    ..rel::Repr::default()
                };
                for (header, count) in [(reset, &mut forged.resets), (ack, &mut forged.acks)] {
                    let bytes = control_datagram(job_key, *proc_id, header);
                    for from in from_sockets {
                        for to in to_sockets {
                            spoofer.send(*from, *to, &bytes)?;
                            *count += 1;
                        }
                    }
                }
            }
        }
    }
    Ok(forged)
}

/// A UDP datagram seen on the wire: from where to where, and its payload.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) from: SocketAddrV4,
    pub(crate) to: SocketAddrV4,
    pub(crate) payload: Vec<u8>,
}

impl Seen {
    /// The job key in the BTL header of a udbtl datagram's payload, if it
    /// has one.
    pub(crate) fn job_key(&self) -> Option<u32> {
        let bytes = self.payload.get(ud::HEADER_LEN..)?;
        Some(btl::Packet::new_checked(bytes).ok()?.job_key())
    }

    /// The reliability header of a udbtl datagram's payload, if it has one.
    pub(crate) fn reliability_header(&self) -> Option<rel::Repr> {
        let at = ud::HEADER_LEN + btl::HEADER_LEN;
        let bytes = self.payload.get(at..)?;
        rel::Repr::parse(&rel::Packet::new_checked(bytes).ok()?).ok()
    }
}

/// A raw socket to send from anywhere and a packet socket to read the
/// wire, or the reason there cannot be (not root).
pub(crate) fn spoofer_and_sniffer() -> Result<(Spoofer, Sniffer), String> {
    Ok((Spoofer::open()?, Sniffer::open()?))
}

/// Reads every IPv4 packet the host's interfaces carry, loopback included
/// (an `AF_PACKET` socket: root only), and keeps the UDP ones.
pub(crate) struct Sniffer {
    socket: Socket,
}

impl Sniffer {
    /// The reason it cannot, where packet sockets are refused.
    pub(crate) fn open() -> Result<Self, String> {
        const ETH_P_IP: u16 = 0x0800;
        let protocol = Protocol::from(i32::from(ETH_P_IP.to_be()));
        let socket = Socket::new(Domain::PACKET, Type::DGRAM, Some(protocol))
            .map_err(|err| format!("a packet socket needs CAP_NET_RAW (run as root): {err}"))?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|err| format!("SO_RCVTIMEO: {err}"))?;
        // A job's burst must not overflow it before the test reads it.
        let _ = socket.set_recv_buffer_size(16 << 20);
        Ok(Self { socket })
    }

    /// The next UDP datagram, or `None` after 100 ms without one.
    pub(crate) fn next(&self) -> Option<Seen> {
        let mut buf = vec![0u8; 65_536];
        loop {
            let len = (&self.socket).read(&mut buf).ok()?;
            if let Some(seen) = parse_udp(&buf[..len]) {
                return Some(seen);
            }
        }
    }
}

/// The UDP datagram in an IPv4 packet, if that is what it is.
fn parse_udp(packet: &[u8]) -> Option<Seen> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    if packet.first()? >> 4 != 4 || *packet.get(9)? != 17 {
        return None;
    }
    let ip = |at: usize| -> Option<Ipv4Addr> {
        let b = packet.get(at..at + 4)?;
        Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    };
    let udp = packet.get(ihl..)?;
    let port = |at: usize| Some(u16::from_be_bytes([*udp.get(at)?, *udp.get(at + 1)?]));
    let len = usize::from(port(4)?);
    Some(Seen {
        from: SocketAddrV4::new(ip(12)?, port(0)?),
        to: SocketAddrV4::new(ip(16)?, port(2)?),
        payload: udp.get(8..len)?.to_vec(),
    })
}
