//! Modules on ports that cut long datagrams into pieces (the udp
//! provider's `segment`, on loopback standing in for an MTU-1500 path
//! through `UdpConfig::segment_wire`). Between two such modules messages
//! travel in datagrams of 16 packets and arrive whole and in order. A
//! module that cuts and one that does not (a host with larger packets,
//! here loopback's) settle on datagrams of one packet of the smaller size,
//! which both can take, and still deliver every message. With jumbo-frame
//! pieces the receiving port reads a datagram's pieces straight into its
//! posted buffer, between the acknowledgements and short datagrams that it
//! recognises and puts together the usual way.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::Context;
use udbtl_fabric::udp::{UdpConfig, UdpProvider};

/// The UDP payload of one packet on an MTU-1500 IPv4 path.
const WIRE: usize = 1472;
/// The UDP payload of one packet on an MTU-9000 IPv4 path.
const JUMBO_WIRE: usize = 8972;
/// Bytes of BTL header in front of a reliable, checksummed payload.
const HEADER: usize = 40;

/// A component on UDP loopback whose port cuts datagrams into pieces of
/// [`WIRE`] bytes if `cut`, and takes loopback's 64 KiB datagrams whole
/// otherwise.
fn component(cut: bool) -> Component<UdpProvider> {
    component_for(cut.then_some(WIRE))
}

/// A component on UDP loopback whose port cuts datagrams into pieces of
/// `wire` bytes, if set.
fn component_for(wire: Option<usize>) -> Component<UdpProvider> {
    let params = Params::load_from(
        &BtlConfig {
            rd_num: Some(256),
            ..BtlConfig::default()
        },
        |_| None,
    )
    .unwrap();
    let config = UdpConfig {
        segment_wire: wire,
        ..udp_config(&params)
    };
    Component::init(UdpProvider::new(config), params).unwrap()
}

/// `len` bytes that differ from message to message.
fn message(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 7) as u8).collect()
}

/// Sends messages of every length in `lens` from `a` to `b`, in order, and
/// returns what `b` delivered.
fn exchange(
    a: &mut Component<UdpProvider>,
    b: &mut Component<UdpProvider>,
    lens: &[usize],
) -> Vec<Vec<u8>> {
    let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
    b.add_procs(&[Some(&a.modex())]).unwrap();
    let heard: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = heard.clone();
    b.modules_mut()[0].register(
        Tag::PML,
        Box::new(move |ev: &RecvEvent<'_>| sink.lock().unwrap().push(ev.payload.to_vec())),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = 0;
    while heard.lock().unwrap().len() < lens.len() {
        assert!(Instant::now() < deadline, "timed out after {sent} sends");
        if sent < lens.len()
            && a.modules_mut()[0]
                .send_message(ab, Tag::PML, &message(lens[sent], sent))
                .is_ok()
        {
            sent += 1;
        }
        a.progress();
        b.progress();
    }
    heard.lock().unwrap().clone()
}

const LENS: [usize; 8] = [1, 1000, 1500, 5000, 23_000, 23_400, 100_000, 250_000];

fn assert_all_arrived(heard: &[Vec<u8>]) {
    assert_eq!(heard.len(), LENS.len());
    for (i, (got, &len)) in heard.iter().zip(&LENS).enumerate() {
        assert!(*got == message(len, i), "message {i} ({len} bytes) differs");
    }
}

#[test]
fn modules_that_both_cut_send_datagrams_of_sixteen_packets() {
    let (mut a, mut b) = (component(true), component(true));
    let heard = exchange(&mut a, &mut b, &LENS);
    assert_all_arrived(&heard);
    let datagram = 16 * (WIRE - udbtl_wire::segment::HEADER_LEN) - udbtl_wire::ud::HEADER_LEN;
    assert_eq!(a.modules()[0].limits().eager_limit, datagram - HEADER);
    let sent = a.modules()[0].with_context(|c| c.stats());
    let received = b.modules()[0].with_context(|c| c.stats());
    assert!(sent.tx_segmented > 0, "nothing was cut: {sent:?}");
    assert_eq!(received.rx_incomplete, 0, "{received:?}");
}

#[test]
fn modules_on_jumbo_frames_cut_datagrams_of_seven_packets_and_read_them_in_place() {
    let (mut a, mut b) = (
        component_for(Some(JUMBO_WIRE)),
        component_for(Some(JUMBO_WIRE)),
    );
    let heard = exchange(&mut a, &mut b, &LENS);
    assert_all_arrived(&heard);
    let datagram = 7 * (JUMBO_WIRE - udbtl_wire::segment::HEADER_LEN) - udbtl_wire::ud::HEADER_LEN;
    assert_eq!(b.modules()[0].limits().frag_limit, datagram - HEADER);
    let sent = a.modules()[0].with_context(|c| c.stats());
    let received = b.modules()[0].with_context(|c| c.stats());
    assert!(sent.tx_segmented > 0, "nothing was cut: {sent:?}");
    assert!(
        received.rx_in_place > 0,
        "nothing was read in place: {received:?}"
    );
    assert_eq!(received.rx_incomplete, 0, "{received:?}");
}

#[test]
fn a_module_that_cuts_and_one_that_does_not_send_single_packets() {
    let (mut a, mut c) = (component(true), component(false));
    let one_packet = WIRE - udbtl_wire::ud::HEADER_LEN - HEADER;
    let heard = exchange(&mut c, &mut a, &LENS);
    assert_all_arrived(&heard);
    for side in [&a, &c] {
        let module = &side.modules()[0];
        assert_eq!(module.limits().eager_limit, one_packet);
        assert_eq!(module.with_context(|ctx| ctx.stats()).tx_segmented, 0);
    }
}
