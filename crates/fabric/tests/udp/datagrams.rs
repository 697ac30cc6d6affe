//! Discovery, MTU, single datagrams and what the receiving side drops or
//! counts.

use super::*;

#[test]
fn discovery_offers_loopback_with_the_largest_datagram() {
    for ipv6 in [false, true] {
        let ctx = open(ipv6);
        let port = ctx.query_port(1).unwrap();
        assert_eq!(port.state, PortState::Active);
        assert_eq!(
            port.addr,
            NodeAddr::Ip(if ipv6 {
                Ipv6Addr::LOCALHOST.into()
            } else {
                Ipv4Addr::LOCALHOST.into()
            })
        );
        let expected = if ipv6 { 65_527 } else { 65_507 } - 16;
        assert_eq!(port.max_msg_size, expected);
        assert!(matches!(
            ctx.query_port(2),
            Err(FabricError::NoSuchPort { port: 2, .. })
        ));
    }
    assert!(matches!(
        provider(false).open("no-such-if0"),
        Err(FabricError::NoSuchDevice { .. })
    ));
}

#[test]
fn configured_mtu_is_checked_and_applied() {
    let p = UdpProvider::new(UdpConfig {
        mtu: Some(1400),
        ..UdpConfig::default()
    });
    let dev = p.devices().unwrap()[0].name.clone();
    assert_eq!(
        p.open(&dev).unwrap().query_port(1).unwrap().max_msg_size,
        1400
    );
    let too_big = UdpProvider::new(UdpConfig {
        mtu: Some(70_000),
        ..UdpConfig::default()
    });
    assert!(matches!(
        too_big.open(&dev),
        Err(FabricError::InvalidArgument {
            what: "udp mtu",
            ..
        })
    ));
}

#[test]
fn round_trip_in_one_process_with_imm_and_source() {
    let mut a = Endpoint::new(open(false), 16, QKEY);
    let mut b = Endpoint::new(open(false), 16, QKEY);
    let ah = a.ah(node(&b));
    a.ctx.mr_bytes_mut(a.send_mr.handle).unwrap()[..5].copy_from_slice(b"hello");
    let sg = [Gather::Registered(Sge {
        lkey: a.send_mr.lkey,
        offset: 0,
        len: 5,
    })];
    let wr = SendWr {
        wr_id: 77,
        sg_list: &sg,
        ah,
        remote_qpn: b.qp.qp_num,
        remote_qkey: QKEY,
        imm: Some(9),
        flags: SendFlags::SIGNALED,
    };
    a.ctx.post_send(a.qp.handle, &[wr]).unwrap();
    let sent = a.poll_for(1, WAIT);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].wr_id, sent[0].opcode, sent[0].status),
        (77, WcOpcode::Send, WcStatus::Success)
    );
    let got = b.poll_for(1, WAIT);
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.byte_len as usize, GRH_LEN + 5);
    assert_eq!(wc.imm, Some(9));
    assert_eq!(
        wc.src,
        Some(QpAddr {
            node: node(&a),
            qpn: a.qp.qp_num
        })
    );
    assert_eq!(b.payload(&wc), b"hello");
    assert_eq!(b.ctx.stats().rx_datagrams, 1);
    assert_eq!(a.ctx.stats().tx_datagrams, 1);
    a.teardown(&[ah]);
    b.teardown(&[]);
}

#[test]
fn datagram_without_a_posted_receive_is_dropped_and_counted() {
    let mut a = Endpoint::new(open(false), 4, QKEY);
    let mut b = Endpoint::new(open(false), 1, QKEY);
    let ah = a.ah(node(&b));
    a.send(ah, b.qp.qp_num, QKEY, b"first", 0).unwrap();
    assert_eq!(b.poll_for(1, WAIT).len(), 1);
    // b's only buffer is consumed and not reposted.
    a.send(ah, b.qp.qp_num, QKEY, b"second", 1).unwrap();
    let late = b.poll_during(Duration::from_millis(200));
    assert!(late.is_empty());
    assert_eq!(b.ctx.stats().rx_no_buffer, 1);
    // Reposting does not resurrect the dropped datagram.
    b.post_slot(0);
    assert!(b.poll_during(Duration::from_millis(100)).is_empty());
}

#[test]
fn wrong_qkey_is_dropped_and_counted_without_consuming_a_buffer() {
    let mut a = Endpoint::new(open(false), 4, QKEY);
    let mut b = Endpoint::new(open(false), 1, QKEY);
    let ah = a.ah(node(&b));
    a.send(ah, b.qp.qp_num, QKEY ^ 1, b"intruder", 0).unwrap();
    assert!(b.poll_during(Duration::from_millis(100)).is_empty());
    assert_eq!(b.ctx.stats().rx_bad_qkey, 1);
    a.send(ah, b.qp.qp_num, QKEY, b"member", 1).unwrap();
    let got = b.poll_for(1, WAIT);
    assert_eq!(got.len(), 1, "the buffer must still be posted");
    assert_eq!(b.payload(&got[0]), b"member");
}

