//! The verbs flow end to end, and what the receiving side drops.

use super::*;

#[test]
fn full_verbs_flow_delivers_payload_after_the_grh() {
    let (net, mut a, mut b) = pair(1);
    let ah = a.ah_to(b.port_id);
    a.ctx.mr_bytes_mut(a.send_mr.handle).unwrap()[100..103].copy_from_slice(b"abc");
    let tail = b"-defgh";
    let user = a.ctx.reg_user_mr(a.pd, tail).unwrap();
    let sg = [
        Gather::Registered(Sge {
            lkey: a.send_mr.lkey,
            offset: 100,
            len: 3,
        }),
        Gather::User {
            lkey: user.lkey,
            data: &tail[1..],
        },
    ];
    let wr = SendWr {
        wr_id: 77,
        sg_list: &sg,
        ah,
        remote_qpn: b.qp.qp_num,
        remote_qkey: QKEY,
        imm: Some(0xabcd),
        flags: SendFlags::SIGNALED,
    };
    a.ctx.post_send(a.qp.handle, &[wr]).unwrap();

    let sent = a.poll();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].wr_id, 77);
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(sent[0].byte_len, 8);
    assert_eq!(sent[0].qp_num, a.qp.qp_num);

    let got = b.poll();
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::Recv);
    assert_eq!(wc.wr_id, 0, "the first posted receive is consumed first");
    assert_eq!(wc.byte_len as usize, GRH_LEN + 8);
    assert_eq!(wc.payload_len(), 8);
    assert_eq!(wc.src, Some(a.addr()));
    assert_eq!(wc.imm, Some(0xabcd));
    assert_eq!(wc.qp_num, b.qp.qp_num);
    let slot = &b.ctx.mr_bytes(b.recv_mr.handle).unwrap()[..GRH_LEN + 8];
    assert_eq!(
        &slot[..GRH_LEN],
        &[0u8; GRH_LEN],
        "the GRH bytes are left alone"
    );
    assert_eq!(&slot[GRH_LEN..], b"abcdefgh");

    assert_eq!(a.ctx.stats().tx_datagrams, 1);
    assert_eq!(a.ctx.stats().tx_bytes, 8);
    assert_eq!(b.ctx.stats().rx_datagrams, 1);
    assert_eq!(b.ctx.stats().rx_bytes, 8);
    assert_eq!(b.ctx.stats().rx_dropped(), 0);
    assert_eq!(net.stats().sent, 1);
    assert_eq!(net.stats().delivered, 1);
    assert_conserved(&net);
}

#[test]
fn device_and_port_attributes() {
    let (_net, a, b) = pair(1);
    let info = a.ctx.device();
    assert_eq!(info.name, "hca0");
    assert_eq!(info.provider, "sim");
    assert_eq!(info.port_count, 1);
    assert_eq!(info.attr.max_qp, 1024);
    assert_eq!(info.attr.max_qp_wr, 65536);
    assert_eq!(info.attr.max_sge, 8);
    assert_eq!(info.attr.max_cq, 1024);
    assert_eq!(info.attr.max_cqe, 1 << 20);
    assert_eq!(info.attr.max_mr, 65536);
    assert_eq!(info.attr.max_ah, 1 << 20);
    assert_eq!(info.attr.max_inline_data, 1024);
    let port = a.ctx.query_port(1).unwrap();
    assert_eq!(port.port_num, 1);
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.addr, NodeAddr::Sim(a.port_id));
    assert_eq!(port.max_msg_size, 4096);
    assert_eq!(port.pkeys, vec![0xffff]);
    assert_eq!(port.link_layer, "sim");
    assert!(matches!(
        a.ctx.query_port(2),
        Err(FabricError::NoSuchPort { port: 2, .. })
    ));
    assert!(matches!(
        a.ctx.query_port(0),
        Err(FabricError::NoSuchPort { port: 0, .. })
    ));
    assert_ne!(a.port_id, b.port_id);
    assert_ne!(a.port_id, 0, "port ids are LIDs, and LID 0 is reserved");
    assert!(a.qp.qp_num >= 0x100 && b.qp.qp_num >= 0x100);
    assert_ne!(a.qp.qp_num, b.qp.qp_num);
}

