//! Hostile traffic on live sockets: while two modules exchange messages over
//! UDP loopback, an attacker sends into the receiver's socket
//!
//! * random bytes, 0 to 9000 long;
//! * genuine datagrams cut inside their headers;
//! * genuine headers with another job's key;
//! * genuine headers with sequence numbers far outside the window;
//! * replays of the sender's earlier datagrams, from the sender's own
//!   address (raw socket, root only);
//! * genuine datagrams from an address the receiver does not know;
//! * coalesced datagrams whose records declare more bytes than they hold.
//!
//! Every hostile datagram is dropped and counted, nothing panics, the
//! receiver's resources do not grow, and every real message arrives once,
//! in order, with its bytes intact.
//!
//! The attacker learns the job's headers by being sent to: the sender adds
//! an endpoint for the attacker's socket (as a peer that published an
//! address would be) and sends it a few messages, which the attacker keeps.
//!
//! A second test runs both modules with `auth`: then forged datagrams, even
//! ones with the next sequence number and a checksum or seal that a stranger
//! could compute, are refused as unauthenticated, and replays of genuine
//! datagrams are refused by their sequence numbers.

#![allow(clippy::unwrap_used, unsafe_code)]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;
use udbtl_fabric::{Context, Provider};
use udbtl_wire::datagram::Epochs;
use udbtl_wire::seal::{self, Protection, SealKey, Sender};
use udbtl_wire::{btl, coalesced, datagram, modex, rel, ud};

type Heard = Arc<Mutex<Vec<(Option<EndpointId>, Vec<u8>)>>>;

/// Asserts that `x` and `y`, set up in ways that cannot talk, refuse each
/// other's address: neither makes an endpoint for the other.
fn assert_refuse_to_pair(x: &mut Component<UdpProvider>, y: &mut Component<UdpProvider>) {
    assert_eq!(
        x.add_procs(&[Some(&y.modex())]).unwrap()[0].endpoints[0],
        None
    );
    assert_eq!(
        y.add_procs(&[Some(&x.modex())]).unwrap()[0].endpoints[0],
        None
    );
}

fn component() -> Component<UdpProvider> {
    component_with(false)
}

/// A component on UDP loopback, authenticating its datagrams if `auth`.
fn component_with(auth: bool) -> Component<UdpProvider> {
    component_keyed(auth, None)
}

/// A component on UDP loopback, authenticating its datagrams if `auth`, with
/// keys derived from `job_secret` if given.
fn component_keyed(auth: bool, job_secret: Option<[u8; 32]>) -> Component<UdpProvider> {
    let mut params = Params::load_from(
        &BtlConfig {
            rd_num: Some(256),
            sd_num: Some(64),
            ..BtlConfig::default()
        },
        |name| (auth && name == "UDBTL_AUTH").then(|| "1".to_string()),
    )
    .unwrap();
    params.auth_secret = job_secret.map(datagram::AuthKey);
    Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
}

/// A sender A and a receiver B connected to each other over UDP loopback;
/// B's callback records what it hears on [`Tag::PML`].
struct Pair {
    a: Component<UdpProvider>,
    b: Component<UdpProvider>,
    ab: EndpointId,
    ba: EndpointId,
    heard: Heard,
}

impl Pair {
    fn new(auth: bool) -> Self {
        let (mut a, mut b) = (component_with(auth), component_with(auth));
        let (ab, ba, heard) = Self::connect(&mut a, &mut b);
        Self {
            a,
            b,
            ab,
            ba,
            heard,
        }
    }

    /// Connects `a` and `b` both ways and records what `b` hears.
    fn connect(
        a: &mut Component<UdpProvider>,
        b: &mut Component<UdpProvider>,
    ) -> (EndpointId, EndpointId, Heard) {
        let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
        let ba = b.add_procs(&[Some(&a.modex())]).unwrap()[0].endpoints[0].unwrap();
        let heard: Heard = Arc::default();
        let sink = heard.clone();
        b.modules_mut()[0].register(
            Tag::PML,
            Box::new(move |ev: &RecvEvent<'_>| {
                sink.lock()
                    .unwrap()
                    .push((ev.endpoint, ev.payload.to_vec()));
            }),
        );
        (ab, ba, heard)
    }
}

/// Message `i` of the real traffic: its index, then bytes derived from it.
fn message(i: u32) -> Vec<u8> {
    let mut bytes = i.to_le_bytes().to_vec();
    bytes.extend((0..(i % 200)).map(|k| (k * 7 + i) as u8));
    bytes
}

