//! Device tests of the `verbs` provider. They need an RDMA device, named by
//! `UDBTL_TEST_VERBS_DEVICE` (e.g. `mlx5_0`, or `rxe0` for Soft-RoCE) when
//! the tests are built; without it each is ignored, `SKIPPED: needs an RDMA
//! device ...`. Run with
//! `UDBTL_TEST_VERBS_DEVICE=mlx5_0 cargo test -p udbtl-fabric --features verbs --test verbs_device -- --test-threads=1`.
#![cfg(feature = "verbs")]

use udbtl_fabric::ibv::{VerbsConfig, VerbsProvider};
use udbtl_fabric::{
    AhAttr, Context, GRH_LEN, Gather, PortState, Provider, QpCap, QpInitAttr, QpTransition, RecvWr,
    SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

const QKEY: u32 = 0x0133_0133;

/// The device `UDBTL_TEST_VERBS_DEVICE` names, or `None` after saying the
/// test is skipped (and recording it: see udbtl-prereq) when the variable
/// was set for the build but not for this run.
fn device() -> Option<String> {
    match std::env::var("UDBTL_TEST_VERBS_DEVICE") {
        Ok(name) if !name.is_empty() => Some(name),
        _ => {
            udbtl_prereq::skipped!("UDBTL_TEST_VERBS_DEVICE is not set (no RDMA device)");
            None
        }
    }
}

/// Runs on every machine: libibverbs loads and lists its devices (none here
/// is fine), which proves the shim links and runs.
#[test]
fn device_list_loads_without_a_device() {
    let devices = VerbsProvider::default()
        .devices()
        .expect("ibv_get_device_list");
    println!(
        "verbs devices: {:?}",
        devices.iter().map(|d| &d.name).collect::<Vec<_>>()
    );
    if let Some(name) = std::env::var("UDBTL_TEST_VERBS_DEVICE")
        .ok()
        .filter(|n| !n.is_empty())
    {
        assert!(devices.iter().any(|d| d.name == name), "{name} not listed");
    }
    match VerbsProvider::default().open("udbtl-no-such-device") {
        Err(udbtl_fabric::FabricError::NoSuchDevice { .. }) => {}
        other => panic!("expected NoSuchDevice, got {other:?}"),
    }
}

/// Two UD queue pairs on one port exchange a datagram each way; the
/// receive keeps the GRH in front of the payload and names its source.
#[test]
#[cfg_attr(
    udbtl_missing = "verbs_device",
    ignore = "SKIPPED: needs an RDMA device (build and run with UDBTL_TEST_VERBS_DEVICE=<device>)"
)]
fn round_trip_between_two_queue_pairs() {
    let Some(name) = device() else { return };
    let provider = VerbsProvider::new(VerbsConfig::default());
    let mut ctx = provider.open(&name).expect("open");
    let port = (1..=ctx.device().port_count)
        .find(|p| {
            ctx.query_port(*p)
                .is_ok_and(|a| a.state == PortState::Active)
        })
        .expect("an active port");
    let attr = ctx.query_port(port).expect("port");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64).expect("cq");
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_inline_data: 64,
    };
    let init = QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap,
    };
    let slot = GRH_LEN + attr.max_msg_size;
    let mr = ctx.reg_mr(pd, 4 * slot).expect("mr");
    let mut qps = Vec::new();
    for i in 0..2u64 {
        let qp = ctx.create_qp(pd, &init).expect("qp");
        ctx.modify_qp(
            qp.handle,
            &QpTransition::Init {
                pkey_index: 0,
                qkey: QKEY,
                port,
            },
        )
        .expect("init");
        ctx.modify_qp(qp.handle, &QpTransition::Rtr).expect("rtr");
        ctx.modify_qp(qp.handle, &QpTransition::Rts { sq_psn: 0 })
            .expect("rts");
        let sge = Sge {
            lkey: mr.lkey,
            offset: i as usize * slot,
            len: slot,
        };
        ctx.post_recv(
            qp.handle,
            &[RecvWr {
                wr_id: 100 + i,
                sge,
            }],
        )
        .expect("post_recv");
        qps.push(qp);
    }
    let ah = ctx
        .create_ah(
            pd,
            &AhAttr {
                dest: attr.addr,
                service_level: 0,
                src_path_bits: 0,
                port,
            },
        )
        .expect("ah");
    let payload = b"udbtl verbs round trip";
    for (from, to) in [(0, 1), (1, 0)] {
        let gather = [Gather::User {
            lkey: ctx.reg_user_mr(pd, payload).expect("user mr").lkey,
            data: payload,
        }];
        ctx.post_send(
            qps[from].handle,
            &[SendWr {
                wr_id: from as u64,
                sg_list: &gather,
                ah,
                remote_qpn: qps[to].qp_num,
                remote_qkey: QKEY,
                imm: Some(7),
                flags: SendFlags::SIGNALED,
            }],
        )
        .expect("post_send");
    }
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while seen.len() < 4 && std::time::Instant::now() < deadline {
        let mut out = [WorkCompletion::EMPTY; 8];
        let n = ctx.poll_cq(cq, &mut out).expect("poll");
        seen.extend_from_slice(&out[..n]);
    }
    assert_eq!(seen.len(), 4, "completions: {seen:?}");
    for wc in &seen {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.opcode == WcOpcode::Recv {
            assert_eq!(wc.payload_len(), payload.len());
            assert_eq!(wc.imm, Some(7));
            let at = (wc.wr_id - 100) as usize * slot + GRH_LEN;
            let bytes = ctx.mr_bytes(mr.handle).expect("bytes");
            assert_eq!(&bytes[at..at + payload.len()], payload);
            let src = wc.src.expect("source");
            assert_eq!(src.node, attr.addr, "source address resolves to the port's");
        }
    }
    ctx.destroy_ah(ah).expect("ah");
    for qp in qps {
        ctx.destroy_qp(qp.handle).expect("qp");
    }
    ctx.destroy_cq(cq).expect("cq");
    ctx.dereg_mr(mr.handle).expect("mr");
    assert_eq!(ctx.resources().pds, 1);
}