#[test]
fn a_provider_lists_its_own_devices_and_opens_them_by_name() {
    let net = SimNetwork::new(3);
    let host = net.provider();
    let ports0 = host.add_device(SimDeviceSpec::new("mlx0", 2)).unwrap();
    let ports1 = host
        .add_device(SimDeviceSpec::new("mlx1", 1).with_max_msg_size(2048))
        .unwrap();
    let other = net.add_device("mlx0", 1).unwrap();
    assert_eq!(ports0.len(), 2);
    assert_eq!(ports1.len(), 1);

    let devices = host.devices().unwrap();
    let names: Vec<_> = devices
        .iter()
        .map(|d| (d.name.as_str(), d.port_count))
        .collect();
    assert_eq!(names, [("mlx0", 2), ("mlx1", 1)]);
    assert!(devices.iter().all(|d| d.provider == "sim"));
    assert_eq!(
        other.devices().unwrap().len(),
        1,
        "providers do not see each other's devices"
    );
    assert_eq!(host.name(), "sim");

    let ctx0 = host.open("mlx0").unwrap();
    let ctx1 = host.open("mlx1").unwrap();
    let other_ctx = other.open("mlx0").unwrap();
    let addrs: HashSet<NodeAddr> = [
        ctx0.query_port(1).unwrap().addr,
        ctx0.query_port(2).unwrap().addr,
        ctx1.query_port(1).unwrap().addr,
        other_ctx.query_port(1).unwrap().addr,
    ]
    .into_iter()
    .collect();
    assert_eq!(addrs.len(), 4, "every port has its own address");
    assert_eq!(ctx0.query_port(2).unwrap().addr, NodeAddr::Sim(ports0[1]));
    assert_eq!(ctx1.query_port(1).unwrap().max_msg_size, 2048);

    assert!(matches!(
        host.open("mlx9"),
        Err(FabricError::NoSuchDevice { .. })
    ));
    assert!(matches!(
        host.add_device(SimDeviceSpec::new("mlx0", 1)),
        Err(FabricError::InvalidArgument { .. })
    ));
    assert!(matches!(
        host.add_device(SimDeviceSpec::new("mlx2", 0)),
        Err(FabricError::InvalidArgument { .. })
    ));
}

#[test]
fn port_state_is_reported_and_a_down_port_carries_nothing() {
    let (net, mut a, mut b) = pair(1);
    let ah = a.ah_to(b.port_id);
    net.set_port_state(b.port_id, PortState::Down).unwrap();
    assert_eq!(b.ctx.query_port(1).unwrap().state, PortState::Down);
    assert_eq!(a.ctx.query_port(1).unwrap().state, PortState::Active);
    a.send(ah, b.qp.qp_num, b"x", None, SendFlags::NONE)
        .unwrap();
    net.set_port_state(b.port_id, PortState::Active).unwrap();
    net.set_port_state(a.port_id, PortState::Down).unwrap();
    a.send(ah, b.qp.qp_num, b"y", None, SendFlags::NONE)
        .unwrap();
    assert!(b.poll().is_empty());
    assert_eq!(net.stats().dropped_port_down, 2);

    net.set_port_state(a.port_id, PortState::Active).unwrap();
    a.send(ah, b.qp.qp_num, b"z", None, SendFlags::NONE)
        .unwrap();
    let got = b.poll();
    assert_eq!(got.len(), 1);
    assert_eq!(b.payload(&got[0]), b"z");
    assert!(net.set_port_state(9999, PortState::Down).is_err());
    assert_conserved(&net);
}

#[test]
fn address_handles_take_only_sim_addresses() {
    let (_net, mut a, _b) = pair(1);
    let attr = AhAttr {
        dest: NodeAddr::Ip(std::net::Ipv4Addr::LOCALHOST.into()),
        service_level: 0,
        src_path_bits: 0,
        port: 1,
    };
    assert!(matches!(
        a.ctx.create_ah(a.pd, &attr),
        Err(FabricError::InvalidArgument { .. })
    ));
    let bad_port = AhAttr {
        dest: NodeAddr::Sim(1),
        port: 2,
        ..attr
    };
    assert!(matches!(
        a.ctx.create_ah(a.pd, &bad_port),
        Err(FabricError::NoSuchPort { .. })
    ));
    assert_eq!(a.ctx.resources().ahs, 0);
}

// ----- drops at the receiver ----------------------------------------------

