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

#[test]
fn hostile_datagrams_are_dropped_and_counted_while_real_traffic_flows() {
    let Pair {
        mut a,
        mut b,
        ab,
        ba,
        heard,
    } = Pair::new(false);

    // The attacker: a plain socket that A is made to send to.
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    attacker
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut fake = modex::parse_blob(&b.modex()).unwrap();
    fake[0].qpns = [u32::from(attacker.local_addr().unwrap().port()); 4];
    fake[0].proc_id ^= 0x5a5a_5a5a;
    let fake_blob = modex::emit_blob(&fake).unwrap();
    let a_to_attacker = a.add_procs(&[Some(&fake_blob)]).unwrap()[0].endpoints[0].unwrap();
    let mut captured: Vec<(Vec<u8>, SocketAddr)> = Vec::new();
    for i in 0..4u32 {
        a.modules_mut()[0]
            .send_message(a_to_attacker, Tag::PML, &message(i))
            .unwrap();
        a.progress();
        let mut buf = vec![0u8; 70_000];
        let (n, from) = attacker.recv_from(&mut buf).unwrap();
        buf.truncate(n);
        captured.push((buf, from));
    }
    let (sample, _) = captured[0].clone();
    assert!(sample.len() >= BTL_AT + datagram::HEADER_LEN);
    // Where B hears A from (A sent to the attacker from another queue pair).
    let a_addr = sending_addr(&a, &b);
    let b_port = receive_port(&b);
    let b_addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, b_port);

    let before_resources = b.modules()[0].with_context(|c| c.resources());
    let before = drops(&b);
    let mut rng = fastrand::Rng::with_seed(61);
    let mut hostile = [0u64; 7];
    let spoofer = Spoofer::new();
    if spoofer.is_none() {
        println!("no raw socket (not root): replays from the sender's address are not tried");
    }

    let n = 3000u32;
    let mut sent = 0u32;
    let deadline = Instant::now() + Duration::from_secs(60);
    while heard.lock().unwrap().len() < n as usize {
        assert!(Instant::now() < deadline, "timed out");
        if sent < n
            && a.modules_mut()[0]
                .send_message(ab, Tag::PML, &message(sent))
                .is_ok()
        {
            sent += 1;
        }
        // One hostile datagram of each kind per round, while the real
        // traffic runs.
        if sent < n {
            let random: Vec<u8> = (0..rng.usize(0..=9000)).map(|_| rng.u8(..)).collect();
            attacker.send_to(&random, b_addr).unwrap();
            hostile[0] += 1;

            let cut = rng.usize(0..BTL_AT + datagram::HEADER_LEN);
            attacker.send_to(&sample[..cut], b_addr).unwrap();
            hostile[1] += 1;

            let mut wrong_key = sample.clone();
            let mut header = btl::Packet::new_unchecked(&mut wrong_key[BTL_AT..]);
            header.set_job_key(header.job_key() ^ (1 + rng.u32(..u32::MAX - 1)));
            reseal(&mut wrong_key);
            attacker.send_to(&wrong_key, b_addr).unwrap();
            hostile[2] += 1;

            let mut far = sample.clone();
            let jump = (1 << 20) + rng.u32(0..1 << 20);
            edit_extension(&mut far, |r| r.seq += jump);
            // From the sender's address if it can be forged, else from the
            // attacker's (then it counts as an unknown source).
            match &spoofer {
                Some(s) => s.send(a_addr, b_addr, &far),
                None => {
                    attacker.send_to(&far, b_addr).unwrap();
                }
            }
            hostile[3] += 1;

            attacker.send_to(&sample, b_addr).unwrap();
            hostile[4] += 1;

            let mut oversized = sample.clone();
            oversized.truncate(BTL_AT + datagram::HEADER_LEN);
            let mut list = vec![0u8; 64];
            let end = coalesced::append(&mut list, 0, Tag::PML.0, &[1, 2, 3]).unwrap();
            list.truncate(end);
            // The record says 60 000 bytes follow; three do.
            list[2..4].copy_from_slice(&60_000u16.to_le_bytes());
            oversized.extend_from_slice(&list);
            edit_extension(&mut oversized, |r| r.flags |= rel::FLAG_COALESCED);
            attacker.send_to(&oversized, b_addr).unwrap();
            hostile[5] += 1;

            // Replays come once the real stream is well past their numbers.
            if let (Some(s), true) = (&spoofer, sent > 100) {
                let (replay, _) = &captured[rng.usize(0..captured.len())];
                s.send(a_addr, b_addr, replay);
                hostile[6] += 1;
            }
        }
        a.progress();
        b.progress();
    }
    // Drain: whatever hostile datagrams are still in the socket get read.
    progress_for(&mut [&mut a, &mut b], Duration::from_millis(300));

    // Real traffic: every message once, in order, intact.
    let heard = heard.lock().unwrap();
    assert_heard_in_order(&heard, n, ba);
    // Every hostile datagram dropped and counted somewhere.
    let after = drops(&b);
    let counted: u64 = after.iter().zip(before).map(|(a, b)| a - b).sum();
    let tried: u64 = hostile.iter().sum();
    println!(
        "hostile datagrams tried {tried} ({hostile:?}: random, cut, job key, far, unknown source, \
         oversized records, replays); counted {counted}: {:?} (fabric, malformed, job key, \
         checksum, unknown peer, duplicates, out of window, orphans, unauthenticated)",
        after
            .iter()
            .zip(before)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>()
    );
    assert!(counted >= tried, "{counted} counted of {tried} tried");
    let delta = |i: usize| after[i] - before[i];
    assert!(delta(0) > 0, "random bytes die in the fabric");
    assert!(delta(2) >= hostile[2], "wrong job keys counted");
    assert!(delta(4) >= hostile[4], "unknown sources counted");
    assert!(delta(1) > 0, "cut headers counted as malformed");
    if spoofer.is_some() {
        assert!(delta(6) >= hostile[3], "far sequence numbers counted");
        assert!(delta(5) >= hostile[6], "replays counted as duplicates");
    }
    // Nothing grew: the fabric holds what it held.
    assert_eq!(
        b.modules()[0].with_context(|c| c.resources()),
        before_resources
    );
    drop(heard);
    a.finalize().unwrap();
    b.finalize().unwrap();
}

