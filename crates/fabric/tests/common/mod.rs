//! Shared set-up for provider tests: one queue pair with a slab of posted
//! receive buffers, the way the BTL builds its modules.
#![allow(dead_code, unreachable_pub)]
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use udbtl_fabric::*;

pub const QKEY: u32 = 0x0133_0133;
pub const BUF_LEN: usize = 2048 + GRH_LEN;

/// A queue pair in RTS with `slots` receive buffers posted.
pub struct Endpoint<C: Context> {
    pub ctx: C,
    pub pd: PdHandle,
    pub cq: CqHandle,
    pub qp: QpInfo,
    pub recv_mr: Mr,
    pub send_mr: Mr,
    pub slots: usize,
    pub buf_len: usize,
}

impl<C: Context> Endpoint<C> {
    pub fn new(ctx: C, slots: usize, qkey: u32) -> Self {
        Self::with_buffers(ctx, slots, BUF_LEN, qkey)
    }

    pub fn with_buffers(mut ctx: C, slots: usize, buf_len: usize, qkey: u32) -> Self {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq((slots + 256) as u32).unwrap();
        let cap = QpCap {
            max_send_wr: 128,
            max_recv_wr: slots as u32,
            max_send_sge: 2,
            max_inline_data: 128,
        };
        let qp = ud_qp(&mut ctx, pd, cq, cap, qkey);
        let recv_mr = ctx.reg_mr(pd, slots * buf_len).unwrap();
        let send_mr = ctx.reg_mr(pd, 256 * 1024).unwrap();
        let mut ep = Self {
            ctx,
            pd,
            cq,
            qp,
            recv_mr,
            send_mr,
            slots,
            buf_len,
        };
        for slot in 0..slots {
            ep.post_slot(slot);
        }
        ep
    }