#[test]
fn qkey_with_top_bit_uses_the_senders_own_key() {
    let mut a = Endpoint::new(open(false), 4, QKEY);
    let mut b = Endpoint::new(open(false), 1, QKEY);
    let ah = a.ah(node(&b));
    a.send(ah, b.qp.qp_num, 0x8000_0000, b"own key", 0).unwrap();
    assert_eq!(b.poll_for(1, WAIT).len(), 1);
}

#[test]
fn oversize_datagram_is_rejected_when_posted() {
    let p = UdpProvider::new(UdpConfig {
        mtu: Some(1000),
        ..UdpConfig::default()
    });
    let dev = p.devices().unwrap()[0].name.clone();
    let mut a = Endpoint::new(p.open(&dev).unwrap(), 4, QKEY);
    let ah = a.ah(node(&a));
    let qpn = a.qp.qp_num;
    let err = a.send(ah, qpn, QKEY, &[0u8; 1001], 0).unwrap_err();
    assert_eq!(err.posted, 0);
    assert!(matches!(
        err.error,
        FabricError::MessageTooLong {
            len: 1001,
            max: 1000
        }
    ));
    assert_eq!(a.ctx.stats().tx_datagrams, 0);
    a.send(ah, qpn, QKEY, &[0u8; 1000], 1).unwrap();
}

#[test]
fn datagram_longer_than_the_buffer_completes_with_a_length_error() {
    let mut a = Endpoint::new(open(false), 4, QKEY);
    let mut b = Endpoint::with_buffers(open(false), 2, GRH_LEN + 8, QKEY);
    let ah = a.ah(node(&b));
    a.send(ah, b.qp.qp_num, QKEY, &[7u8; 9], 0).unwrap();
    a.send(ah, b.qp.qp_num, QKEY, &[7u8; 8], 1).unwrap();
    let got = b.poll_for(2, WAIT);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].status, WcStatus::LocalLengthError);
    assert_eq!(got[1].status, WcStatus::Success);
    assert_eq!(got[1].payload_len(), 8);
    assert_eq!(b.ctx.stats().rx_too_long, 1);
}

#[test]
fn malformed_and_truncated_datagrams_are_counted_not_fatal() {
    let mut b = Endpoint::new(open(false), 4, QKEY);
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dest = SocketAddr::new(b.ctx.ip(), b.qp.qp_num as u16);
    raw.send_to(b"", dest).unwrap();
    raw.send_to(b"short", dest).unwrap();
    raw.send_to(&[0xAB; 64], dest).unwrap();
    let mut bad_version = udbtl_wire::ud::Repr {
        pkey: 0xffff,
        qkey: QKEY,
        imm: None,
    }
    .to_bytes();
    bad_version[2] = 9;
    raw.send_to(&bad_version, dest).unwrap();
    let mut good = udbtl_wire::ud::Repr {
        pkey: 0xffff,
        qkey: QKEY,
        imm: None,
    }
    .to_bytes()
    .to_vec();
    good.extend_from_slice(b"ok");
    raw.send_to(&good, dest).unwrap();
    let got = b.poll_for(1, WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!(b.payload(&got[0]), b"ok");
    assert_eq!(b.ctx.stats().rx_malformed, 4);
    assert_eq!(b.ctx.stats().rx_datagrams, 1);
}

/// Datagrams that found the socket's receive buffer full never reach the
/// provider, but they are counted: every datagram sent is either read (here
/// as malformed junk) or counted as dropped by the kernel.
#[test]
fn datagrams_dropped_at_a_full_socket_buffer_are_counted() {
    let provider = UdpProvider::new(UdpConfig {
        recv_buffer: 64 << 10,
        ..UdpConfig::default()
    });
    let devices = provider.devices().unwrap();
    let mut b = Endpoint::new(provider.open(&devices[0].name).unwrap(), 4, QKEY);
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dest = SocketAddr::new(b.ctx.ip(), b.qp.qp_num as u16);
    const SENT: u64 = 2000;
    for _ in 0..SENT {
        raw.send_to(&[0xAB; 1000], dest).unwrap();
    }
    assert!(b.poll_during(Duration::from_millis(200)).is_empty());
    let stats = b.ctx.stats();
    assert!(stats.rx_kernel_drops > 0, "{stats:?}");
    assert_eq!(
        stats.rx_kernel_drops + stats.rx_malformed,
        SENT,
        "{stats:?}"
    );
    assert_eq!(stats.rx_dropped(), SENT, "{stats:?}");
}