/// Rewrites a captured datagram's extension with `change`, then seals it as
/// a stranger could: with a CRC, or sealed under a key of its own for the
/// receiving queue pair and job key mask given, with a packet number ahead
/// of the real ones.
fn forge(
    d: &[u8],
    change: impl FnOnce(&mut rel::Repr),
    key: Option<(&datagram::AuthKey, u32, u32)>,
) -> Vec<u8> {
    let mut d = d.to_vec();
    let mut repr = rel::Repr::parse(&datagram::extension(&d[BTL_AT..]).unwrap()).unwrap();
    change(&mut repr);
    repr.flags &= !(rel::FLAG_CHECKSUM | rel::FLAG_SEALED);
    repr.flags |= if key.is_some() {
        rel::FLAG_SEALED
    } else {
        rel::FLAG_CHECKSUM
    };
    repr.emit(&mut datagram::extension_mut(&mut d[BTL_AT..]).unwrap());
    match key {
        Some((key, qpn, mask)) => {
            let pn = seal::packet_number(&d[BTL_AT..]).unwrap() + 1000;
            let key = SealKey::derive(
                key,
                qpn,
                sender_of(&d[BTL_AT..], mask),
                seal::phase_of(pn),
                Protection::Authenticate,
            );
            seal::seal(&mut d[BTL_AT..], &key, pn, Epochs::default()).unwrap();
        }
        None => reseal(&mut d),
    }
    d
}

/// Who the datagram `d` (from its BTL header on) says it is from, to a
/// receiver whose job key mask is `mask`.
fn sender_of(d: &[u8], mask: u32) -> Sender {
    Sender {
        job_key: btl::Packet::new_checked(d).unwrap().job_key() ^ mask,
        id: datagram::extension(d).unwrap().src(),
    }
}

/// `true` if `d`, a sealed datagram as captured, opens under the keys of
/// the module whose key is `receiver`, receiving queue pair `qpn` and job
/// key mask `mask`.
fn opens_under(d: &[u8], receiver: &datagram::AuthKey, qpn: u32, mask: u32) -> bool {
    let mut d = d[BTL_AT..].to_vec();
    let pn = seal::packet_number(&d).unwrap();
    let key = SealKey::derive(
        receiver,
        qpn,
        sender_of(&d, mask),
        seal::phase_of(pn),
        Protection::Authenticate,
    );
    seal::open(&mut d, &key, Epochs::default())
}

