//! Realized fault rates, completion order, and the checks the wrapper keeps
//! on dropped, held and passed sends.

use super::*;

#[test]
fn realized_drop_duplicate_and_reorder_rates_match_the_configuration() {
    const N: u32 = 20_000;
    let config = FaultConfig {
        drop: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
        seed: 2024,
    };
    let (net, mut a, mut b) = setup(config, 16);
    let ah = a.ah_to(b.port_id);
    let mut received = Vec::new();
    for seq in 0..N {
        // Unsignaled, and the sender does not poll: a held send then leaves
        // right after the next one, which is the reordering measured.
        let len = 1 + seq as usize % 64;
        a.send(
            ah,
            b.qp.qp_num,
            &pattern(seq, len),
            u64::from(seq),
            SendFlags::NONE,
        )
        .unwrap();
        received.extend(b.receive());
    }
    assert!(a.poll().is_empty(), "no send was signaled");
    received.extend(b.receive());
    assert_eq!(net.in_flight(), 0);

    let mut seen = HashSet::new();
    let mut copies = 0u64;
    let mut late = 0u64;
    let mut max_seen = None;
    for (seq, bytes) in &received {
        assert_eq!(
            *bytes,
            pattern(*seq, 1 + *seq as usize % 64),
            "datagram {seq} intact"
        );
        if !seen.insert(*seq) {
            copies += 1;
        } else if max_seen.is_some_and(|m| *seq < m) {
            late += 1;
        }
        max_seen = max_seen.max(Some(*seq));
    }
    let lost = u64::from(N) - seen.len() as u64;
    let stats = a.ctx.fault_stats();
    assert_eq!(lost, stats.dropped);
    assert_eq!(copies, stats.duplicated);
    assert_eq!(stats.release_failures, 0);
    // Only sends held when the sender finally polled can be on time.
    assert!(
        late <= stats.reordered && stats.reordered - late <= 2,
        "{late} vs {stats:?}"
    );
    assert_rate("faulty drop", lost, u64::from(N), 0.05);
    assert_rate("faulty duplication", copies, u64::from(N), 0.05);
    assert_rate(
        "faulty reordering (observed late arrivals)",
        late,
        u64::from(N),
        0.05,
    );
    assert_eq!(b.ctx.stats().rx_dropped(), 0);
    assert_eq!(net.stats().sent, u64::from(N) - lost + copies);
}

