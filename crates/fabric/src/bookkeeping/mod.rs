//! Resource bookkeeping and the checks verbs performs, shared by providers.
//!
//! A provider keeps one [`Verbs`] and adds what is its own: the transport
//! behind each queue pair (`Q`) and the resolved route behind each address
//! handle (`A`). Everything a real HCA would refuse, this module refuses the
//! same way for every provider.
//!
//! This is not the `verbs` provider (that is [`crate::ibv`]): it is the
//! queue-pair and resource tables every provider, that one included, keeps.
//! The entries and [`Verbs`] are here; creating and destroying resources is
//! in `resources`, checking and completing posted work in `post`.

mod post;
mod resources;

use std::collections::VecDeque;

use crate::table::{Handle, Table};
use crate::types::*;
use crate::{FabricError, Result};

/// Implements the [`Context`](crate::Context) methods that every provider
/// answers from its `verbs: Verbs<_, _>` field alone, so that providers
/// write only what is theirs (transports, routes, polling).
macro_rules! delegate_to_verbs {
    () => {
        fn device(&self) -> &$crate::DeviceInfo {
            &self.verbs.device
        }

        fn alloc_pd(&mut self) -> $crate::Result<$crate::PdHandle> {
            Ok(self.verbs.alloc_pd())
        }

        fn dealloc_pd(&mut self, pd: $crate::PdHandle) -> $crate::Result<()> {
            self.verbs.dealloc_pd(pd)
        }

        fn reg_mr(&mut self, pd: $crate::PdHandle, len: usize) -> $crate::Result<$crate::Mr> {
            self.verbs.reg_mr(pd, len)
        }

        fn reg_user_mr(
            &mut self,
            pd: $crate::PdHandle,
            region: &[u8],
        ) -> $crate::Result<$crate::Mr> {
            self.verbs.reg_user_mr(pd, region)
        }

        fn dereg_mr(&mut self, mr: $crate::MrHandle) -> $crate::Result<()> {
            self.verbs.dereg_mr(mr)
        }

        fn mr_bytes(&self, mr: $crate::MrHandle) -> $crate::Result<&[u8]> {
            self.verbs.mr_bytes(mr)
        }

        fn mr_bytes_mut(&mut self, mr: $crate::MrHandle) -> $crate::Result<&mut [u8]> {
            self.verbs.mr_bytes_mut(mr)
        }

        fn mr_bytes_pair(
            &mut self,
            from: $crate::MrHandle,
            to: $crate::MrHandle,
        ) -> $crate::Result<(&[u8], &mut [u8])> {
            self.verbs.mr_bytes_pair(from, to)
        }

        fn create_cq(&mut self, depth: u32) -> $crate::Result<$crate::CqHandle> {
            self.verbs.create_cq(depth)
        }

        fn destroy_cq(&mut self, cq: $crate::CqHandle) -> $crate::Result<()> {
            self.verbs.destroy_cq(cq)
        }

        fn modify_qp(
            &mut self,
            qp: $crate::QpHandle,
            transition: &$crate::QpTransition,
        ) -> $crate::Result<()> {
            self.verbs.modify_qp(qp, transition)
        }

        fn qp_state(&self, qp: $crate::QpHandle) -> $crate::Result<$crate::QpState> {
            Ok(self.verbs.qp(qp)?.state)
        }

        fn destroy_ah(&mut self, ah: $crate::AhHandle) -> $crate::Result<()> {
            self.verbs.destroy_ah(ah)
        }
    };
}
pub(crate) use delegate_to_verbs;

/// Largest number of registrations; lkeys carry the slot index in 16 bits.
const MAX_MR: u32 = 1 << 16;

#[derive(Debug, Default)]
pub(crate) struct PdEntry {
    /// Registrations, queue pairs and address handles in this domain.
    users: usize,
}

#[derive(Debug)]
pub(crate) enum Memory {
    /// Memory the provider allocated and owns.
    Owned(Box<[u8]>),
    /// The address range of caller memory; never dereferenced.
    User { start: usize, len: usize },
}

#[derive(Debug)]
pub(crate) struct MrEntry {
    pd: PdHandle,
    lkey: LKey,
    pub(crate) memory: Memory,
}

#[derive(Debug)]
pub(crate) struct CqEntry {
    depth: usize,
    /// Completions not yet polled, with the queue pair each belongs to.
    queue: VecDeque<(WorkCompletion, QpHandle)>,
    attached: usize,
}

impl CqEntry {
    /// Completions that can still be queued before the CQ overruns.
    pub(crate) fn room(&self) -> usize {
        self.depth.saturating_sub(self.queue.len())
    }