#[test]
fn with_auth_a_stranger_can_neither_inject_nor_replay() {
    let mut a = component_with(true);
    let mut b = component_with(true);
    let a_published = modex::parse_blob(&a.modex()).unwrap();
    let b_published = modex::parse_blob(&b.modex()).unwrap();
    let (modex::Auth::Key(a_key), modex::Auth::Key(b_key)) =
        (a_published[0].auth, b_published[0].auth)
    else {
        panic!("modules with auth publish their keys");
    };
    assert_ne!(a_key, b_key, "every module draws its own key");
    let b_mask = b_published[0].admission.job_key_mask;

    // Modules set differently cannot pair, in either direction.
    let mut plain = component();
    assert_refuse_to_pair(&mut plain, &mut b);
    plain.finalize().unwrap();

    let (ab, ba, heard) = Pair::connect(&mut a, &mut b);

    // What an on-path observer captures of A→B: A sends the first messages
    // of the real stream to a tap that published B's key and process id, so
    // they leave with the numbers, key and bytes of the real ones.
    let tap = UdpSocket::bind("127.0.0.1:0").unwrap();
    tap.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut tapped = b_published.clone();
    tapped[0].qpns = [u32::from(tap.local_addr().unwrap().port()); 4];
    let a_to_tap = a
        .add_procs(&[Some(&modex::emit_blob(&tapped).unwrap())])
        .unwrap()[0]
        .endpoints[0]
        .unwrap();
    let mut captured: Vec<Vec<u8>> = Vec::new();
    for i in 0..4u32 {
        a.modules_mut()[0]
            .send_message(a_to_tap, Tag::PML, &message(i))
            .unwrap();
        a.progress();
        let mut buf = vec![0u8; 70_000];
        let (n, _) = tap.recv_from(&mut buf).unwrap();
        buf.truncate(n);
        // The first datagrams of a stream: its numbers have not wrapped
        // (unless it started within four of the wrap: once in 2^30 runs).
        assert!(
            opens_under(&buf, &b_key, tapped[0].qpns[0], b_mask),
            "sealed under B's key for the tap"
        );
        // The tap copied B's key but not its queue pair: what A sealed for
        // it does not open at B.
        assert!(!opens_under(&buf, &b_key, b_published[0].qpns[0], b_mask));
        captured.push(buf);
    }
    // Where B hears A from (A sent to the tap from another queue pair).
    let a_addr = sending_addr(&a, &b);
    let b_addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, receive_port(&b));
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    let spoofer = Spoofer::new();
    if spoofer.is_none() {
        println!("no raw socket (not root): forgeries and replays come from a stranger's address");
    }
    let send_hostile = |d: &[u8]| match &spoofer {
        Some(s) => s.send(a_addr, b_addr, d),
        None => {
            attacker.send_to(d, b_addr).unwrap();
        }
    };

    let before = drops(&b);
    let before_resources = b.modules()[0].with_context(|c| c.resources());
    let mut rng = fastrand::Rng::with_seed(67);
    let b_qpn = b_published[0].qpns[0];
    let stranger_key = datagram::AuthKey([0x42; 32]);
    let (mut forged, mut replayed) = (0u64, 0u64);
    let n = 3000u32;
    let mut sent = 0u32;
    let deadline = Instant::now() + Duration::from_secs(60);
    while heard.lock().unwrap().len() < n as usize {
        assert!(Instant::now() < deadline, "timed out");
        if sent < n
            && a.modules_mut()[0]
                .send_message(ab, Tag::PML, &message(sent))
                .is_ok()
        {
            sent += 1;
        }
        if sent < n {
            // Forgeries that claim the next numbers of the real stream, so
            // that only the seal stands in their way.
            let sample = &captured[rng.usize(0..captured.len())];
            let ahead = sent + rng.u32(0..4);
            let next = |r: &mut rel::Repr| r.seq += ahead;
            send_hostile(&forge(sample, next, None));
            send_hostile(&forge(sample, next, Some((&stranger_key, b_qpn, b_mask))));
            let mut flipped = sample.clone();
            // In the payload: a flip in the headers may be caught before
            // the seal is looked at (a malformed header, another job's key).
            let at = rng.usize(BTL_AT + datagram::HEADER_LEN..flipped.len());
            flipped[at] ^= 1 << rng.u32(0..8);
            send_hostile(&flipped);
            forged += 3;
            // Genuine datagrams again, once the stream is past them.
            if sent > 100 {
                send_hostile(&captured[rng.usize(0..captured.len())]);
                replayed += 1;
            }
        }
        a.progress();
        b.progress();
    }
    progress_for(&mut [&mut a, &mut b], Duration::from_millis(300));

    let heard = heard.lock().unwrap();
    assert_heard_in_order(&heard, n, ba);
    let after = drops(&b);
    let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    println!(
        "with auth: forged {forged}, replayed {replayed}; counted {delta:?} (fabric, malformed, \
         job key, checksum, unknown peer, duplicates, out of window, orphans, unauthenticated, \
         replayed)"
    );
    // A forgery whose packet number is behind the window is refused
    // before its tag is checked, and counted with the replays.
    assert!(
        delta[8] + delta[9] >= forged,
        "every forgery refused as unauthenticated or replayed"
    );
    assert_eq!(delta[3], 0, "no checksum is checked where a seal is due");
    if spoofer.is_some() {
        // The captured datagrams went to the tap, which A numbers apart
        // from B: under B's key they are refused by their packet numbers,
        // or as sealed under another phase's key.
        assert!(
            delta[8] + delta[9] >= forged + replayed,
            "replays refused by their seal"
        );
    } else {
        assert!(delta[4] >= replayed, "replays from a stranger refused");
    }
    assert_eq!(
        b.modules()[0].with_context(|c| c.resources()),
        before_resources
    );
    drop(heard);
    a.finalize().unwrap();
    b.finalize().unwrap();
}

