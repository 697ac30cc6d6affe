//! The `faulty` wrapper over the `sim` provider: realized fault rates, the
//! checks it keeps, completion order, and its configuration parser.
// Helpers outside `#[test]` functions unwrap too; clippy's
// allow-unwrap-in-tests does not reach them, and a test should fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};

use udbtl_fabric::faulty::{
    ENV_DROP, ENV_DUPLICATE, ENV_REORDER, ENV_SEED, FaultConfig, FaultConfigError, FaultStats,
    FaultyContext, FaultyProvider,
};
use udbtl_fabric::sim::{SimContext, SimNetwork};
use udbtl_fabric::*;

#[path = "../common/mod.rs"]
mod common;

use common::assert_rate;

const QKEY: u32 = 0x0133_0133;
const SLOT: usize = 128;

/// One queue pair in RTS with `slots` posted receive slots (`wr_id` = slot).
struct Ep<C: Context> {
    ctx: C,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpInfo,
    port_id: u32,
    recv_mr: Mr,
    send_mr: Mr,
}

impl<C: Context> Ep<C> {
    fn new(mut ctx: C, slots: usize, max_send_wr: u32) -> Self {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4096).unwrap();
        let cap = QpCap {
            max_send_wr,
            max_recv_wr: slots as u32,
            max_send_sge: 2,
            max_inline_data: 32,
        };
        let qp = common::ud_qp(&mut ctx, pd, cq, cap, QKEY);
        let recv_mr = ctx.reg_mr(pd, slots * SLOT).unwrap();
        let send_mr = ctx.reg_mr(pd, 4096).unwrap();
        let NodeAddr::Sim(port_id) = ctx.query_port(1).unwrap().addr else {
            panic!("a sim port has a sim address")
        };
        let mut ep = Self {
            ctx,
            pd,
            cq,
            qp,
            port_id,
            recv_mr,
            send_mr,
        };
        for slot in 0..slots {
            ep.repost(slot);
        }
        ep
    }

    fn repost(&mut self, slot: usize) {
        let sge = Sge {
            lkey: self.recv_mr.lkey,
            offset: slot * SLOT,
            len: SLOT,
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

    fn ah_to(&mut self, port_id: u32) -> AhHandle {
        let attr = AhAttr {
            dest: NodeAddr::Sim(port_id),
            service_level: 0,
            src_path_bits: 0,
            port: 1,
        };
        self.ctx.create_ah(self.pd, &attr).unwrap()
    }

    /// An unsignaled send without a gather list, to fill in.
    fn wr(&self, ah: AhHandle, qpn: u32) -> SendWr<'static> {
        SendWr {
            wr_id: 0,
            sg_list: &[],
            ah,
            remote_qpn: qpn,
            remote_qkey: QKEY,
            imm: None,
            flags: SendFlags::NONE,
        }
    }

    /// Copies `payload` into the send buffer and posts it.
    fn send(
        &mut self,
        ah: AhHandle,
        qpn: u32,
        payload: &[u8],
        wr_id: u64,
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
            wr_id,
            sg_list: &sg,
            ah,
            remote_qpn: qpn,
            remote_qkey: QKEY,
            imm: Some(wr_id as u32),
            flags,
        };
        self.ctx.post_send(self.qp.handle, &[wr])
    }

    fn poll(&mut self) -> Vec<WorkCompletion> {
        let mut all = Vec::new();
        let mut wcs = [WorkCompletion::EMPTY; 16];
        loop {
            let n = self.ctx.poll_cq(self.cq, &mut wcs).unwrap();
            all.extend_from_slice(&wcs[..n]);
            if n == 0 {
                return all;
            }
        }
    }

    /// Receives everything that arrived: (imm, payload), reposting buffers.
    fn receive(&mut self) -> Vec<(u32, Vec<u8>)> {
        let mut got = Vec::new();
        for wc in self.poll() {
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(wc.opcode, WcOpcode::Recv);
            let start = wc.wr_id as usize * SLOT + GRH_LEN;
            let bytes = self.ctx.mr_bytes(self.recv_mr.handle).unwrap();
            got.push((
                wc.imm.unwrap(),
                bytes[start..start + wc.payload_len()].to_vec(),
            ));
            self.repost(wc.wr_id as usize);
        }
        got
    }
}

/// A faulty sender and a plain receiver on one lossless sim network.
fn setup(
    config: FaultConfig,
    max_send_wr: u32,
) -> (SimNetwork, Ep<FaultyContext<SimContext>>, Ep<SimContext>) {
    let net = SimNetwork::new(1);
    let faulty = FaultyProvider::new(net.add_device("hca0", 1).unwrap(), config).unwrap();
    let plain = net.add_device("hca1", 1).unwrap();
    assert_eq!(faulty.name(), "sim");
    assert_eq!(faulty.devices().unwrap(), faulty.inner().devices().unwrap());
    let a = Ep::new(faulty.open("hca0").unwrap(), 16, max_send_wr);
    let b = Ep::new(plain.open("hca1").unwrap(), 512, 16);
    (net, a, b)
}

fn pattern(seq: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq as usize * 29 + i * 3) as u8)
        .collect()
}

mod configuration;
mod fates;
