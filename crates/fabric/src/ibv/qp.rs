//! Queue pairs of the `verbs` provider: creating one (staging slots, the
//! inline retry, growing its completion queues to fit), moving it through
//! Reset, Init, RTR and RTS on the device in step with the bookkeeping, and
//! destroying it.

use super::context::{HwQp, VerbsContext, invalid};
use super::logic::{self, RecvLayout, SlotPool, Verb};
use super::sys::QpCapRaw;
use crate::{CqHandle, PdHandle, QpHandle, QpInfo, QpInitAttr, QpState, QpTransition, Result};

impl VerbsContext {
    /// [`Context::create_qp`](crate::Context::create_qp).
    pub(super) fn create_hw_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo> {
        let cap = self.verbs.check_qp_init(pd, attr)?;
        let hw_pd = self
            .pds
            .get(&pd)
            .ok_or_else(|| invalid("protection domain"))?;
        let hw_cq = |cq: CqHandle| {
            self.cqs
                .get(&cq)
                .map(|c| c.cq.clone())
                .ok_or_else(|| invalid("completion queue"))
        };
        let (send_cq, recv_cq) = (hw_cq(attr.send_cq)?, hw_cq(attr.recv_cq)?);
        let request = QpCapRaw {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cap.max_inline_data,
        };
        let layout = RecvLayout::new(0, self.max_payload);
        let create = |request| {
            hw_pd.create_ud_qp(
                &send_cq,
                &recv_cq,
                request,
                layout.slot_len,
                self.max_payload,
            )
        };
        // Some devices refuse an inline size they cannot grant: retry
        // without inline data rather than fail.
        let hw = match create(request) {
            Err(libc::EINVAL) if request.max_inline_data > 0 => create(QpCapRaw {
                max_inline_data: 0,
                ..request
            }),
            other => other,
        }
        .map_err(|errno| self.errno(Verb::CreateQp, errno))?;
        let granted = hw.cap();
        // Keep each device queue large enough for every work request its
        // queue pairs may have outstanding.
        let grow = [
            (attr.send_cq, granted.max_send_wr),
            (attr.recv_cq, granted.max_recv_wr),
        ];
        for (cq, wrs) in grow {
            let entry = self
                .cqs
                .get_mut(&cq)
                .ok_or_else(|| invalid("completion queue"))?;
            let want = entry.attached_wrs + wrs;
            entry.cq.grow(want).map_err(|errno| {
                logic::errno_error(Verb::CreateCq, errno, &self.verbs.device.name)
            })?;
            entry.attached_wrs = want;
        }
        let cap = crate::QpCap {
            max_send_wr: cap.max_send_wr.min(granted.max_send_wr),
            max_recv_wr: cap.max_recv_wr.min(granted.max_recv_wr),
            max_send_sge: cap.max_send_sge,
            max_inline_data: cap.max_inline_data.min(granted.max_inline_data),
        };
        let qp_num = hw.qp_num();
        let info = self.verbs.insert_qp(pd, attr, cap, qp_num, ());
        let info = match info {
            Ok(info) => info,
            Err(err) => {
                for (cq, wrs) in grow {
                    if let Some(entry) = self.cqs.get_mut(&cq) {
                        entry.attached_wrs = entry.attached_wrs.saturating_sub(wrs);
                    }
                }
                return Err(err);
            }
        };
        self.qp_nums.insert(qp_num, info.handle);
        self.qps.insert(
            info.handle,
            HwQp {
                recv_layout: RecvLayout::new(granted.max_recv_wr as usize, self.max_payload),
                recv_slots: SlotPool::new(granted.max_recv_wr),
                recv_wrs: vec![None; granted.max_recv_wr as usize],
                sends: vec![None; granted.max_send_wr as usize],
                send_cq: attr.send_cq,
                recv_cq: attr.recv_cq,
                hw,
            },
        );
        Ok(info)
    }

    /// [`Context::modify_qp`](crate::Context::modify_qp).
    pub(super) fn modify_hw_qp(&mut self, qp: QpHandle, transition: &QpTransition) -> Result<()> {
        let state = self.verbs.qp(qp)?.state;
        let hw = self.qps.get_mut(&qp).ok_or_else(|| invalid("queue pair"))?;
        let done = match (state, transition) {
            (
                QpState::Reset,
                QpTransition::Init {
                    pkey_index,
                    qkey,
                    port,
                },
            ) => {
                // The bookkeeping refuses a bad port or index first.
                self.verbs.port(*port)?;
                Some(hw.hw.modify_init(*pkey_index, *port, *qkey))
            }
            (QpState::Init, QpTransition::Rtr) => Some(hw.hw.modify_rtr()),
            (QpState::Rtr, QpTransition::Rts { sq_psn }) => Some(hw.hw.modify_rts(*sq_psn)),
            // Out of order: the bookkeeping names the error.
            _ => None,
        };
        if let Some(Err(errno)) = done {
            return Err(self.errno(Verb::ModifyQp, errno));
        }
        self.verbs.modify_qp(qp, transition)
    }

    /// [`Context::destroy_qp`](crate::Context::destroy_qp).
    pub(super) fn destroy_hw_qp(&mut self, qp: QpHandle) -> Result<()> {
        let qp_num = self.verbs.qp(qp)?.qp_num;
        self.verbs.remove_qp(qp)?;
        self.qp_nums.remove(&qp_num);
        if let Some(hw) = self.qps.remove(&qp) {
            let cap = hw.hw.cap();
            for (cq, wrs) in [(hw.send_cq, cap.max_send_wr), (hw.recv_cq, cap.max_recv_wr)] {
                if let Some(entry) = self.cqs.get_mut(&cq) {
                    entry.attached_wrs = entry.attached_wrs.saturating_sub(wrs);
                }
            }
            // Dropping `hw` destroys the queue pair, then frees its staging.
        }
        Ok(())
    }
}
