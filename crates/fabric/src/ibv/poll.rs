//! Completions for the `verbs` provider: polling the device queue, turning
//! each device completion into the caller's (a receive's bytes copied from
//! its staging slot, its source address resolved; a send's slot freed), and
//! reading asynchronous events (port up and down, fatal errors).

use super::context::{POLL_BATCH, VerbsContext, invalid};
use super::logic::{self, Verb, WC_FLAG_GRH};
use super::sys::{self, Completion};
use crate::bookkeeping::{Memory, Verbs};
use crate::{
    CqHandle, FabricError, GRH_LEN, NodeAddr, PortState, QpAddr, QpHandle, Result, WcOpcode,
    WcStatus, WorkCompletion,
};

/// Asynchronous events are read every this many polls.
const EVENT_INTERVAL: u32 = 64;

/// `enum ibv_event_type` values the provider acts on.
mod event {
    pub(super) const CQ_ERR: u32 = 0;
    pub(super) const QP_FATAL: u32 = 1;
    pub(super) const DEVICE_FATAL: u32 = 8;
    pub(super) const PORT_ACTIVE: u32 = 9;
    pub(super) const PORT_ERR: u32 = 10;
}

impl VerbsContext {
    /// Reads and acts on pending asynchronous events: port up and down
    /// change the port's state, a fatal device or completion queue error
    /// makes every later poll fail.
    fn handle_async_events(&mut self) {
        loop {
            let event = match self.device.next_async_event() {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(errno) => {
                    tracing::warn!(errno, "reading asynchronous events failed");
                    return;
                }
            };
            let name = sys::event_name(event.kind);
            let port = self
                .verbs
                .ports
                .iter_mut()
                .find(|p| p.port_num == event.port);
            match (event.kind, port) {
                (event::PORT_ACTIVE, Some(port)) => {
                    tracing::info!(port = port.port_num, "RDMA port up");
                    port.state = PortState::Active;
                }
                (event::PORT_ERR, Some(port)) => {
                    tracing::warn!(port = port.port_num, "RDMA port down");
                    port.state = PortState::Down;
                }
                (event::DEVICE_FATAL | event::CQ_ERR, _) => {
                    tracing::error!(event = %name, "fatal RDMA device event");
                    self.fatal = Some(name);
                }
                (event::QP_FATAL, _) => tracing::error!(event = %name, "RDMA queue pair failed"),
                _ => tracing::debug!(event = %name, port = event.port, "RDMA async event"),
            }
        }
    }

    /// The source address of a receive completion.
    fn source_of(&self, wc: &Completion, grh: Option<&[u8; GRH_LEN]>) -> QpAddr {
        let (lid, gid) = match grh.map(|g| logic::grh_source_gid(g).raw()) {
            Some(gid) => (
                self.lids_by_gid.get(&gid).copied().unwrap_or(wc.slid()),
                gid,
            ),
            None => (
                wc.slid(),
                self.peers_by_lid
                    .get(&wc.slid())
                    .copied()
                    .unwrap_or_default(),
            ),
        };
        QpAddr {
            node: NodeAddr::Ib { lid, gid },
            qpn: wc.src_qp(),
        }
    }

    /// Moves up to `room` device completions of `cq` into its software
    /// queue (completions the caller did not ask for take no room).
    pub(super) fn reap(&mut self, cq: CqHandle, room: usize) -> Result<()> {
        let mut room = room;
        while room > 0 {
            let want = room.min(POLL_BATCH);
            let hw = &self
                .cqs
                .get(&cq)
                .ok_or_else(|| invalid("completion queue"))?
                .cq;
            let got = hw
                .poll(&mut self.scratch[..want])
                .map_err(|errno| self.errno(Verb::PollCq, errno))?;
            for i in 0..got {
                let wc = self.scratch[i];
                if self.complete(&wc) {
                    room -= 1;
                }
            }
            if got < want {
                break;
            }
        }
        Ok(())
    }

    /// Handles one device completion; `true` if it queued a caller
    /// completion.
    fn complete(&mut self, wc: &Completion) -> bool {
        let Some(&qp) = self.qp_nums.get(&wc.qp_num()) else {
            // A queue pair destroyed since: nothing is owed to anyone.
            return false;
        };
        let status = logic::wc_status(wc.status());
        if status != WcStatus::Success && status != WcStatus::WrFlushError {
            tracing::debug!(
                status = wc.status(),
                vendor_err = wc.vendor_err(),
                "RDMA completion error"
            );
        }
        if wc.is_recv() {
            self.complete_recv(qp, wc, status)
        } else {
            self.complete_send(qp, wc, status)
        }
    }

