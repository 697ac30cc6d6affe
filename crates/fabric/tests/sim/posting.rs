//! Checks at post time, queue-pair states, queue limits, teardown and the
//! virtual clock.

use super::*;

#[test]
fn a_send_larger_than_max_msg_size_is_refused_when_posted() {
    let (net, mut a, b) = pair(1);
    let ah = a.ah_to(b.port_id);
    let err = assert_post_err(
        a.send(ah, b.qp.qp_num, &[0; 4097], None, SendFlags::NONE),
        0,
    );
    assert!(
        matches!(
            err,
            FabricError::MessageTooLong {
                len: 4097,
                max: 4096
            }
        ),
        "{err}"
    );
    a.send(ah, b.qp.qp_num, &[0; 4096], None, SendFlags::NONE)
        .unwrap();

    // In a batch, the ones before the bad request leave, the rest do not.
    let ok = [Gather::Registered(Sge {
        lkey: a.send_mr.lkey,
        offset: 0,
        len: 10,
    })];
    let big = [Gather::Registered(Sge {
        lkey: a.send_mr.lkey,
        offset: 0,
        len: 5000,
    })];
    let wr = SendWr {
        wr_id: 0,
        sg_list: &ok,
        ah,
        remote_qpn: b.qp.qp_num,
        remote_qkey: QKEY,
        imm: None,
        flags: SendFlags::NONE,
    };
    let batch = [
        wr,
        SendWr {
            sg_list: &big,
            ..wr
        },
        wr,
    ];
    let err = assert_post_err(a.ctx.post_send(a.qp.handle, &batch), 1);
    assert!(matches!(err, FabricError::MessageTooLong { .. }));
    assert_eq!(net.stats().sent, 2);

    // The limit is per device.
    let small = net.provider();
    small
        .add_device(SimDeviceSpec::new("small", 1).with_max_msg_size(1024))
        .unwrap();
    let mut s = Node::new(small.open("small").unwrap(), Opts::default());
    let ah = s.ah_to(b.port_id);
    let err = assert_post_err(
        s.send(ah, b.qp.qp_num, &[0; 1025], None, SendFlags::NONE),
        0,
    );
    assert!(matches!(
        err,
        FabricError::MessageTooLong {
            len: 1025,
            max: 1024
        }
    ));
}

#[test]
fn sends_from_memory_that_is_not_registered_are_protection_errors() {
    let (net, mut a, b) = pair(1);
    let ah = a.ah_to(b.port_id);
    let send = |ctx: &mut SimContext, qp: QpHandle, g: Gather<'_>| {
        let sg = [g];
        let wr = SendWr {
            wr_id: 0,
            sg_list: &sg,
            ah,
            remote_qpn: b.qp.qp_num,
            remote_qkey: QKEY,
            imm: None,
            flags: SendFlags::NONE,
        };
        assert_post_err(ctx.post_send(qp, &[wr]), 0)
    };
    let qp = a.qp.handle;
    let lkey = a.send_mr.lkey;

    let err = send(
        &mut a.ctx,
        qp,
        Gather::Registered(Sge {
            lkey: LKey(0xdead_beef),
            offset: 0,
            len: 4,
        }),
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "unknown key: {err}"
    );
    let err = send(
        &mut a.ctx,
        qp,
        Gather::Registered(Sge {
            lkey,
            offset: 8190,
            len: 4,
        }),
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "past the end: {err}"
    );
    let err = send(
        &mut a.ctx,
        qp,
        Gather::Registered(Sge {
            lkey,
            offset: usize::MAX,
            len: 4,
        }),
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "overflow: {err}"
    );

    let stale = a.ctx.reg_mr(a.pd, 64).unwrap();
    a.ctx.dereg_mr(stale.handle).unwrap();
    let err = send(
        &mut a.ctx,
        qp,
        Gather::Registered(Sge {
            lkey: stale.lkey,
            offset: 0,
            len: 4,
        }),
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "deregistered: {err}"
    );

    let other_pd = a.ctx.alloc_pd().unwrap();
    let foreign = a.ctx.reg_mr(other_pd, 64).unwrap();
    let err = send(
        &mut a.ctx,
        qp,
        Gather::Registered(Sge {
            lkey: foreign.lkey,
            offset: 0,
            len: 4,
        }),
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "other domain: {err}"
    );

    let region = [7u8; 64];
    let elsewhere = [7u8; 80];
    let user = a.ctx.reg_user_mr(a.pd, &region[..32]).unwrap();
    let err = send(
        &mut a.ctx,
        qp,
        Gather::User {
            lkey: user.lkey,
            data: &region[16..48],
        },
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "beyond the user range: {err}"
    );
    let err = send(
        &mut a.ctx,
        qp,
        Gather::User {
            lkey: user.lkey,
            data: &elsewhere[..4],
        },
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "other memory: {err}"
    );
    let err = send(
        &mut a.ctx,
        qp,
        Gather::User {
            lkey,
            data: &region[..4],
        },
    );
    assert!(
        matches!(err, FabricError::ProtectionError { .. }),
        "provider key for user data: {err}"
    );

    // Inline data is copied, so keys are not checked; the limit is.
    let inline = [Gather::User {
        lkey: LKey(0),
        data: &elsewhere[..8],
    }];
    let wr = SendWr {
        wr_id: 0,
        sg_list: &inline,
        ah,
        remote_qpn: b.qp.qp_num,
        remote_qkey: QKEY,
        imm: None,
        flags: SendFlags::INLINE,
    };
    a.ctx.post_send(qp, &[wr]).unwrap();
    let too_much = [Gather::User {
        lkey: LKey(0),
        data: &elsewhere[..65],
    }];
    let err = assert_post_err(
        a.ctx.post_send(
            qp,
            &[SendWr {
                sg_list: &too_much,
                ..wr
            }],
        ),
        0,
    );
    assert!(
        matches!(err, FabricError::InlineTooLong { len: 65, max: 64 }),
        "{err}"
    );
    assert_eq!(net.stats().sent, 1, "only the valid inline send left");
}