#[test]
fn send_completions_keep_posting_order_whatever_the_fate() {
    let config = FaultConfig {
        drop: 0.3,
        duplicate: 0.1,
        reorder: 0.3,
        seed: 5,
    };
    let (_net, mut a, mut b) = setup(config, 64);
    let ah = a.ah_to(b.port_id);
    let mut completions = Vec::new();
    let mut next = 0u64;
    while next < 2000 {
        // Batches of up to 8, mixing signaled and unsignaled sends.
        let payloads: Vec<Vec<u8>> = (0..8).map(|i| pattern((next + i) as u32, 10)).collect();
        // Inline, so the bytes need no registration.
        let sgs: Vec<[Gather<'_>; 1]> = payloads
            .iter()
            .map(|p| {
                [Gather::User {
                    lkey: LKey(0),
                    data: p.as_slice(),
                }]
            })
            .collect();
        let wrs: Vec<SendWr<'_>> = sgs
            .iter()
            .enumerate()
            .map(|(i, sg)| SendWr {
                wr_id: next + i as u64,
                sg_list: sg,
                ah,
                remote_qpn: b.qp.qp_num,
                remote_qkey: QKEY,
                imm: Some((next + i as u64) as u32),
                flags: if (next + i as u64) % 3 == 0 {
                    SendFlags::SIGNALED | SendFlags::INLINE
                } else {
                    SendFlags::INLINE
                },
            })
            .collect();
        a.ctx.post_send(a.qp.handle, &wrs).unwrap();
        next += 8;
        if next % 32 == 0 {
            completions.extend(a.poll());
            b.receive();
        }
    }
    completions.extend(a.poll());
    let ids: Vec<u64> = completions.iter().map(|wc| wc.wr_id).collect();
    let expected: Vec<u64> = (0..next).filter(|id| id % 3 == 0).collect();
    assert_eq!(ids, expected);
    assert!(completions.iter().all(|wc| wc.opcode == WcOpcode::Send
        && wc.status == WcStatus::Success
        && wc.byte_len == 10
        && wc.qp_num == a.qp.qp_num));
    let stats = a.ctx.fault_stats();
    assert!(
        stats.dropped > 0 && stats.reordered > 0 && stats.duplicated > 0,
        "{stats:?}"
    );
}

#[test]
fn dropped_and_held_sends_are_checked_like_any_other() {
    for config in [
        FaultConfig {
            drop: 1.0,
            ..FaultConfig::default()
        },
        FaultConfig {
            reorder: 1.0,
            ..FaultConfig::default()
        },
    ] {
        let (net, mut a, b) = setup(config, 2);
        let ah = a.ah_to(b.port_id);
        let qpn = b.qp.qp_num;
        let lkey = a.send_mr.lkey;
        let region = [1u8; 64];
        let user = a.ctx.reg_user_mr(a.pd, &region[..32]).unwrap();
        let base = a.wr(ah, qpn);
        let post = |a: &mut Ep<FaultyContext<SimContext>>, wr: SendWr<'_>| {
            let err = a
                .ctx
                .post_send(a.qp.handle, &[wr])
                .expect_err("must be refused");
            assert_eq!(err.posted, 0);
            err.error
        };
        let sg = [Gather::Registered(Sge {
            lkey: LKey(0x1234_5678),
            offset: 0,
            len: 4,
        })];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                ..base
            },
        );
        assert!(
            matches!(err, FabricError::ProtectionError { .. }),
            "unknown key: {err}"
        );
        let sg = [Gather::Registered(Sge {
            lkey,
            offset: 4090,
            len: 10,
        })];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                ..base
            },
        );
        assert!(
            matches!(err, FabricError::ProtectionError { .. }),
            "out of range: {err}"
        );
        let sg = [Gather::User {
            lkey: user.lkey,
            data: &region[20..40],
        }];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                ..base
            },
        );
        assert!(
            matches!(err, FabricError::ProtectionError { .. }),
            "outside user range: {err}"
        );
        let sg = [Gather::Registered(Sge {
            lkey: user.lkey,
            offset: 0,
            len: 4,
        })];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                ..base
            },
        );
        assert!(
            matches!(err, FabricError::ProtectionError { .. }),
            "user key as owned: {err}"
        );
        let big = vec![0u8; 4097];
        let sg = [Gather::User {
            lkey: LKey(0),
            data: &big,
        }];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                ..base
            },
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
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                flags: SendFlags::INLINE,
                ..base
            },
        );
        assert!(matches!(err, FabricError::MessageTooLong { .. }), "{err}");
        let sg = [Gather::User {
            lkey: LKey(0),
            data: &big[..33],
        }];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                flags: SendFlags::INLINE,
                ..base
            },
        );
        assert!(
            matches!(err, FabricError::InlineTooLong { len: 33, max: 32 }),
            "{err}"
        );
        let sg = [Gather::Registered(Sge {
            lkey,
            offset: 0,
            len: 1,
        }); 3];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                ..base
            },
        );
        assert!(
            matches!(err, FabricError::InvalidArgument { .. }),
            "too many SGEs: {err}"
        );

        let gone = a.ah_to(b.port_id);
        a.ctx.destroy_ah(gone).unwrap();
        let sg = [Gather::Registered(Sge {
            lkey,
            offset: 0,
            len: 4,
        })];
        let err = post(
            &mut a,
            SendWr {
                sg_list: &sg,
                ah: gone,
                ..base
            },
        );
        assert!(
            matches!(err, FabricError::InvalidHandle { .. }),
            "destroyed AH: {err}"
        );

        // Send queue room counts the sends the wrapper completed.
        let signaled = SendWr {
            sg_list: &sg,
            flags: SendFlags::SIGNALED,
            ..base
        };
        a.ctx.post_send(a.qp.handle, &[signaled, signaled]).unwrap();
        let err = post(&mut a, signaled);
        assert!(
            matches!(err, FabricError::QueueFull { capacity: 2, .. }),
            "{err}"
        );

        // A queue pair not in RTS.
        let cap = QpCap {
            max_send_wr: 2,
            max_recv_wr: 2,
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
            .unwrap();
        a.ctx
            .modify_qp(
                qp.handle,
                &QpTransition::Init {
                    pkey_index: 0,
                    qkey: QKEY,
                    port: 1,
                },
            )
            .unwrap();
        let err = a
            .ctx
            .post_send(
                qp.handle,
                &[SendWr {
                    sg_list: &sg,
                    ..base
                }],
            )
            .unwrap_err();
        assert!(matches!(
            err.error,
            FabricError::InvalidState {
                state: QpState::Init,
                ..
            }
        ));

        let wcs = a.poll();
        assert_eq!(wcs.iter().map(|wc| wc.byte_len).collect::<Vec<_>>(), [4, 4]);
        assert_eq!(
            net.stats().sent,
            if config.drop > 0.0 { 0 } else { 2 },
            "{config:?}"
        );
        let expected = if config.drop > 0.0 {
            FaultStats {
                dropped: 2,
                ..FaultStats::default()
            }
        } else {
            FaultStats {
                reordered: 2,
                ..FaultStats::default()
            }
        };
        assert_eq!(a.ctx.fault_stats(), expected);
    }
}