/// Progresses every component in `btls` for `how_long`: what is still in
/// the sockets gets read.
fn progress_for(btls: &mut [&mut Component<UdpProvider>], how_long: Duration) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        for btl in btls.iter_mut() {
            btl.progress();
        }
    }
}

/// Asserts that `heard` is messages `0..n`, each once, in order and intact,
/// all from endpoint `from`.
fn assert_heard_in_order(heard: &[(Option<EndpointId>, Vec<u8>)], n: u32, from: EndpointId) {
    assert_eq!(heard.len(), n as usize, "messages heard");
    for (i, (sender, bytes)) in heard.iter().enumerate() {
        assert_eq!(*sender, Some(from), "message {i}");
        assert_eq!(bytes, &message(i as u32), "message {i}");
    }
}

/// The UDP port of a module's receiving queue pair.
fn receive_port<P: Provider>(btl: &Component<P>) -> u16 {
    btl.modules()[0].address().qpns[0] as u16
}

/// The loopback address `from`'s datagrams to `to` leave from: the one `to`
/// knows it by ([`sending_qp`]).
fn sending_addr<P: Provider>(from: &Component<P>, to: &Component<P>) -> SocketAddrV4 {
    let qpns = from.modules()[0].address().qpns;
    let port = qpns[sending_qp(u32::from(receive_port(to)))];
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, port as u16)
}

/// Offset of the BTL header in a datagram as it travels (after the UD
/// header the udp provider puts in front).
const BTL_AT: usize = ud::HEADER_LEN;

/// Rewrites the checksum of a captured datagram after a change.
fn reseal(d: &mut [u8]) {
    datagram::fill_checksum(&mut d[BTL_AT..], &[]);
}

/// Changes a captured datagram's reliability extension, then reseals it.
fn edit_extension(d: &mut [u8], change: impl FnOnce(&mut rel::Repr)) {
    let mut repr = rel::Repr::parse(&datagram::extension(&d[BTL_AT..]).unwrap()).unwrap();
    change(&mut repr);
    repr.emit(&mut datagram::extension_mut(&mut d[BTL_AT..]).unwrap());
    reseal(d);
}

/// A datagram with a forged source address, through a raw socket: needs
/// CAP_NET_RAW. `None` when the socket cannot be had.
struct Spoofer(libc::c_int);

impl Spoofer {
    fn new() -> Option<Self> {
        // SAFETY: plain socket(2) call; the descriptor is owned by the
        // returned value and closed in Drop.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        (fd >= 0).then_some(Self(fd))
    }

    /// Sends `payload` as a UDP datagram from `from` to `to` (IPv4, no UDP
    /// checksum, which IPv4 allows).
    fn send(&self, from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) {
        let udp_len = 8 + payload.len();
        let total = 20 + udp_len;
        let mut packet = Vec::with_capacity(total);
        packet.extend_from_slice(&[0x45, 0]);
        packet.extend_from_slice(&(total as u16).to_be_bytes());
        packet.extend_from_slice(&[0, 0, 0, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
        packet.extend_from_slice(&from.ip().octets());
        packet.extend_from_slice(&to.ip().octets());
        packet.extend_from_slice(&from.port().to_be_bytes());
        packet.extend_from_slice(&to.port().to_be_bytes());
        packet.extend_from_slice(&(udp_len as u16).to_be_bytes());
        packet.extend_from_slice(&[0, 0]);
        packet.extend_from_slice(payload);
        let dest = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(to.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `packet` and `dest` are live for the call and their
        // lengths are the ones passed.
        let sent = unsafe {
            libc::sendto(
                self.0,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&raw const dest).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        assert_eq!(sent, packet.len() as isize, "raw send");
    }
}

impl Drop for Spoofer {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// What the receiver counted as dropped, everywhere a datagram can be.
fn drops<P: Provider>(btl: &Component<P>) -> [u64; 10] {
    let module = &btl.modules()[0];
    let s = module.stats();
    let r = module.reliability_stats().unwrap();
    let f = module.with_context(|c| c.stats());
    [
        f.rx_malformed + f.rx_bad_qkey + f.rx_too_long,
        s.recv_malformed,
        s.recv_bad_job_key,
        s.recv_bad_checksum,
        s.recv_unknown_peer,
        r.duplicates,
        r.out_of_window,
        s.recv_orphan_pieces,
        s.recv_unauthenticated,
        s.recv_replayed,
    ]
}

mod plain;
mod sealed;