#[test]
fn queue_pair_transitions_follow_verbs_order() {
    let (_net, mut a, _b) = pair(1);
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_inline_data: 0,
    };
    let qp = a
        .ctx
        .create_qp(
            a.pd,
            &QpInitAttr {
                send_cq: a.cq,
                recv_cq: a.cq,
                cap,
            },
        )
        .unwrap()
        .handle;
    let init = QpTransition::Init {
        pkey_index: 0,
        qkey: QKEY,
        port: 1,
    };
    let rts = QpTransition::Rts { sq_psn: 0 };
    assert_eq!(a.ctx.qp_state(qp).unwrap(), QpState::Reset);
    for bad in [QpTransition::Rtr, rts] {
        assert!(matches!(
            a.ctx.modify_qp(qp, &bad),
            Err(FabricError::InvalidState { .. })
        ));
    }
    let wrong_port = QpTransition::Init {
        pkey_index: 0,
        qkey: QKEY,
        port: 2,
    };
    assert!(matches!(
        a.ctx.modify_qp(qp, &wrong_port),
        Err(FabricError::NoSuchPort { .. })
    ));
    let wrong_pkey = QpTransition::Init {
        pkey_index: 1,
        qkey: QKEY,
        port: 1,
    };
    assert!(matches!(
        a.ctx.modify_qp(qp, &wrong_pkey),
        Err(FabricError::InvalidArgument { .. })
    ));
    assert_eq!(a.ctx.qp_state(qp).unwrap(), QpState::Reset);

    // Nothing can be posted before INIT.
    let sge = Sge {
        lkey: a.recv_mr.lkey,
        offset: 0,
        len: 64,
    };
    let err = a
        .ctx
        .post_recv(qp, &[RecvWr { wr_id: 0, sge }])
        .unwrap_err();
    assert!(matches!(
        err.error,
        FabricError::InvalidState {
            state: QpState::Reset,
            ..
        }
    ));

    a.ctx.modify_qp(qp, &init).unwrap();
    assert_eq!(a.ctx.qp_state(qp).unwrap(), QpState::Init);
    for bad in [init, rts] {
        assert!(matches!(
            a.ctx.modify_qp(qp, &bad),
            Err(FabricError::InvalidState { .. })
        ));
    }
    a.ctx.post_recv(qp, &[RecvWr { wr_id: 0, sge }]).unwrap();

    // Sends need RTS.
    let ah = a.ah_to(a.port_id);
    let sg = [Gather::Registered(Sge {
        lkey: a.send_mr.lkey,
        offset: 0,
        len: 1,
    })];
    let wr = SendWr {
        wr_id: 0,
        sg_list: &sg,
        ah,
        remote_qpn: a.qp.qp_num,
        remote_qkey: QKEY,
        imm: None,
        flags: SendFlags::SIGNALED,
    };
    let err = assert_post_err(a.ctx.post_send(qp, &[wr]), 0);
    assert!(
        matches!(
            err,
            FabricError::InvalidState {
                state: QpState::Init,
                ..
            }
        ),
        "{err}"
    );

    a.ctx.modify_qp(qp, &QpTransition::Rtr).unwrap();
    let err = assert_post_err(a.ctx.post_send(qp, &[wr]), 0);
    assert!(
        matches!(
            err,
            FabricError::InvalidState {
                state: QpState::Rtr,
                ..
            }
        ),
        "{err}"
    );
    a.ctx.modify_qp(qp, &rts).unwrap();
    assert_eq!(a.ctx.qp_state(qp).unwrap(), QpState::Rts);
    for bad in [init, QpTransition::Rtr, rts] {
        assert!(matches!(
            a.ctx.modify_qp(qp, &bad),
            Err(FabricError::InvalidState { .. })
        ));
    }
    a.ctx.post_send(qp, &[wr]).unwrap();
}

