//! The `udp` provider against real sockets: every verbs operation, the UD
//! drop rules, and round trips between two real processes over IPv4 and IPv6
//! loopback.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod datagrams;
mod rules;
mod trains;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use common::*;
use udbtl_fabric::udp::{UdpConfig, UdpContext, UdpProvider};
use udbtl_fabric::*;

const WAIT: Duration = Duration::from_secs(5);

fn provider(ipv6: bool) -> UdpProvider {
    UdpProvider::new(UdpConfig {
        ipv6,
        ..UdpConfig::default()
    })
}

fn open(ipv6: bool) -> UdpContext {
    let provider = provider(ipv6);
    let devices = provider.devices().unwrap();
    assert!(!devices.is_empty(), "no loopback device");
    provider.open(&devices[0].name).unwrap()
}

fn node(ep: &Endpoint<UdpContext>) -> NodeAddr {
    NodeAddr::Ip(ep.ctx.ip())
}

/// Sends 40 datagrams of 1400 B (the last 100 B), each filled with its
/// index, from `a` to `b` in one post.
fn send_forty(a: &mut Endpoint<UdpContext>, b: &Endpoint<UdpContext>) {
    send_forty_with_qkey(a, b, QKEY);
}

/// [`send_forty`] presenting `qkey`.
fn send_forty_with_qkey(a: &mut Endpoint<UdpContext>, b: &Endpoint<UdpContext>, qkey: u32) {
    let ah = a.ah(node(b));
    post_forty(a, ah, b.qp.qp_num, qkey, 100, 40);
    assert_eq!(a.poll_for(40, WAIT).len(), 40);
}

/// Sends forty datagrams from `a` to `b` and checks that all forty arrive,
/// in order.
fn assert_forty_arrive(a: &mut Endpoint<UdpContext>, b: &mut Endpoint<UdpContext>) {
    send_forty(a, b);
    let got = b.poll_for(40, WAIT);
    assert_eq!(got.len(), 40);
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(b.payload(wc)[0], i as u8);
    }
}

/// A process outside the job, sending from its own UDP socket: single
/// datagrams, or trains of `segment`-byte datagrams with UDP GSO (quinn-udp),
/// which a receiver with UDP GRO may read as one train.
struct Stranger {
    socket: UdpSocket,
    gso: quinn_udp::UdpSocketState,
}

impl Stranger {
    fn new() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gso = quinn_udp::UdpSocketState::new((&socket).into()).unwrap();
        Self { socket, gso }
    }

    /// Sends `contents` as datagrams of `segment` bytes (the last may be
    /// shorter) in one GSO send; returns how many datagrams that is.
    fn send_train(&self, dest: SocketAddr, contents: &[u8], segment: usize) -> u64 {
        let train = quinn_udp::Transmit {
            destination: dest,
            ecn: None,
            contents,
            segment_size: Some(segment),
            src_ip: None,
        };
        self.gso.try_send((&self.socket).into(), &train).unwrap();
        contents.len().div_ceil(segment) as u64
    }
}

/// A sender with 4 receive buffers and a receiver with `receive_slots`, on
/// a loopback provider whose datagrams carry 1400 B, with GSO and GRO as
/// asked: where trains form.
fn train_pair(
    gso: bool,
    gro: bool,
    receive_slots: usize,
) -> (Endpoint<UdpContext>, Endpoint<UdpContext>) {
    let p = UdpProvider::new(UdpConfig {
        gso,
        gro,
        mtu: Some(1400),
        ..UdpConfig::default()
    });
    let dev = p.devices().unwrap()[0].name.clone();
    let a = Endpoint::new(p.open(&dev).unwrap(), 4, QKEY);
    let b = Endpoint::new(p.open(&dev).unwrap(), receive_slots, QKEY);
    (a, b)
}

// ----- two real processes --------------------------------------------------

/// Round trips between this process and a child echo process.
fn two_process_round_trip(ipv6: bool) {
    let mut parent = Endpoint::new(open(ipv6), 64, QKEY);
    let mut child = spawn_child(
        "echo_child",
        &[
            ("UDBTL_TEST_IPV6", ipv6.to_string()),
            ("UDBTL_TEST_PEER_QPN", parent.qp.qp_num.to_string()),
        ],
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let child_qpn: u32 = loop {
        let line = lines.next().expect("child exited early").unwrap();
        if let Some(qpn) = line.strip_prefix("QPN ") {
            break qpn.trim().parse().unwrap();
        }
    };
    let ah = parent.ah(node(&parent));
    let rounds = 200u32;
    for round in 0..rounds {
        let payload: Vec<u8> = (0..(round as usize * 37) % 2000 + 1)
            .map(|i| (i as u32 ^ round) as u8)
            .collect();
        // Retry: UD may lose a datagram even on loopback (socket buffer overrun).
        let mut echoed = None;
        for _attempt in 0..20 {
            parent
                .send(ah, child_qpn, QKEY, &payload, u64::from(round))
                .unwrap();
            let got = parent.poll_for(2, Duration::from_millis(500));
            if let Some(wc) = got.iter().find(|wc| wc.opcode == WcOpcode::Recv) {
                assert_eq!(wc.src.unwrap().qpn, child_qpn);
                echoed = Some(parent.payload(wc));
                parent.post_slot(wc.wr_id as usize);
                break;
            }
        }
        assert_eq!(echoed.as_deref(), Some(&payload[..]), "round {round}");
    }
    parent.send(ah, child_qpn, QKEY, b"quit", 9999).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn round_trips_between_two_processes_ipv4() {
    two_process_round_trip(false);
}

#[test]
fn round_trips_between_two_processes_ipv6() {
    two_process_round_trip(true);
}

#[test]
#[ignore = "child process of the two-process tests"]
fn echo_child() {
    let ipv6: bool = std::env::var("UDBTL_TEST_IPV6").unwrap().parse().unwrap();
    let peer_qpn: u32 = std::env::var("UDBTL_TEST_PEER_QPN")
        .unwrap()
        .parse()
        .unwrap();
    let mut ep = Endpoint::new(open(ipv6), 64, QKEY);
    let ah = ep.ah(node(&ep));
    println!("QPN {}", ep.qp.qp_num);
    std::io::stdout().flush().unwrap();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let n = ep.ctx.poll_cq(ep.cq, &mut wcs).unwrap();
        for wc in &wcs[..n] {
            if wc.opcode != WcOpcode::Recv || wc.status != WcStatus::Success {
                continue;
            }
            let payload = ep.payload(wc);
            ep.post_slot(wc.wr_id as usize);
            if payload == b"quit" {
                return;
            }
            assert_eq!(wc.src.unwrap().qpn, peer_qpn);
            assert_eq!(
                wc.src.unwrap().node,
                NodeAddr::Ip(if ipv6 {
                    IpAddr::V6(Ipv6Addr::LOCALHOST)
                } else {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                })
            );
            ep.send(ah, peer_qpn, QKEY, &payload, wc.wr_id).unwrap();
        }
    }
    panic!("echo child timed out");
}