    /// Queues a completion. Callers check [`CqEntry::room`] first.
    pub(crate) fn push(&mut self, wc: WorkCompletion, qp: QpHandle) {
        self.queue.push_back((wc, qp));
    }

    /// Completions waiting to be polled.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }
}

#[derive(Debug)]
pub(crate) struct QpEntry<Q> {
    pub(crate) pd: PdHandle,
    pub(crate) send_cq: CqHandle,
    pub(crate) recv_cq: CqHandle,
    pub(crate) qp_num: u32,
    pub(crate) state: QpState,
    pub(crate) cap: QpCap,
    pub(crate) qkey: u32,
    pub(crate) pkey: u16,
    pub(crate) port: u8,
    /// Posted receives, in posting order.
    pub(crate) recv_queue: VecDeque<RecvWr>,
    /// Signaled sends whose completion has not been polled.
    pub(crate) sends_outstanding: u32,
    /// The provider's transport.
    pub(crate) transport: Q,
}

impl<Q> QpEntry<Q> {
    /// `true` when the queue pair may accept incoming datagrams.
    pub(crate) fn can_receive(&self) -> bool {
        matches!(self.state, QpState::Rtr | QpState::Rts)
    }

    /// Decides whether a datagram carrying these keys is accepted, counting
    /// it in `stats` if not.
    pub(crate) fn admit(&self, pkey: u16, qkey: u32, stats: &mut FabricStats) -> bool {
        if !self.can_receive() {
            stats.rx_not_ready += 1;
            false
        } else if qkey != self.qkey {
            stats.rx_bad_qkey += 1;
            false
        } else if !pkey_matches(pkey, self.pkey) {
            stats.rx_bad_pkey += 1;
            false
        } else {
            true
        }
    }
}

/// Partition keys match when their low 15 bits agree and at least one of
/// them is a full member (top bit set), as the InfiniBand spec requires.
fn pkey_matches(a: u16, b: u16) -> bool {
    (a & 0x7fff) == (b & 0x7fff) && (a | b) & 0x8000 != 0
}

#[derive(Debug)]
pub(crate) struct AhEntry<A> {
    pd: PdHandle,
    pub(crate) route: A,
}

/// The state every provider keeps, minus its transport.
#[derive(Debug)]
pub(crate) struct Verbs<Q, A> {
    pub(crate) device: DeviceInfo,
    pub(crate) ports: Vec<PortAttr>,
    pds: Table<PdEntry>,
    pub(crate) mrs: Table<MrEntry>,
    pub(crate) cqs: Table<CqEntry>,
    pub(crate) qps: Table<QpEntry<Q>>,
    pub(crate) ahs: Table<AhEntry<A>>,
    pub(crate) stats: FabricStats,
}

fn invalid(kind: &'static str) -> FabricError {
    FabricError::InvalidHandle { kind }
}

/// Completion queue `cq` of the table `cqs`, for code that holds other
/// tables of a [`Verbs`] borrowed at the same time (a queue pair and its
/// receive completion queue, when datagrams land).
pub(crate) fn cq_in(cqs: &mut Table<CqEntry>, cq: CqHandle) -> Result<&mut CqEntry> {
    cqs.get_mut(cq.0).ok_or_else(|| invalid("completion queue"))
}

impl<Q, A> Verbs<Q, A> {
    pub(crate) fn new(device: DeviceInfo, ports: Vec<PortAttr>) -> Self {
        Self {
            device,
            ports,
            pds: Table::default(),
            mrs: Table::default(),
            cqs: Table::default(),
            qps: Table::default(),
            ahs: Table::default(),
            stats: FabricStats::default(),
        }
    }

    pub(crate) fn port(&self, port: u8) -> Result<&PortAttr> {
        self.ports
            .iter()
            .find(|p| p.port_num == port)
            .ok_or_else(|| FabricError::NoSuchPort {
                device: self.device.name.clone(),
                port,
            })
    }

    pub(crate) fn resources(&self) -> ResourceCounts {
        ResourceCounts {
            pds: self.pds.len(),
            mrs: self.mrs.len(),
            cqs: self.cqs.len(),
            qps: self.qps.len(),
            ahs: self.ahs.len(),
        }
    }
}

/// The key of a registration: its slot index and low generation bits, so a
/// stale key is refused once the slot is reused.
fn lkey_of(handle: Handle) -> LKey {
    LKey(((handle.generation() & 0xffff) << 16) | (handle.index() & 0xffff))
}

fn user_memory_error() -> FabricError {
    FabricError::InvalidArgument {
        what: "memory registration",
        detail: "caller memory is only readable by its owner".into(),
    }
}