#[test]
fn the_send_queue_fills_until_completions_are_polled() {
    let (_net, mut a, b) = pair_with(
        1,
        Opts {
            max_send_wr: 4,
            ..Opts::default()
        },
        Opts::default(),
    );
    let ah = a.ah_to(b.port_id);
    for _ in 0..4 {
        a.send(ah, b.qp.qp_num, b"s", None, SendFlags::SIGNALED)
            .unwrap();
    }
    let err = assert_post_err(a.send(ah, b.qp.qp_num, b"s", None, SendFlags::SIGNALED), 0);
    assert!(
        matches!(
            err,
            FabricError::QueueFull {
                queue: "send queue",
                capacity: 4
            }
        ),
        "{err}"
    );
    // Unsignaled sends take no room.
    a.send(ah, b.qp.qp_num, b"u", None, SendFlags::NONE)
        .unwrap();

    let mut one = [WorkCompletion::EMPTY; 1];
    assert_eq!(a.ctx.poll_cq(a.cq, &mut one).unwrap(), 1);
    a.send(ah, b.qp.qp_num, b"s", None, SendFlags::SIGNALED)
        .unwrap();
    assert!(
        a.send(ah, b.qp.qp_num, b"s", None, SendFlags::SIGNALED)
            .is_err()
    );
    assert_eq!(a.poll().len(), 4);
}

#[test]
fn teardown_runs_in_verbs_order_and_leaks_nothing() {
    let (_net, mut a, b) = pair(1);
    let ah = a.ah_to(b.port_id);
    let user_bytes = [1u8; 16];
    let user = a.ctx.reg_user_mr(a.pd, &user_bytes).unwrap();
    let ctx = &mut a.ctx;

    assert!(matches!(
        ctx.dealloc_pd(a.pd),
        Err(FabricError::Busy { .. })
    ));
    assert!(matches!(
        ctx.destroy_cq(a.cq),
        Err(FabricError::Busy { .. })
    ));
    ctx.destroy_ah(ah).unwrap();
    assert!(matches!(
        ctx.destroy_ah(ah),
        Err(FabricError::InvalidHandle { .. })
    ));
    ctx.destroy_qp(a.qp.handle).unwrap();
    assert!(matches!(
        ctx.qp_state(a.qp.handle),
        Err(FabricError::InvalidHandle { .. })
    ));
    assert!(
        matches!(ctx.dealloc_pd(a.pd), Err(FabricError::Busy { .. })),
        "MRs remain"
    );
    ctx.destroy_cq(a.cq).unwrap();
    for mr in [a.recv_mr.handle, a.send_mr.handle, user.handle] {
        ctx.dereg_mr(mr).unwrap();
    }
    assert!(matches!(
        ctx.mr_bytes(a.send_mr.handle),
        Err(FabricError::InvalidHandle { .. })
    ));
    ctx.dealloc_pd(a.pd).unwrap();
    assert!(ctx.resources().is_empty(), "{:?}", ctx.resources());
}

