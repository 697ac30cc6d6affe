//! Creating and destroying resources: protection domains, memory
//! registrations, completion queues, queue pairs and address handles, with
//! the limits and the teardown order verbs enforces.

use std::collections::VecDeque;

use super::{
    AhEntry, CqEntry, MAX_MR, Memory, MrEntry, PdEntry, QpEntry, Verbs, invalid, lkey_of,
    user_memory_error,
};
use crate::types::*;
use crate::{FabricError, Result};

impl<Q, A> Verbs<Q, A> {
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

    pub(crate) fn mr_bytes_pair(
        &mut self,
        from: MrHandle,
        to: MrHandle,
    ) -> Result<(&[u8], &mut [u8])> {
        let (from, to) = self
            .mrs
            .get_pair_mut(from.0, to.0)
            .ok_or_else(|| invalid("memory registration pair"))?;
        match (&from.memory, &mut to.memory) {
            (Memory::Owned(from), Memory::Owned(to)) => Ok((from, to)),
            _ => Err(user_memory_error()),
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
}
