//! A simulated device with late send reads
//! ([`SimDeviceSpec::with_late_send_reads`]), as an RDMA adapter: while the
//! network holds sends, what is posted is checked but neither read, sent
//! nor completed; let go, it is read then, so the bytes written after the
//! post are the ones that leave. A device that reads at post time ignores
//! the hold.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use udbtl_fabric::sim::{SimContext, SimDeviceSpec, SimNetwork};
use udbtl_fabric::*;

mod common;

/// One queue pair in RTS with a registered buffer, on its own host.
struct End {
    ctx: SimContext,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpInfo,
    mr: Mr,
    port: u32,
}

fn end(net: &SimNetwork, name: &str, late_reads: bool) -> End {
    let provider = net.provider();
    let spec = SimDeviceSpec::new(name, 1);
    let spec = if late_reads {
        spec.with_late_send_reads()
    } else {
        spec
    };
    provider.add_device(spec).unwrap();
    let mut ctx = provider.open(name).unwrap();
    assert_eq!(ctx.device().sends_read_at_post, !late_reads);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_inline_data: 0,
    };
    let qp = common::ud_qp(&mut ctx, pd, cq, cap, common::QKEY);
    let mr = ctx.reg_mr(pd, 4096).unwrap();
    let port = ctx.port_id(1).unwrap();
    End {
        ctx,
        pd,
        cq,
        qp,
        mr,
        port,
    }
}

/// Sends "old!" from `a` to `b` while the network holds sends, writes
/// "new!" over it, lets sends go, and returns what `a`'s completion queue
/// held before and after, and the payload `b` received.
fn send_then_overwrite(late_reads: bool) -> (usize, usize, Vec<u8>) {
    let net = SimNetwork::new(5);
    let mut a = end(&net, "a", late_reads);
    let mut b = end(&net, "b", false);
    let slot = Sge {
        lkey: b.mr.lkey,
        offset: 0,
        len: 256,
    };
    b.ctx
        .post_recv(
            b.qp.handle,
            &[RecvWr {
                wr_id: 7,
                sge: slot,
            }],
        )
        .unwrap();
    let attr = AhAttr {
        dest: NodeAddr::Sim(b.port),
        service_level: 0,
        src_path_bits: 0,
        port: 1,
    };
    let ah = a.ctx.create_ah(a.pd, &attr).unwrap();
    a.ctx.mr_bytes_mut(a.mr.handle).unwrap()[..4].copy_from_slice(b"old!");
    net.hold_sends(true);
    let sg = [Gather::Registered(Sge {
        lkey: a.mr.lkey,
        offset: 0,
        len: 4,
    })];
    let wr = SendWr {
        wr_id: 1,
        sg_list: &sg,
        ah,
        remote_qpn: b.qp.qp_num,
        remote_qkey: common::QKEY,
        imm: None,
        flags: SendFlags::SIGNALED,
    };
    a.ctx.post_send(a.qp.handle, &[wr]).unwrap();
    let mut wcs = [WorkCompletion::EMPTY; 4];
    let while_held = a.ctx.poll_cq(a.cq, &mut wcs).unwrap();
    a.ctx.mr_bytes_mut(a.mr.handle).unwrap()[..4].copy_from_slice(b"new!");
    net.hold_sends(false);
    let after = a.ctx.poll_cq(a.cq, &mut wcs).unwrap();
    if after == 1 {
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    }
    net.advance(Duration::from_millis(10));
    assert_eq!(b.ctx.poll_cq(b.cq, &mut wcs).unwrap(), 1);
    let received =
        b.ctx.mr_bytes(b.mr.handle).unwrap()[GRH_LEN..GRH_LEN + wcs[0].payload_len()].to_vec();
    (while_held, after, received)
}

#[test]
fn a_late_reading_device_sends_what_its_memory_holds_when_let_go() {
    let (while_held, after, received) = send_then_overwrite(true);
    assert_eq!(while_held, 0, "no completion while sends are held");
    assert_eq!(after, 1, "the completion comes when they are let go");
    assert_eq!(received, b"new!");
}

#[test]
fn a_device_that_reads_at_post_ignores_the_hold() {
    let (while_held, after, received) = send_then_overwrite(false);
    assert_eq!(while_held, 1, "completed when posted");
    assert_eq!(after, 0);
    assert_eq!(received, b"old!");
}