#[test]
fn held_sends_carry_their_bytes_and_leave_at_the_next_poll() {
    let config = FaultConfig {
        reorder: 1.0,
        ..FaultConfig::default()
    };
    let (net, mut a, mut b) = setup(config, 16);
    let ah = a.ah_to(b.port_id);
    let before = a.ctx.resources();
    for seq in 0..3u32 {
        a.send(
            ah,
            b.qp.qp_num,
            &pattern(seq, 40),
            u64::from(seq),
            SendFlags::NONE,
        )
        .unwrap();
    }
    // The bytes were copied: overwriting the send buffer changes nothing.
    a.ctx.mr_bytes_mut(a.send_mr.handle).unwrap().fill(0xee);
    a.send(ah, b.qp.qp_num, &[], 3, SendFlags::NONE).unwrap();
    assert_eq!(net.stats().sent, 0, "everything is held");
    assert!(b.receive().is_empty());
    assert_eq!(
        a.ctx.resources(),
        before,
        "the wrapper's copies are not the caller's"
    );
    assert_eq!(a.ctx.inner().resources().mrs, before.mrs + 3);

    assert!(a.poll().is_empty());
    let got = b.receive();
    let expected: Vec<(u32, Vec<u8>)> = (0..3)
        .map(|seq| (seq, pattern(seq, 40)))
        .chain([(3, Vec::new())])
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        a.ctx.inner().resources(),
        before,
        "copies are freed once posted"
    );

    // Teardown with a send still held: it leaves, and nothing leaks.
    a.send(ah, b.qp.qp_num, b"last", 4, SendFlags::NONE)
        .unwrap();
    let ctx = &mut a.ctx;
    ctx.destroy_ah(ah).unwrap();
    ctx.destroy_qp(a.qp.handle).unwrap();
    assert_eq!(
        ctx.fault_stats().release_failures,
        1,
        "its address handle was gone"
    );
    ctx.destroy_cq(a.cq).unwrap();
    ctx.dereg_mr(a.recv_mr.handle).unwrap();
    ctx.dereg_mr(a.send_mr.handle).unwrap();
    ctx.dealloc_pd(a.pd).unwrap();
    assert!(ctx.resources().is_empty(), "{:?}", ctx.resources());
    assert!(
        ctx.inner().resources().is_empty(),
        "{:?}",
        ctx.inner().resources()
    );
}

#[test]
fn an_inactive_configuration_passes_everything_through() {
    let (net, mut a, mut b) = setup(FaultConfig::default(), 16);
    let ah = a.ah_to(b.port_id);
    for seq in 0..100u32 {
        a.send(
            ah,
            b.qp.qp_num,
            &pattern(seq, 8),
            u64::from(seq),
            SendFlags::SIGNALED,
        )
        .unwrap();
        assert_eq!(a.poll().len(), 1);
    }
    let got = b.receive();
    assert_eq!(got.len(), 100);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, (seq, _))| *seq as usize == i)
    );
    assert_eq!(a.ctx.fault_stats(), FaultStats::default());
    assert_eq!(net.stats().sent, 100);
}
