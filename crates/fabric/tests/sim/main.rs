//! The `sim` provider: the verbs contract, and the fault model measured over
//! long seeded streams.
// Helpers outside `#[test]` functions unwrap too; clippy's
// allow-unwrap-in-tests does not reach them, and a test should fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use udbtl_fabric::sim::{LinkConfig, SimContext, SimDeviceSpec, SimNetStats, SimNetwork};
use udbtl_fabric::*;

#[path = "../common/mod.rs"]
mod common;

use common::assert_rate;

mod faults;
mod posting;
mod verbs_flow;

const QKEY: u32 = 0x0133_0133;

/// How to build a [`Node`].
#[derive(Debug, Clone, Copy)]
struct Opts {
    slots: usize,
    slot_len: usize,
    max_send_wr: u32,
    cq_depth: u32,
    qkey: u32,
    /// Post every receive slot at start.
    post: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            slots: 64,
            slot_len: 256,
            max_send_wr: 64,
            cq_depth: 256,
            qkey: QKEY,
            post: true,
        }
    }
}

/// One queue pair in RTS with a slab of receive slots (slot `i` has
/// `wr_id == i`) and a send buffer.
struct Node {
    ctx: SimContext,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpInfo,
    port_id: u32,
    recv_mr: Mr,
    send_mr: Mr,
    opts: Opts,
}

impl Node {
    fn new(mut ctx: SimContext, opts: Opts) -> Self {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(opts.cq_depth).unwrap();
        let cap = QpCap {
            max_send_wr: opts.max_send_wr,
            max_recv_wr: opts.slots as u32,
            max_send_sge: 4,
            max_inline_data: 64,
        };
        let qp = common::ud_qp(&mut ctx, pd, cq, cap, opts.qkey);
        let recv_mr = ctx.reg_mr(pd, opts.slots * opts.slot_len).unwrap();
        let send_mr = ctx.reg_mr(pd, 8192).unwrap();
        let port_id = ctx.port_id(1).unwrap();
        let mut node = Self {
            ctx,
            pd,
            cq,
            qp,
            port_id,
            recv_mr,
            send_mr,
            opts,
        };
        if opts.post {
            for slot in 0..opts.slots {
                node.post_slot(slot);
            }
        }
        node
    }

    fn addr(&self) -> QpAddr {
        QpAddr {
            node: NodeAddr::Sim(self.port_id),
            qpn: self.qp.qp_num,
        }
    }

    fn ah_to(&mut self, port_id: u32) -> AhHandle {
        let attr = AhAttr {
            dest: NodeAddr::Sim(port_id),
            service_level: 0,
            src_path_bits: 0,
            port: 1,
        };
        self.ctx.create_ah(self.pd, &attr).unwrap()
    }

    fn post_slot(&mut self, slot: usize) {
        let len = self.opts.slot_len;
        let sge = Sge {
            lkey: self.recv_mr.lkey,
            offset: slot * len,
            len,
        };
        self.ctx
            .post_recv(
                self.qp.handle,
                &[RecvWr {
                    wr_id: slot as u64,
                    sge,
                }],
            )
            .unwrap();
    }

    /// Copies `payload` into the send buffer and posts it.
    fn send(
        &mut self,
        ah: AhHandle,
        remote_qpn: u32,
        payload: &[u8],
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<(), PostError> {
        self.send_keyed(ah, remote_qpn, QKEY, payload, imm, flags)
    }

    fn send_keyed(
        &mut self,
        ah: AhHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        payload: &[u8],
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<(), PostError> {
        self.ctx.mr_bytes_mut(self.send_mr.handle).unwrap()[..payload.len()]
            .copy_from_slice(payload);
        let sg = [Gather::Registered(Sge {
            lkey: self.send_mr.lkey,
            offset: 0,
            len: payload.len(),
        })];
        let wr = SendWr {
            wr_id: 0,
            sg_list: &sg,
            ah,
            remote_qpn,
            remote_qkey,
            imm,
            flags,
        };
        self.ctx.post_send(self.qp.handle, &[wr])
    }

    /// Polls until the completion queue is empty.
    fn poll(&mut self) -> Vec<WorkCompletion> {
        let mut all = Vec::new();
        let mut wcs = [WorkCompletion::EMPTY; 32];
        loop {
            let n = self.ctx.poll_cq(self.cq, &mut wcs).unwrap();
            all.extend_from_slice(&wcs[..n]);
            if n == 0 {
                return all;
            }
        }
    }

    /// The payload of a successful receive completion.
    fn payload(&self, wc: &WorkCompletion) -> Vec<u8> {
        let start = wc.wr_id as usize * self.opts.slot_len + GRH_LEN;
        self.ctx.mr_bytes(self.recv_mr.handle).unwrap()[start..start + wc.payload_len()].to_vec()
    }
}

/// Two hosts with one single-port device each, on a network seeded `seed`.
fn pair_with(seed: u64, a: Opts, b: Opts) -> (SimNetwork, Node, Node) {
    let net = SimNetwork::new(seed);
    let host_a = net.add_device("hca0", 1).unwrap();
    let host_b = net.add_device("hca1", 1).unwrap();
    let a = Node::new(host_a.open("hca0").unwrap(), a);
    let b = Node::new(host_b.open("hca1").unwrap(), b);
    (net, a, b)
}

fn pair(seed: u64) -> (SimNetwork, Node, Node) {
    pair_with(seed, Opts::default(), Opts::default())
}

/// Every datagram is in exactly one place.
fn assert_conserved(net: &SimNetwork) {
    let s = net.stats();
    assert_eq!(
        s.sent + s.duplicated,
        s.delivered + s.dropped() + net.in_flight() as u64,
        "datagrams were created or lost by the network bookkeeping: {s:?}"
    );
}

fn assert_post_err(result: Result<(), PostError>, posted: usize) -> FabricError {
    let err = result.expect_err("the post should have been refused");
    assert_eq!(err.posted, posted, "refused at the wrong index: {err}");
    err.error
}