/// With a job secret, every module's key derives from it and the module's
/// address: the published blob (version 3) holds no key, the job's modules
/// talk, and a process that read the blobs but holds another secret can pair
/// but cannot inject: everything it sends is refused as unauthenticated.
/// Modules that derive keys and modules that publish them do not pair.
#[test]
fn with_a_job_secret_no_key_is_published_and_a_stranger_cannot_inject() {
    const JOB: [u8; 32] = [0x17; 32];
    let (mut a, mut b) = (
        component_keyed(true, Some(JOB)),
        component_keyed(true, Some(JOB)),
    );
    let blob = b.modex();
    assert_eq!(blob[2], modex::VERSION_DERIVED_KEY);
    assert_eq!(
        blob.len(),
        modex::PREAMBLE_LEN + modex::ENTRY_LEN,
        "no key bytes"
    );
    assert_eq!(
        modex::parse_blob(&blob).unwrap()[0].auth,
        modex::Auth::Derived
    );

    // Published keys and derived keys do not mix, in either direction.
    let mut published = component_with(true);
    assert_refuse_to_pair(&mut published, &mut b);
    published.finalize().unwrap();

    let (ab, ba, heard) = Pair::connect(&mut a, &mut b);
    let mut stranger = component_keyed(true, Some([0x18; 32]));
    let to_b = stranger.add_procs(&[Some(&blob)]).unwrap()[0].endpoints[0]
        .expect("a stranger with the blob pairs: the seal is what stops it");
    let before = drops(&b);
    let n = 500u32;
    let (mut sent, mut forged) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while heard.lock().unwrap().len() < n as usize {
        assert!(Instant::now() < deadline, "timed out");
        if sent < n
            && a.modules_mut()[0]
                .send_message(ab, Tag::PML, &message(sent))
                .is_ok()
        {
            sent += 1;
        }
        if forged < n
            && stranger.modules_mut()[0]
                .send_message(to_b, Tag::PML, &message(forged))
                .is_ok()
        {
            forged += 1;
        }
        a.progress();
        b.progress();
        stranger.progress();
    }
    progress_for(
        &mut [&mut a, &mut b, &mut stranger],
        Duration::from_millis(200),
    );
    // The stranger falls silent, and B takes in what it sent last.
    progress_for(&mut [&mut a, &mut b], Duration::from_millis(50));
    // Only the job's messages arrive.
    let heard = heard.lock().unwrap();
    assert_heard_in_order(&heard, n, ba);
    let delta: Vec<u64> = drops(&b).iter().zip(before).map(|(x, y)| x - y).collect();
    // Unacknowledged, the stranger sends its first window and then repeats
    // itself on timeouts: every datagram it sent went to B.
    let stranger_datagrams = stranger.modules()[0]
        .with_context(|c| c.stats())
        .tx_datagrams;
    println!(
        "derived keys: the stranger queued {forged} messages in {stranger_datagrams} datagrams; \
         B counted {delta:?}"
    );
    assert!(stranger_datagrams > 0);
    assert_eq!(
        delta[8], stranger_datagrams,
        "every stranger datagram refused"
    );
    assert_eq!(delta[3], 0, "no checksum is checked where a seal is due");
    drop(heard);
    for btl in [a, b, stranger] {
        btl.finalize().unwrap();
    }
}
