//! The `verbs` provider's safe layer: the [`Context`] over the objects
//! of [`sys`], [`VerbsContext`].
//!
//! The shared bookkeeping ([`Verbs`]) checks every call exactly as it does
//! for `udp` and `sim` (handles, states, keys, bounds, queue room), and
//! holds the caller-visible memory registrations. The hardware holds only
//! what the provider posts: each queue pair's receive and send staging
//! slots, registered with `IBV_ACCESS_LOCAL_WRITE`.
//!
//! * A receive is posted into a free staging slot of its queue pair, with
//!   the caller buffer's length (capped at the slot), so the device writes
//!   the 40-byte GRH and then the payload there and reports an overlong
//!   datagram itself. When the completion is polled, inside
//!   [`Context::poll_cq`], the filled bytes (GRH included) are copied to the
//!   caller's buffer at the same offsets: the layout of [`GRH_LEN`](crate::GRH_LEN).
//! * A send is copied into a free send slot when posted (inline when it
//!   fits the granted inline limit), so the caller's bytes are consumed
//!   when `post_send` returns, as the fabric contract says. Every send is
//!   signaled to the device; completions the caller did not ask for are
//!   consumed inside `poll_cq` and only free their slot.
//!
//! The copy keeps the fabric contract sound on hardware that writes memory
//! asynchronously: the caller's registrations are never reachable by the
//! device.
//!
//! This file holds the context's state and the [`Context`] implementation,
//! with the verbs on protection domains, registrations, completion queues
//! and address handles. The rest is spread by seam, and the implementation
//! calls into it: [`device`](super::device) opens the device and builds the
//! context, [`qp`](super::qp) creates queue pairs and moves them through
//! their states, [`post`](super::post) posts receives and sends, and
//! [`poll`](super::poll) turns device completions into caller completions
//! and reads asynchronous events.

use std::collections::HashMap;
use std::time::Duration;

use super::logic::{self, AhSpec, Gid, IBV_PORT_ACTIVE, LocalPort, RecvLayout, SlotPool, Verb};
use super::sys::{self, Completion, UdQp};
use crate::bookkeeping::Verbs;
use crate::{
    AhAttr, AhHandle, CompletionChannel, Context, CqHandle, DeviceInfo, FabricError, FabricStats,
    Mr, MrHandle, NodeAddr, PdHandle, PortAttr, PortState, PostError, QpAddr, QpHandle, QpInfo,
    QpInitAttr, QpState, QpTransition, RecvWr, ResourceCounts, Result, SendWr, WorkCompletion,
};

/// A queue pair's hardware half.
#[derive(Debug)]
pub(super) struct HwQp {
    pub(super) hw: UdQp,
    pub(super) recv_layout: RecvLayout,
    pub(super) recv_slots: SlotPool,
    /// The caller's receive posted in each staging slot.
    pub(super) recv_wrs: Vec<Option<RecvWr>>,
    /// `(wr_id, signaled)` of the send in each staging slot.
    pub(super) sends: Vec<Option<(u64, bool)>>,
    pub(super) send_cq: CqHandle,
    pub(super) recv_cq: CqHandle,
}

#[derive(Debug)]
pub(super) struct HwCq {
    pub(super) cq: sys::Cq,
    /// Work requests that queue pairs on this queue may have posted at once:
    /// the device's queue is kept at least this large, so it cannot overrun.
    pub(super) attached_wrs: u32,
}

/// An opened RDMA device.
///
/// Fields drop in declaration order: hardware queue pairs first, then
/// queues, domains, and the device last (each child also holds its
/// parent).
#[derive(Debug)]
pub struct VerbsContext {
    pub(super) verbs: Verbs<(), sys::Ah>,
    pub(super) qps: HashMap<QpHandle, HwQp>,
    pub(super) cqs: HashMap<CqHandle, HwCq>,
    pub(super) pds: HashMap<PdHandle, sys::Pd>,
    pub(super) locals: Vec<LocalPort>,
    pub(super) max_payload: usize,
    pub(super) qp_nums: HashMap<u32, QpHandle>,
    /// GIDs of remote ports by LID, learned from the address handles made:
    /// a LID-routed receive carries no GRH, but the peer's published
    /// address has its GID.
    pub(super) peers_by_lid: HashMap<u16, [u8; 16]>,
    /// LIDs of remote ports by GID, for receives that carry a GRH.
    pub(super) lids_by_gid: HashMap<[u8; 16], u16>,
    pub(super) polls: u32,
    /// Set by a fatal asynchronous event; every later poll fails with it.
    pub(super) fatal: Option<String>,
    pub(super) scratch: Vec<Completion>,
    pub(super) device: sys::Device,
}

/// Most completions moved from the device per `ibv_poll_cq` call.
pub(super) const POLL_BATCH: usize = 32;

pub(super) fn invalid(kind: &'static str) -> FabricError {
    FabricError::InvalidHandle { kind }
}

impl VerbsContext {
    pub(super) fn errno(&self, verb: Verb, errno: sys::Errno) -> FabricError {
        logic::errno_error(verb, errno, &self.verbs.device.name)
    }