#[test]
fn a_datagram_without_a_posted_receive_is_dropped_and_counted() {
    let (net, mut a, mut b) = pair_with(
        1,
        Opts::default(),
        Opts {
            post: false,
            ..Opts::default()
        },
    );
    let ah = a.ah_to(b.port_id);
    a.send(ah, b.qp.qp_num, b"lost", None, SendFlags::NONE)
        .unwrap();
    assert!(b.poll().is_empty());
    assert_eq!(b.ctx.stats().rx_no_buffer, 1);
    assert_eq!(b.ctx.stats().rx_datagrams, 0);
    assert_eq!(
        net.stats().delivered,
        1,
        "the network delivered it; the HCA dropped it"
    );

    b.post_slot(0);
    a.send(ah, b.qp.qp_num, b"kept", None, SendFlags::NONE)
        .unwrap();
    let got = b.poll();
    assert_eq!(got.len(), 1);
    assert_eq!(b.payload(&got[0]), b"kept");
}

#[test]
fn a_wrong_qkey_is_dropped_and_counted_without_consuming_a_buffer() {
    let (net, mut a, mut b) = pair(1);
    let ah = a.ah_to(b.port_id);
    a.send_keyed(ah, b.qp.qp_num, QKEY ^ 1, b"bad", None, SendFlags::NONE)
        .unwrap();
    assert!(b.poll().is_empty());
    assert_eq!(b.ctx.stats().rx_bad_qkey, 1);

    // The top bit means "use the sender's own key", which here is QKEY.
    a.send_keyed(ah, b.qp.qp_num, 0x8000_0000, b"own", None, SendFlags::NONE)
        .unwrap();
    let got = b.poll();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wr_id, 0, "the refused datagram did not take slot 0");
    assert_eq!(b.payload(&got[0]), b"own");
    assert_eq!(net.stats().delivered, 2);
}

#[test]
fn a_receive_buffer_too_small_completes_with_a_length_error() {
    let (_net, mut a, mut b) = pair_with(
        1,
        Opts::default(),
        Opts {
            slots: 2,
            slot_len: GRH_LEN + 4,
            ..Opts::default()
        },
    );
    let ah = a.ah_to(b.port_id);
    a.send(ah, b.qp.qp_num, b"0123456789", None, SendFlags::NONE)
        .unwrap();
    a.send(ah, b.qp.qp_num, b"fits", None, SendFlags::NONE)
        .unwrap();
    let got = b.poll();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].status, WcStatus::LocalLengthError);
    assert_eq!(got[0].wr_id, 0);
    assert_eq!(got[1].status, WcStatus::Success);
    assert_eq!(b.payload(&got[1]), b"fits");
    assert_eq!(b.ctx.stats().rx_too_long, 1);
}

#[test]
fn datagrams_to_unknown_or_destroyed_queue_pairs_are_dropped_by_the_network() {
    let (net, mut a, mut b) = pair(1);
    let nowhere = a.ah_to(9999);
    let ah = a.ah_to(b.port_id);
    a.send(nowhere, b.qp.qp_num, b"1", None, SendFlags::NONE)
        .unwrap();
    a.send(ah, 0x00ab_cdef, b"2", None, SendFlags::NONE)
        .unwrap();
    // A's queue pair number at B's port: the number exists, not there.
    a.send(ah, a.qp.qp_num, b"3", None, SendFlags::NONE)
        .unwrap();
    assert_eq!(net.stats().dropped_unknown_dest, 3);

    net.set_default_link(LinkConfig {
        latency: Duration::from_micros(5),
        ..LinkConfig::default()
    })
    .unwrap();
    a.send(ah, b.qp.qp_num, b"4", None, SendFlags::NONE)
        .unwrap();
    a.send(ah, b.qp.qp_num, b"5", None, SendFlags::NONE)
        .unwrap();
    assert_eq!(net.in_flight(), 2);
    b.ctx.destroy_qp(b.qp.handle).unwrap();
    assert_eq!(net.in_flight(), 0);
    assert_eq!(net.stats().dropped_unknown_dest, 5);
    assert_eq!(net.stats().delivered, 0);
    assert_conserved(&net);

    // Dropping a context forgets its queue pairs as well.
    let qp = b.ctx.create_qp(
        b.pd,
        &QpInitAttr {
            send_cq: b.cq,
            recv_cq: b.cq,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_inline_data: 0,
            },
        },
    );
    let qpn = qp.unwrap().qp_num;
    a.send(ah, qpn, b"6", None, SendFlags::NONE).unwrap();
    assert_eq!(net.in_flight(), 1);
    drop(b);
    assert_eq!(net.in_flight(), 0);
    assert_eq!(net.stats().dropped_unknown_dest, 6);
    assert_conserved(&net);
}
