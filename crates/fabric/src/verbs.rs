//! Resource bookkeeping and the checks verbs performs, shared by providers.
//!
//! A provider keeps one [`Verbs`] and adds what is its own: the transport
//! behind each queue pair (`Q`) and the resolved route behind each address
//! handle (`A`). Everything a real HCA would refuse, this module refuses the
//! same way for every provider.

use std::collections::VecDeque;

use crate::table::{Handle, Table};
use crate::types::*;
use crate::{FabricError, PostError, Result};

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

    // ----- protection domains -------------------------------------------

    pub(crate) fn alloc_pd(&mut self) -> PdHandle {
        PdHandle(self.pds.insert(PdEntry::default()))
    }

    pub(crate) fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()> {
        let entry = self
            .pds
            .get(pd.0)
            .ok_or_else(|| invalid("protection domain"))?;
        if entry.users > 0 {
            return Err(FabricError::Busy {
                kind: "protection domain",
                users: entry.users,
                user_kind: "registrations, queue pairs or address handles",
            });
        }
        self.pds.remove(pd.0);
        Ok(())
    }

    fn use_pd(&mut self, pd: PdHandle) -> Result<()> {
        let entry = self
            .pds
            .get_mut(pd.0)
            .ok_or_else(|| invalid("protection domain"))?;
        entry.users += 1;
        Ok(())
    }

    fn release_pd(&mut self, pd: PdHandle) {
        if let Some(entry) = self.pds.get_mut(pd.0) {
            entry.users = entry.users.saturating_sub(1);
        }
    }

    // ----- memory registration ------------------------------------------

    fn register(&mut self, pd: PdHandle, memory: Memory, len: usize) -> Result<Mr> {
        if len == 0 {
            return Err(FabricError::InvalidArgument {
                what: "memory region",
                detail: "length is zero".into(),
            });
        }
        if self.mrs.len() >= MAX_MR as usize {
            return Err(FabricError::ResourceExhausted {
                what: "memory registrations",
                limit: MAX_MR,
            });
        }
        self.use_pd(pd)?;
        let handle = self.mrs.insert(MrEntry {
            pd,
            lkey: LKey(0),
            memory,
        });
        let lkey = lkey_of(handle);
        if let Some(entry) = self.mrs.get_mut(handle) {
            entry.lkey = lkey;
        }
        Ok(Mr {
            handle: MrHandle(handle),
            lkey,
            len,
        })
    }

    pub(crate) fn reg_mr(&mut self, pd: PdHandle, len: usize) -> Result<Mr> {
        self.register(pd, Memory::Owned(vec![0u8; len].into_boxed_slice()), len)
    }

    pub(crate) fn reg_user_mr(&mut self, pd: PdHandle, region: &[u8]) -> Result<Mr> {
        let memory = Memory::User {
            start: region.as_ptr() as usize,
            len: region.len(),
        };
        self.register(pd, memory, region.len())
    }

    pub(crate) fn dereg_mr(&mut self, mr: MrHandle) -> Result<()> {
        let entry = self
            .mrs
            .remove(mr.0)
            .ok_or_else(|| invalid("memory registration"))?;
        self.release_pd(entry.pd);
        Ok(())
    }

    pub(crate) fn mr_bytes(&self, mr: MrHandle) -> Result<&[u8]> {
        match self.mrs.get(mr.0).map(|e| &e.memory) {
            Some(Memory::Owned(bytes)) => Ok(bytes),
            Some(Memory::User { .. }) => Err(user_memory_error()),
            None => Err(invalid("memory registration")),
        }
    }

    pub(crate) fn mr_bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8]> {
        match self.mrs.get_mut(mr.0).map(|e| &mut e.memory) {
            Some(Memory::Owned(bytes)) => Ok(bytes),
            Some(Memory::User { .. }) => Err(user_memory_error()),
            None => Err(invalid("memory registration")),
        }
    }

    // ----- completion queues --------------------------------------------

    pub(crate) fn create_cq(&mut self, depth: u32) -> Result<CqHandle> {
        if self.cqs.len() >= self.device.attr.max_cq as usize {
            return Err(FabricError::ResourceExhausted {
                what: "completion queues",
                limit: self.device.attr.max_cq,
            });
        }
        if depth == 0 || depth > self.device.attr.max_cqe {
            return Err(FabricError::InvalidArgument {
                what: "completion queue depth",
                detail: format!("{depth} is outside 1..={}", self.device.attr.max_cqe),
            });
        }
        let depth = depth as usize;
        Ok(CqHandle(self.cqs.insert(CqEntry {
            depth,
            queue: VecDeque::with_capacity(depth),
            attached: 0,
        })))
    }

    pub(crate) fn destroy_cq(&mut self, cq: CqHandle) -> Result<()> {
        let entry = self
            .cqs
            .get(cq.0)
            .ok_or_else(|| invalid("completion queue"))?;
        if entry.attached > 0 {
            return Err(FabricError::Busy {
                kind: "completion queue",
                users: entry.attached,
                user_kind: "queue pairs",
            });
        }
        self.cqs.remove(cq.0);
        Ok(())
    }

    /// Queues a completion. Callers check [`CqEntry::room`] first.
    pub(crate) fn push_completion(&mut self, cq: CqHandle, qp: QpHandle, wc: WorkCompletion) {
        if let Some(entry) = self.cqs.get_mut(cq.0) {
            entry.push(wc, qp);
        }
    }

    /// Moves queued completions into `out`, returning how many.
    pub(crate) fn drain_completions(
        &mut self,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize> {
        let entry = self
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| invalid("completion queue"))?;
        let mut written = 0;
        while written < out.len() {
            let Some((wc, qp)) = entry.queue.pop_front() else {
                break;
            };
            if wc.opcode == WcOpcode::Send {
                if let Some(qp) = self.qps.get_mut(qp.0) {
                    qp.sends_outstanding = qp.sends_outstanding.saturating_sub(1);
                }
            }
            out[written] = wc;
            written += 1;
        }
        Ok(written)
    }

    pub(crate) fn cq_room(&self, cq: CqHandle) -> usize {
        self.cqs.get(cq.0).map_or(0, CqEntry::room)
    }

    // ----- queue pairs --------------------------------------------------

    /// Grants capacities within the device limits.
    pub(crate) fn grant_cap(&self, requested: QpCap) -> Result<QpCap> {
        let attr = &self.device.attr;
        if requested.max_send_wr == 0 || requested.max_recv_wr == 0 {
            return Err(FabricError::InvalidArgument {
                what: "queue pair capacity",
                detail: "send and receive queues need at least one entry".into(),
            });
        }
        for (what, asked, limit) in [
            ("max_send_wr", requested.max_send_wr, attr.max_qp_wr),
            ("max_recv_wr", requested.max_recv_wr, attr.max_qp_wr),
            ("max_send_sge", requested.max_send_sge, attr.max_sge),
        ] {
            if asked > limit {
                return Err(FabricError::InvalidArgument {
                    what: "queue pair capacity",
                    detail: format!("{what} = {asked} exceeds the device limit {limit}"),
                });
            }
        }
        Ok(QpCap {
            max_send_sge: requested.max_send_sge.max(1),
            max_inline_data: requested.max_inline_data.min(attr.max_inline_data),
            ..requested
        })
    }

    /// Checks the arguments of `create_qp` before the provider builds its
    /// transport.
    pub(crate) fn check_qp_init(&self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpCap> {
        if self.qps.len() >= self.device.attr.max_qp as usize {
            return Err(FabricError::ResourceExhausted {
                what: "queue pairs",
                limit: self.device.attr.max_qp,
            });
        }
        self.pds
            .get(pd.0)
            .ok_or_else(|| invalid("protection domain"))?;
        self.cqs
            .get(attr.send_cq.0)
            .ok_or_else(|| invalid("completion queue"))?;
        self.cqs
            .get(attr.recv_cq.0)
            .ok_or_else(|| invalid("completion queue"))?;
        self.grant_cap(attr.cap)
    }

    /// Stores a queue pair whose arguments [`Verbs::check_qp_init`] accepted.
    pub(crate) fn insert_qp(
        &mut self,
        pd: PdHandle,
        attr: &QpInitAttr,
        cap: QpCap,
        qp_num: u32,
        transport: Q,
    ) -> Result<QpInfo> {
        self.use_pd(pd)?;
        for cq in [attr.send_cq, attr.recv_cq] {
            if let Some(entry) = self.cqs.get_mut(cq.0) {
                entry.attached += 1;
            }
        }
        let handle = QpHandle(self.qps.insert(QpEntry {
            pd,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            qp_num,
            state: QpState::Reset,
            cap,
            qkey: 0,
            pkey: 0,
            port: 0,
            recv_queue: VecDeque::with_capacity(cap.max_recv_wr as usize),
            sends_outstanding: 0,
            transport,
        }));
        Ok(QpInfo {
            handle,
            qp_num,
            cap,
        })
    }

    pub(crate) fn qp(&self, qp: QpHandle) -> Result<&QpEntry<Q>> {
        self.qps.get(qp.0).ok_or_else(|| invalid("queue pair"))
    }

    pub(crate) fn qp_mut(&mut self, qp: QpHandle) -> Result<&mut QpEntry<Q>> {
        self.qps.get_mut(qp.0).ok_or_else(|| invalid("queue pair"))
    }

    pub(crate) fn modify_qp(&mut self, qp: QpHandle, transition: &QpTransition) -> Result<()> {
        let (state, qp_num) = {
            let entry = self.qp(qp)?;
            (entry.state, entry.qp_num)
        };
        let next = match (state, transition) {
            (
                QpState::Reset,
                QpTransition::Init {
                    pkey_index,
                    qkey,
                    port,
                },
            ) => {
                let port_attr = self.port(*port)?;
                let pkey = *port_attr
                    .pkeys
                    .get(usize::from(*pkey_index))
                    .ok_or_else(|| FabricError::InvalidArgument {
                        what: "partition key index",
                        detail: format!(
                            "{pkey_index} is outside the port's table of {}",
                            port_attr.pkeys.len()
                        ),
                    })?;
                let entry = self.qp_mut(qp)?;
                entry.qkey = *qkey;
                entry.pkey = pkey;
                entry.port = *port;
                QpState::Init
            }
            (QpState::Init, QpTransition::Rtr) => QpState::Rtr,
            (QpState::Rtr, QpTransition::Rts { .. }) => QpState::Rts,
            _ => {
                return Err(FabricError::InvalidState {
                    qp_num,
                    state,
                    operation: match transition {
                        QpTransition::Init { .. } => "a move to INIT",
                        QpTransition::Rtr => "a move to RTR",
                        QpTransition::Rts { .. } => "a move to RTS",
                    },
                });
            }
        };
        self.qp_mut(qp)?.state = next;
        Ok(())
    }

    /// Removes a queue pair and returns its transport.
    pub(crate) fn remove_qp(&mut self, qp: QpHandle) -> Result<Q> {
        let entry = self.qps.remove(qp.0).ok_or_else(|| invalid("queue pair"))?;
        for cq in [entry.send_cq, entry.recv_cq] {
            if let Some(cq_entry) = self.cqs.get_mut(cq.0) {
                cq_entry.attached = cq_entry.attached.saturating_sub(1);
                // Completions of a destroyed queue pair can no longer be
                // attributed; verbs leaves them, but they must not be counted
                // against a queue pair that reuses the slot.
                cq_entry.queue.retain(|(_, owner)| *owner != qp);
            }
        }
        self.release_pd(entry.pd);
        Ok(entry.transport)
    }

    // ----- address handles ----------------------------------------------

    pub(crate) fn insert_ah(&mut self, pd: PdHandle, attr: &AhAttr, route: A) -> Result<AhHandle> {
        self.port(attr.port)?;
        self.use_pd(pd)?;
        Ok(AhHandle(self.ahs.insert(AhEntry { pd, route })))
    }

    pub(crate) fn ah(&self, ah: AhHandle) -> Result<&AhEntry<A>> {
        self.ahs.get(ah.0).ok_or_else(|| invalid("address handle"))
    }

    pub(crate) fn destroy_ah(&mut self, ah: AhHandle) -> Result<()> {
        let entry = self
            .ahs
            .remove(ah.0)
            .ok_or_else(|| invalid("address handle"))?;
        self.release_pd(entry.pd);
        Ok(())
    }

    // ----- posting ------------------------------------------------------

    /// Validates and queues receive requests.
    pub(crate) fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        for (posted, wr) in wrs.iter().enumerate() {
            self.check_recv(qp, wr)
                .map_err(|error| PostError { posted, error })?;
            if let Some(entry) = self.qps.get_mut(qp.0) {
                entry.recv_queue.push_back(*wr);
            }
        }
        Ok(())
    }

    fn check_recv(&self, qp: QpHandle, wr: &RecvWr) -> Result<()> {
        let entry = self.qp(qp)?;
        if entry.state == QpState::Reset {
            return Err(FabricError::InvalidState {
                qp_num: entry.qp_num,
                state: entry.state,
                operation: "posting a receive",
            });
        }
        if entry.recv_queue.len() >= entry.cap.max_recv_wr as usize {
            return Err(FabricError::QueueFull {
                queue: "receive queue",
                capacity: entry.cap.max_recv_wr as usize,
            });
        }
        if wr.sge.len < GRH_LEN {
            return Err(FabricError::InvalidArgument {
                what: "receive buffer",
                detail: format!("{} bytes cannot hold the {GRH_LEN}-byte GRH", wr.sge.len),
            });
        }
        self.owned_range(wr.sge, entry.pd).map(|_| ())
    }

    /// The registration named by `lkey`, if it is live and in `pd`.
    fn mr_by_lkey(&self, lkey: LKey, pd: PdHandle) -> Result<(Handle, &MrEntry)> {
        let handle = self
            .mrs
            .handle_at(lkey.0 & 0xffff)
            .filter(|h| lkey_of(*h) == lkey)
            .ok_or(FabricError::ProtectionError { lkey })?;
        let entry = self
            .mrs
            .get(handle)
            .ok_or(FabricError::ProtectionError { lkey })?;
        if entry.pd != pd {
            return Err(FabricError::ProtectionError { lkey });
        }
        Ok((handle, entry))
    }

    /// Resolves an SGE to its registration handle, checking bounds.
    pub(crate) fn owned_range(&self, sge: Sge, pd: PdHandle) -> Result<MrHandle> {
        let (handle, entry) = self.mr_by_lkey(sge.lkey, pd)?;
        match &entry.memory {
            Memory::Owned(bytes)
                if sge
                    .offset
                    .checked_add(sge.len)
                    .is_some_and(|end| end <= bytes.len()) =>
            {
                Ok(MrHandle(handle))
            }
            _ => Err(FabricError::ProtectionError { lkey: sge.lkey }),
        }
    }

    /// Checks one send request against everything verbs would check, and
    /// returns its payload length.
    pub(crate) fn check_send(&self, qp: &QpEntry<Q>, wr: &SendWr<'_>) -> Result<usize> {
        if qp.state != QpState::Rts {
            return Err(FabricError::InvalidState {
                qp_num: qp.qp_num,
                state: qp.state,
                operation: "posting a send",
            });
        }
        if wr.sg_list.len() > qp.cap.max_send_sge as usize {
            return Err(FabricError::InvalidArgument {
                what: "scatter/gather list",
                detail: format!(
                    "{} entries exceed the granted {}",
                    wr.sg_list.len(),
                    qp.cap.max_send_sge
                ),
            });
        }
        let len = wr.len();
        let max = self.port(qp.port)?.max_msg_size;
        if len > max {
            return Err(FabricError::MessageTooLong { len, max });
        }
        if wr.flags.contains(SendFlags::INLINE) {
            if len > qp.cap.max_inline_data as usize {
                return Err(FabricError::InlineTooLong {
                    len,
                    max: qp.cap.max_inline_data as usize,
                });
            }
        } else {
            for gather in wr.sg_list {
                self.check_gather(gather, qp.pd)?;
            }
        }
        self.ah(wr.ah)?;
        if wr.flags.contains(SendFlags::SIGNALED) {
            if qp.sends_outstanding >= qp.cap.max_send_wr {
                return Err(FabricError::QueueFull {
                    queue: "send queue",
                    capacity: qp.cap.max_send_wr as usize,
                });
            }
            let cq = self
                .cqs
                .get(qp.send_cq.0)
                .ok_or_else(|| invalid("completion queue"))?;
            if cq.room() == 0 {
                return Err(FabricError::QueueFull {
                    queue: "completion queue",
                    capacity: cq.depth,
                });
            }
        }
        Ok(len)
    }

    fn check_gather(&self, gather: &Gather<'_>, pd: PdHandle) -> Result<()> {
        match gather {
            Gather::Registered(sge) => self.owned_range(*sge, pd).map(|_| ()),
            Gather::User { lkey, data } => {
                let (_, entry) = self.mr_by_lkey(*lkey, pd)?;
                let Memory::User { start, len } = entry.memory else {
                    return Err(FabricError::ProtectionError { lkey: *lkey });
                };
                let begin = data.as_ptr() as usize;
                let inside = begin >= start
                    && begin
                        .checked_add(data.len())
                        .is_some_and(|end| end <= start.saturating_add(len));
                if inside {
                    Ok(())
                } else {
                    Err(FabricError::ProtectionError { lkey: *lkey })
                }
            }
        }
    }

    /// The bytes of one gather entry that [`Verbs::check_send`] accepted.
    pub(crate) fn gather_bytes<'a>(&'a self, gather: &Gather<'a>) -> &'a [u8] {
        match gather {
            Gather::Registered(sge) => self
                .mrs
                .handle_at(sge.lkey.0 & 0xffff)
                .and_then(|h| self.mrs.get(h))
                .and_then(|entry| match &entry.memory {
                    Memory::Owned(bytes) => bytes.get(sge.offset..sge.offset + sge.len),
                    Memory::User { .. } => None,
                })
                .unwrap_or_default(),
            Gather::User { data, .. } => data,
        }
    }

    /// Records a send that left: counts it, and queues its completion if it
    /// was signaled.
    pub(crate) fn complete_send(&mut self, qp: QpHandle, wr: &SendWr<'_>, len: usize) {
        self.stats.tx_datagrams += 1;
        self.stats.tx_bytes += len as u64;
        if !wr.flags.contains(SendFlags::SIGNALED) {
            return;
        }
        let Some(entry) = self.qps.get_mut(qp.0) else {
            return;
        };
        entry.sends_outstanding += 1;
        let (cq, qp_num) = (entry.send_cq, entry.qp_num);
        self.push_completion(
            cq,
            qp,
            WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Send,
                byte_len: len as u32,
                qp_num,
                src: None,
                imm: None,
            },
        );
    }

    /// Copies a datagram into the next posted receive of `qp`, queueing its
    /// completion, or drops and counts it. Used by providers that hold the
    /// bytes in memory (the simulator); the UDP provider receives in place.
    pub(crate) fn deliver(
        &mut self,
        qp: QpHandle,
        src: QpAddr,
        pkey: u16,
        qkey: u32,
        imm: Option<u32>,
        payload: &[u8],
    ) {
        let Some(entry) = self.qps.get_mut(qp.0) else {
            return;
        };
        if !entry.admit(pkey, qkey, &mut self.stats) {
            return;
        }
        let Some(wr) = entry.recv_queue.pop_front() else {
            self.stats.rx_no_buffer += 1;
            return;
        };
        let (cq, qp_num) = (entry.recv_cq, entry.qp_num);
        let fits = payload.len() + GRH_LEN <= wr.sge.len;
        let status = if fits {
            let written = self
                .mrs
                .handle_at(wr.sge.lkey.0 & 0xffff)
                .and_then(|h| self.mrs.get_mut(h))
                .and_then(|mr| match &mut mr.memory {
                    Memory::Owned(bytes) => {
                        let start = wr.sge.offset + GRH_LEN;
                        bytes.get_mut(start..start + payload.len())
                    }
                    Memory::User { .. } => None,
                })
                .map(|dst| dst.copy_from_slice(payload));
            if written.is_some() {
                self.stats.rx_datagrams += 1;
                self.stats.rx_bytes += payload.len() as u64;
                WcStatus::Success
            } else {
                // The registration went away while the receive was posted.
                WcStatus::LocalProtectionError
            }
        } else {
            self.stats.rx_too_long += 1;
            WcStatus::LocalLengthError
        };
        let byte_len = if status == WcStatus::Success {
            (payload.len() + GRH_LEN) as u32
        } else {
            0
        };
        self.push_completion(
            cq,
            qp,
            WorkCompletion {
                wr_id: wr.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len,
                qp_num,
                src: Some(src),
                imm,
            },
        );
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