    pub fn post_slot(&mut self, slot: usize) {
        let sge = Sge {
            lkey: self.recv_mr.lkey,
            offset: slot * self.buf_len,
            len: self.buf_len,
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

    pub fn ah(&mut self, dest: NodeAddr) -> AhHandle {
        self.ctx
            .create_ah(
                self.pd,
                &AhAttr {
                    dest,
                    service_level: 0,
                    src_path_bits: 0,
                    port: 1,
                },
            )
            .unwrap()
    }

    /// Sends `payload` (copied into the send slab, at a 4 KiB slot of its
    /// own per `wr_id` modulo 64).
    pub fn send(
        &mut self,
        ah: AhHandle,
        qpn: u32,
        qkey: u32,
        payload: &[u8],
        wr_id: u64,
    ) -> Result<(), PostError> {
        let offset = (wr_id as usize % 64) * 4096;
        self.send_from(offset, ah, qpn, qkey, payload, wr_id)
    }

    /// Sends `payload`, copied into the send slab at `offset`.
    pub fn send_from(
        &mut self,
        offset: usize,
        ah: AhHandle,
        qpn: u32,
        qkey: u32,
        payload: &[u8],
        wr_id: u64,
    ) -> Result<(), PostError> {
        self.ctx.mr_bytes_mut(self.send_mr.handle).unwrap()[offset..offset + payload.len()]
            .copy_from_slice(payload);
        let sg = [Gather::Registered(Sge {
            lkey: self.send_mr.lkey,
            offset,
            len: payload.len(),
        })];
        let wr = SendWr {
            wr_id,
            sg_list: &sg,
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
            imm: None,
            flags: SendFlags::SIGNALED,
        };
        self.ctx.post_send(self.qp.handle, &[wr])
    }

    /// Polls until `n` completions arrived or `timeout` passed.
    pub fn poll_for(&mut self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::EMPTY; 64];
        while out.len() < n && Instant::now() < deadline {
            let got = self.ctx.poll_cq(self.cq, &mut wcs).unwrap();
            out.extend_from_slice(&wcs[..got]);
        }
        out
    }

    /// Polls for `duration`, collecting everything.
    pub fn poll_during(&mut self, duration: Duration) -> Vec<WorkCompletion> {
        self.poll_for(usize::MAX, duration)
    }

    pub fn payload(&self, wc: &WorkCompletion) -> Vec<u8> {
        let offset = wc.wr_id as usize * self.buf_len + GRH_LEN;
        self.ctx.mr_bytes(self.recv_mr.handle).unwrap()[offset..offset + wc.payload_len()].to_vec()
    }

    pub fn teardown(mut self, ahs: &[AhHandle]) -> C {
        for ah in ahs {
            self.ctx.destroy_ah(*ah).unwrap();
        }
        self.ctx.destroy_qp(self.qp.handle).unwrap();
        self.ctx.destroy_cq(self.cq).unwrap();
        self.ctx.dereg_mr(self.recv_mr.handle).unwrap();
        self.ctx.dereg_mr(self.send_mr.handle).unwrap();
        self.ctx.dealloc_pd(self.pd).unwrap();
        assert!(
            self.ctx.resources().is_empty(),
            "leaked {:?}",
            self.ctx.resources()
        );
        self.ctx
    }
}

/// Posts 40 datagrams of 1400 B (the last one `last_len`), each filled
/// with its index, from `a` to queue pair `remote_qpn` behind `ah`,
/// presenting `qkey`: the first `first_post` in one post, the rest in a
/// second one if any are left.
pub fn post_forty<C: Context>(
    a: &mut Endpoint<C>,
    ah: AhHandle,
    remote_qpn: u32,
    qkey: u32,
    last_len: usize,
    first_post: usize,
) {
    post_forty_of(a, ah, remote_qpn, qkey, [1400, last_len], first_post);
}

/// [`post_forty`] with datagrams of `lens[0]` bytes (at most 1400), the
/// last one of `lens[1]`.
pub fn post_forty_of<C: Context>(
    a: &mut Endpoint<C>,
    ah: AhHandle,
    remote_qpn: u32,
    qkey: u32,
    lens: [usize; 2],
    first_post: usize,
) {
    let mr = a.send_mr;
    for i in 0..40usize {
        a.ctx.mr_bytes_mut(mr.handle).unwrap()[i * 1400..(i + 1) * 1400].fill(i as u8);
    }
    let sgs: Vec<[Gather<'_>; 1]> = (0..40)
        .map(|i| {
            [Gather::Registered(Sge {
                lkey: mr.lkey,
                offset: i * 1400,
                len: lens[usize::from(i == 39)],
            })]
        })
        .collect();
    let wrs = signaled_sends(&sgs, ah, remote_qpn, qkey);
    let (first, rest) = wrs.split_at(first_post.min(wrs.len()));
    for run in [first, rest].into_iter().filter(|run| !run.is_empty()) {
        a.ctx.post_send(a.qp.handle, run).unwrap();
    }
}

/// Signaled sends of `sgs`, one each, numbered from 0, to `remote_qpn`
/// through `ah` presenting `qkey`.
pub fn signaled_sends<'a>(
    sgs: &'a [[Gather<'a>; 1]],
    ah: AhHandle,
    remote_qpn: u32,
    qkey: u32,
) -> Vec<SendWr<'a>> {
    sgs.iter()
        .enumerate()
        .map(|(i, sg)| SendWr {
            wr_id: i as u64,
            sg_list: sg,
            ah,
            remote_qpn,
            remote_qkey: qkey,
            imm: None,
            flags: SendFlags::SIGNALED,
        })
        .collect()
}

/// Creates a UD queue pair on `cq` and moves it to RTS on port 1 with
/// `qkey`.
pub fn ud_qp<C: Context>(ctx: &mut C, pd: PdHandle, cq: CqHandle, cap: QpCap, qkey: u32) -> QpInfo {
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
    ctx.modify_qp(
        qp.handle,
        &QpTransition::Init {
            pkey_index: 0,
            qkey,
            port: 1,
        },
    )
    .unwrap();
    ctx.modify_qp(qp.handle, &QpTransition::Rtr).unwrap();
    ctx.modify_qp(qp.handle, &QpTransition::Rts { sq_psn: 0 })
        .unwrap();
    qp
}

/// Runs the `#[ignore]`d test `name` of this test binary as a child process,
/// with `env` set and stdout piped.
pub fn spawn_child(name: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.spawn().unwrap()
}

/// Asserts that `count` events in `n` trials fit a rate of `p`: within four
/// binomial standard deviations (a false failure about once in 16 000 runs;
/// with fixed seeds the outcome is reproducible anyway).
pub fn assert_rate(what: &str, count: u64, n: u64, p: f64) -> f64 {
    let realized = count as f64 / n as f64;
    let sigma = (p * (1.0 - p) / n as f64).sqrt();
    eprintln!(
        "{what}: {count}/{n} = {:.3}% (configured {:.3}%, tolerance ±{:.3} points)",
        realized * 100.0,
        p * 100.0,
        4.0 * sigma * 100.0
    );
    assert!(
        (realized - p).abs() <= 4.0 * sigma,
        "{what}: realized {realized} is more than 4σ ({sigma}) from {p}"
    );
    realized
}