    fn complete_recv(&mut self, qp: QpHandle, wc: &Completion, status: WcStatus) -> bool {
        let Some(hw) = self.qps.get_mut(&qp) else {
            return false;
        };
        let Some((slot, bytes)) = hw.hw.take_recv(wc) else {
            return false;
        };
        let wr = hw.recv_wrs.get_mut(slot as usize).and_then(Option::take);
        hw.recv_slots.give(slot);
        let Some(wr) = wr else {
            return false;
        };
        // The GRH, copied out now: `source_of` borrows all of `self`.
        let grh = (wc.wc_flags() & WC_FLAG_GRH != 0)
            .then(|| {
                bytes
                    .get(..GRH_LEN)
                    .and_then(|g| <[u8; GRH_LEN]>::try_from(g).ok())
            })
            .flatten();
        let byte_len = bytes.len();
        // Copy what the device wrote (GRH, then payload) into the caller's
        // buffer at the same offsets.
        let copied = {
            let Verbs { mrs, .. } = &mut self.verbs;
            let target = mrs
                .handle_at(wr.sge.lkey.0 & 0xffff)
                .and_then(|h| mrs.get_mut(h))
                .and_then(|mr| match &mut mr.memory {
                    Memory::Owned(region) => {
                        region.get_mut(wr.sge.offset..wr.sge.offset + byte_len)
                    }
                    Memory::User { .. } => None,
                });
            match target {
                Some(dst) if byte_len <= wr.sge.len => {
                    dst.copy_from_slice(bytes);
                    true
                }
                _ => false,
            }
        };
        let status = match status {
            WcStatus::Success if !copied => WcStatus::LocalProtectionError,
            other => other,
        };
        if let Ok(entry) = self.verbs.qp_mut(qp) {
            if let Some(at) = entry.recv_queue.iter().position(|r| *r == wr) {
                entry.recv_queue.remove(at);
            }
        }
        let src = (status == WcStatus::Success).then(|| self.source_of(wc, grh.as_ref()));
        let stats = &mut self.verbs.stats;
        match status {
            WcStatus::Success => {
                stats.rx_datagrams += 1;
                stats.rx_bytes += byte_len.saturating_sub(GRH_LEN) as u64;
            }
            WcStatus::LocalLengthError => stats.rx_too_long += 1,
            _ => {}
        }
        let Ok(entry) = self.verbs.qp(qp) else {
            return false;
        };
        let (cq, qp_num) = (entry.recv_cq, entry.qp_num);
        let with_imm = wc.wc_flags() & logic::WC_FLAG_WITH_IMM != 0;
        self.verbs.push_completion(
            cq,
            qp,
            WorkCompletion {
                wr_id: wr.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: if status == WcStatus::Success {
                    u32::try_from(byte_len).unwrap_or(u32::MAX)
                } else {
                    0
                },
                qp_num,
                src,
                imm: with_imm.then(|| wc.imm()),
            },
        );
        true
    }

    fn complete_send(&mut self, qp: QpHandle, wc: &Completion, status: WcStatus) -> bool {
        let Some(hw) = self.qps.get_mut(&qp) else {
            return false;
        };
        let Some(slot) = hw.hw.take_send(wc) else {
            return false;
        };
        let Some((wr_id, signaled)) = hw.sends.get_mut(slot as usize).and_then(Option::take) else {
            return false;
        };
        if !signaled {
            if status != WcStatus::Success {
                tracing::debug!(wr_id, ?status, "unsignaled RDMA send failed");
            }
            return false;
        }
        let Ok(entry) = self.verbs.qp(qp) else {
            return false;
        };
        let (cq, qp_num) = (entry.send_cq, entry.qp_num);
        self.verbs.push_completion(
            cq,
            qp,
            WorkCompletion {
                wr_id,
                status,
                opcode: WcOpcode::Send,
                byte_len: 0,
                qp_num,
                src: None,
                imm: None,
            },
        );
        true
    }

    /// [`Context::poll_cq`](crate::Context::poll_cq).
    pub(super) fn poll_hw(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        self.polls = self.polls.wrapping_add(1);
        if self.polls % EVENT_INTERVAL == 0 {
            self.handle_async_events();
        }
        if let Some(reason) = &self.fatal {
            return Err(FabricError::DeviceLost {
                device: self.verbs.device.name.clone(),
                reason: reason.clone(),
            });
        }
        let queued = self
            .verbs
            .cqs
            .get(cq.0)
            .map(crate::bookkeeping::CqEntry::queued)
            .ok_or_else(|| invalid("completion queue"))?;
        if queued < out.len() {
            let room = self.verbs.cq_room(cq).min(out.len() - queued);
            self.reap(cq, room)?;
        }
        self.verbs.drain_completions(cq, out)
    }
}
