//! The verbs rules: send queue depth, memory checks, queue-pair states and
//! teardown order.

use super::*;

#[test]
fn send_queue_fills_until_completions_are_polled() {
    let mut a = Endpoint::new(open(false), 4, QKEY);
    let ah = a.ah(node(&a));
    let qpn = a.qp.qp_num;
    for i in 0..128 {
        a.send(ah, qpn, QKEY ^ 1, b"x", i).unwrap();
    }
    let err = a.send(ah, qpn, QKEY ^ 1, b"x", 128).unwrap_err();
    assert!(matches!(
        err.error,
        FabricError::QueueFull {
            queue: "send queue",
            ..
        }
    ));
    assert_eq!(a.poll_for(128, WAIT).len(), 128);
    a.send(ah, qpn, QKEY ^ 1, b"x", 129).unwrap();
}

#[test]
fn memory_checks_follow_verbs() {
    let mut a = Endpoint::new(open(false), 4, QKEY);
    let ah = a.ah(node(&a));
    let qpn = a.qp.qp_num;
    let send = |a: &mut Endpoint<UdpContext>, sg: &[Gather<'_>], flags| {
        let wr = SendWr {
            wr_id: 1,
            sg_list: sg,
            ah,
            remote_qpn: qpn,
            remote_qkey: QKEY,
            imm: None,
            flags,
        };
        a.ctx.post_send(a.qp.handle, &[wr]).map_err(|e| e.error)
    };
    let user = vec![5u8; 4096];
    let other = vec![6u8; 16];
    // Unregistered caller memory, a forged key, a range past the end.
    assert!(matches!(
        send(
            &mut a,
            &[Gather::User {
                lkey: LKey(0x4242),
                data: &user
            }],
            SendFlags::SIGNALED
        ),
        Err(FabricError::ProtectionError { .. })
    ));
    let mr = a.ctx.reg_user_mr(a.pd, &user[..1024]).unwrap();
    assert!(matches!(
        send(
            &mut a,
            &[Gather::User {
                lkey: mr.lkey,
                data: &user[..2048]
            }],
            SendFlags::SIGNALED
        ),
        Err(FabricError::ProtectionError { .. })
    ));
    assert!(matches!(
        send(
            &mut a,
            &[Gather::User {
                lkey: mr.lkey,
                data: &other
            }],
            SendFlags::SIGNALED
        ),
        Err(FabricError::ProtectionError { .. })
    ));
    let big = Sge {
        lkey: a.send_mr.lkey,
        offset: a.send_mr.len - 4,
        len: 8,
    };
    assert!(matches!(
        send(&mut a, &[Gather::Registered(big)], SendFlags::SIGNALED),
        Err(FabricError::ProtectionError { .. })
    ));
    // Inside the registration it works; inline skips the key check.
    send(
        &mut a,
        &[Gather::User {
            lkey: mr.lkey,
            data: &user[100..600],
        }],
        SendFlags::SIGNALED,
    )
    .unwrap();
    send(
        &mut a,
        &[Gather::User {
            lkey: LKey(0),
            data: &other,
        }],
        SendFlags::SIGNALED | SendFlags::INLINE,
    )
    .unwrap();
    assert!(matches!(
        send(
            &mut a,
            &[Gather::User {
                lkey: LKey(0),
                data: &user[..200]
            }],
            SendFlags::INLINE
        ),
        Err(FabricError::InlineTooLong { len: 200, max: 128 })
    ));
    // A deregistered key is dead.
    a.ctx.dereg_mr(mr.handle).unwrap();
    assert!(matches!(
        send(
            &mut a,
            &[Gather::User {
                lkey: mr.lkey,
                data: &user[..10]
            }],
            SendFlags::SIGNALED
        ),
        Err(FabricError::ProtectionError { .. })
    ));
    // Receive buffers must be provider-owned and hold a GRH.
    let tiny = RecvWr {
        wr_id: 0,
        sge: Sge {
            lkey: a.recv_mr.lkey,
            offset: 0,
            len: GRH_LEN - 1,
        },
    };
    assert!(a.ctx.post_recv(a.qp.handle, &[tiny]).is_err());
}

#[test]
fn queue_pair_states_and_teardown_order() {
    let mut ctx = open(false);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(
            pd,
            &QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                cap,
            },
        )
        .unwrap();
    assert_eq!(ctx.qp_state(qp.handle).unwrap(), QpState::Reset);
    assert!(matches!(
        ctx.modify_qp(qp.handle, &QpTransition::Rtr),
        Err(FabricError::InvalidState {
            state: QpState::Reset,
            ..
        })
    ));
    assert!(
        ctx.modify_qp(
            qp.handle,
            &QpTransition::Init {
                pkey_index: 1,
                qkey: QKEY,
                port: 1
            }
        )
        .is_err()
    );
    assert!(
        ctx.modify_qp(
            qp.handle,
            &QpTransition::Init {
                pkey_index: 0,
                qkey: QKEY,
                port: 2
            }
        )
        .is_err()
    );
    ctx.modify_qp(
        qp.handle,
        &QpTransition::Init {
            pkey_index: 0,
            qkey: QKEY,
            port: 1,
        },
    )
    .unwrap();
    let mr = ctx.reg_mr(pd, 4096).unwrap();
    let ah = ctx
        .create_ah(
            pd,
            &AhAttr {
                dest: NodeAddr::Ip(ctx.ip()),
                service_level: 0,
                src_path_bits: 0,
                port: 1,
            },
        )
        .unwrap();
    let sg = [Gather::Registered(Sge {
        lkey: mr.lkey,
        offset: 0,
        len: 4,
    })];
    let wr = SendWr {
        wr_id: 0,
        sg_list: &sg,
        ah,
        remote_qpn: qp.qp_num,
        remote_qkey: QKEY,
        imm: None,
        flags: SendFlags::SIGNALED,
    };
    assert!(matches!(
        ctx.post_send(qp.handle, &[wr]).unwrap_err().error,
        FabricError::InvalidState {
            state: QpState::Init,
            ..
        }
    ));
    // A v6 address cannot be reached from a v4 socket.
    assert!(
        ctx.create_ah(
            pd,
            &AhAttr {
                dest: NodeAddr::Ip(Ipv6Addr::LOCALHOST.into()),
                service_level: 0,
                src_path_bits: 0,
                port: 1
            }
        )
        .is_err()
    );
    assert!(matches!(ctx.dealloc_pd(pd), Err(FabricError::Busy { .. })));
    assert!(matches!(ctx.destroy_cq(cq), Err(FabricError::Busy { .. })));
    ctx.destroy_ah(ah).unwrap();
    ctx.destroy_qp(qp.handle).unwrap();
    assert!(matches!(
        ctx.destroy_qp(qp.handle),
        Err(FabricError::InvalidHandle { .. })
    ));
    ctx.destroy_cq(cq).unwrap();
    ctx.dereg_mr(mr.handle).unwrap();
    ctx.dealloc_pd(pd).unwrap();
    assert!(ctx.resources().is_empty());
}