#[test]
fn arrivals_wait_for_the_clock() {
    let (net, mut a, mut b) = pair(1);
    net.set_link(
        a.port_id,
        b.port_id,
        LinkConfig {
            latency: Duration::from_micros(10),
            ..LinkConfig::default()
        },
    )
    .unwrap();
    let ah = a.ah_to(b.port_id);
    net.advance(Duration::from_micros(3));
    a.send(ah, b.qp.qp_num, b"later", None, SendFlags::NONE)
        .unwrap();
    assert!(b.poll().is_empty());
    assert_eq!(net.next_arrival(), Some(Duration::from_micros(13)));
    net.advance_to(Duration::from_micros(12));
    assert!(b.poll().is_empty());
    net.advance_to(Duration::from_micros(1)); // never backwards
    assert_eq!(net.now(), Duration::from_micros(12));
    net.advance(Duration::from_micros(1));
    assert_eq!(b.poll().len(), 1);
    assert_eq!(net.next_arrival(), None);

    // The other direction has its own (default, zero-latency) link.
    let back = b.ah_to(a.port_id);
    b.send(back, a.qp.qp_num, b"now", None, SendFlags::NONE)
        .unwrap();
    assert_eq!(a.poll().len(), 1);
}

#[test]
fn datagrams_for_another_context_wait_until_it_polls() {
    let (net, mut a, mut b) = pair(1);
    let ah = a.ah_to(b.port_id);
    a.send(ah, b.qp.qp_num, b"for b", None, SendFlags::NONE)
        .unwrap();
    assert!(a.poll().is_empty());
    assert_eq!(net.in_flight(), 1);
    assert_eq!(b.poll().len(), 1);
    assert_eq!(net.in_flight(), 0);
}

#[test]
fn delivery_stops_when_the_completion_queue_is_full() {
    let (net, mut a, mut b) = pair_with(
        1,
        Opts::default(),
        Opts {
            cq_depth: 4,
            slots: 16,
            ..Opts::default()
        },
    );
    let ah = a.ah_to(b.port_id);
    for i in 0..10u32 {
        a.send(ah, b.qp.qp_num, &i.to_be_bytes(), Some(i), SendFlags::NONE)
            .unwrap();
    }
    let mut two = [WorkCompletion::EMPTY; 2];
    assert_eq!(b.ctx.poll_cq(b.cq, &mut two).unwrap(), 2);
    assert_eq!(
        net.in_flight(),
        6,
        "only what fit in the queue was delivered"
    );
    let mut imms: Vec<u32> = two.iter().map(|wc| wc.imm.unwrap()).collect();
    loop {
        let n = b.ctx.poll_cq(b.cq, &mut two).unwrap();
        if n == 0 {
            break;
        }
        imms.extend(two[..n].iter().map(|wc| wc.imm.unwrap()));
    }
    assert_eq!(imms, (0..10).collect::<Vec<_>>());
    assert_eq!(b.ctx.stats().rx_no_buffer, 0);
}

#[test]
fn link_configurations_are_validated() {
    let net = SimNetwork::new(0);
    for bad in [
        LinkConfig {
            loss: 1.5,
            ..LinkConfig::default()
        },
        LinkConfig {
            corrupt: -0.1,
            ..LinkConfig::default()
        },
        LinkConfig {
            duplicate: f64::NAN,
            ..LinkConfig::default()
        },
        LinkConfig {
            reorder_delay: (Duration::from_micros(2), Duration::from_micros(1)),
            ..LinkConfig::default()
        },
        LinkConfig {
            blackout: Some((Duration::from_micros(2), Duration::from_micros(1))),
            ..LinkConfig::default()
        },
    ] {
        assert!(net.set_default_link(bad).is_err(), "{bad:?}");
        assert!(net.set_link(1, 2, bad).is_err(), "{bad:?}");
    }
    assert_eq!(net.link(1, 2), LinkConfig::default());
}