    /// The full address of a queue pair, as peers address it.
    ///
    /// # Errors
    /// Bad handle, or a queue pair not bound to a port yet.
    pub fn qp_addr(&self, qp: QpHandle) -> Result<QpAddr> {
        let entry = self.verbs.qp(qp)?;
        let port = self.verbs.port(entry.port.max(1))?;
        Ok(QpAddr {
            node: port.addr,
            qpn: entry.qp_num,
        })
    }
}

/// The host's monotonic clock from a process-wide epoch.
fn monotonic_since_epoch() -> Duration {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed()
}

impl Context for VerbsContext {
    fn device(&self) -> &DeviceInfo {
        &self.verbs.device
    }

    /// The port as opened, with its state and LID read again from the
    /// device.
    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = self.verbs.port(port)?.clone();
        if let Ok(raw) = self.device.query_port(port) {
            if raw.state != IBV_PORT_ACTIVE {
                attr.state = PortState::Down;
            }
        }
        Ok(attr)
    }

    fn alloc_pd(&mut self) -> Result<PdHandle> {
        let hw = self
            .device
            .alloc_pd()
            .map_err(|errno| self.errno(Verb::AllocPd, errno))?;
        let pd = self.verbs.alloc_pd();
        self.pds.insert(pd, hw);
        Ok(pd)
    }

    fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()> {
        self.verbs.dealloc_pd(pd)?;
        self.pds.remove(&pd);
        Ok(())
    }

    fn reg_mr(&mut self, pd: PdHandle, len: usize) -> Result<Mr> {
        self.verbs.reg_mr(pd, len)
    }

    fn reg_user_mr(&mut self, pd: PdHandle, region: &[u8]) -> Result<Mr> {
        self.verbs.reg_user_mr(pd, region)
    }

    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()> {
        self.verbs.dereg_mr(mr)
    }

    fn mr_bytes(&self, mr: MrHandle) -> Result<&[u8]> {
        self.verbs.mr_bytes(mr)
    }

    fn mr_bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8]> {
        self.verbs.mr_bytes_mut(mr)
    }

    fn mr_bytes_pair(&mut self, from: MrHandle, to: MrHandle) -> Result<(&[u8], &mut [u8])> {
        self.verbs.mr_bytes_pair(from, to)
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqHandle> {
        let cq = self.verbs.create_cq(depth)?;
        match self.device.create_cq(depth) {
            Ok(hw) => {
                self.cqs.insert(
                    cq,
                    HwCq {
                        cq: hw,
                        attached_wrs: 0,
                    },
                );
                Ok(cq)
            }
            Err(errno) => {
                let _ = self.verbs.destroy_cq(cq);
                Err(self.errno(Verb::CreateCq, errno))
            }
        }
    }

    fn destroy_cq(&mut self, cq: CqHandle) -> Result<()> {
        self.verbs.destroy_cq(cq)?;
        self.cqs.remove(&cq);
        Ok(())
    }

    fn create_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo> {
        self.create_hw_qp(pd, attr)
    }

    fn modify_qp(&mut self, qp: QpHandle, transition: &QpTransition) -> Result<()> {
        self.modify_hw_qp(qp, transition)
    }

    fn qp_state(&self, qp: QpHandle) -> Result<QpState> {
        Ok(self.verbs.qp(qp)?.state)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        self.destroy_hw_qp(qp)
    }

    fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let NodeAddr::Ib { lid, gid } = attr.dest else {
            return Err(FabricError::InvalidArgument {
                what: "address handle",
                detail: format!("{} is not an InfiniBand or RoCE address", attr.dest),
            });
        };
        self.verbs.port(attr.port)?;
        let local = self
            .locals
            .iter()
            .find(|l| l.port == attr.port)
            .ok_or_else(|| FabricError::NoSuchPort {
                device: self.verbs.device.name.clone(),
                port: attr.port,
            })?;
        let spec = AhSpec::build(local, lid, Gid(gid), attr.service_level, attr.src_path_bits)?;
        let hw_pd = self
            .pds
            .get(&pd)
            .ok_or_else(|| invalid("protection domain"))?;
        let ah = hw_pd
            .create_ah(&spec)
            .map_err(|errno| self.errno(Verb::CreateAh, errno))?;
        let handle = self.verbs.insert_ah(pd, attr, ah)?;
        self.peers_by_lid.insert(lid, gid);
        self.lids_by_gid.insert(gid, lid);
        Ok(handle)
    }

    fn destroy_ah(&mut self, ah: AhHandle) -> Result<()> {
        // Sends still posted keep the hardware handle alive until their
        // completions are polled.
        self.verbs.destroy_ah(ah)
    }

    fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.post_recv_hw(qp, wrs)
    }

    fn check_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        self.check_send_hw(qp, wr)
    }

    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.post_send_hw(qp, wrs)
    }

    fn poll_cq(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        self.poll_hw(cq, out)
    }

    /// `None`: blocking on an `ibv_comp_channel` is not wired up yet; poll.
    fn completion_channel(&mut self, cq: CqHandle) -> Result<Option<CompletionChannel>> {
        self.verbs
            .cqs
            .get(cq.0)
            .ok_or_else(|| invalid("completion queue"))?;
        Ok(None)
    }

    fn now(&self) -> Duration {
        monotonic_since_epoch()
    }

    fn stats(&self) -> FabricStats {
        self.verbs.stats
    }

    fn resources(&self) -> ResourceCounts {
        self.verbs.resources()
    }
}
