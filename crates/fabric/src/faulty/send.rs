//! The send side of [`FaultyContext`]: checking a send the wrapped
//! provider will not see, holding a reordered send in a wrapper-owned copy
//! and releasing it later, completing dropped and held sends locally, and
//! posting the runs of sends that pass through.

use std::mem;

use super::context::{FaultyContext, Pending};
use super::held::Held;
use crate::types::*;
use crate::{Context, FabricError, PostError, Result};

impl<C: Context> FaultyContext<C> {
    /// Checks a send the wrapped provider will not see: exactly what the
    /// provider would refuse, plus the send queue room that the wrapper's own
    /// completions take. Returns the payload length.
    pub(super) fn check_faulty_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        let len = self.inner.check_send(qp, wr)?;
        let record = self.record(qp)?;
        if wr.flags.contains(SendFlags::SIGNALED) && record.outstanding >= record.cap.max_send_wr {
            return Err(FabricError::QueueFull {
                queue: "send queue",
                capacity: record.cap.max_send_wr as usize,
            });
        }
        Ok(len)
    }

    /// Copies the bytes of a checked send into `scratch_bytes`.
    fn gather_into_scratch(&mut self, wr: &SendWr<'_>) {
        let mut bytes = mem::take(&mut self.scratch_bytes);
        bytes.clear();
        for gather in wr.sg_list {
            match gather {
                Gather::Registered(sge) => {
                    // An inline send is not checked against its key, as in
                    // verbs; a key that names nothing contributes nothing.
                    let range = self
                        .mrs
                        .get(&sge.lkey)
                        .and_then(|handle| self.inner.mr_bytes(*handle).ok())
                        .and_then(|b| b.get(sge.offset..sge.offset.saturating_add(sge.len)));
                    bytes.extend_from_slice(range.unwrap_or_default());
                }
                Gather::User { data, .. } => bytes.extend_from_slice(data),
            }
        }
        self.scratch_bytes = bytes;
    }

    /// Copies a checked send into a wrapper-owned registration and holds
    /// it until the next send on the queue pair leaves.
    pub(super) fn hold(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<()> {
        let pd = self.record(qp)?.pd;
        self.gather_into_scratch(wr);
        let bounce = if self.scratch_bytes.is_empty() {
            None
        } else {
            let mr = self.inner.reg_mr(pd, self.scratch_bytes.len())?;
            match self.inner.mr_bytes_mut(mr.handle) {
                Ok(dst) => dst.copy_from_slice(&self.scratch_bytes),
                Err(error) => {
                    // The copy is useless now; the original error says more
                    // than a failure to free it would.
                    let _ = self.inner.dereg_mr(mr.handle);
                    return Err(error);
                }
            }
            Some(mr)
        };
        let held = Held {
            wr_id: wr.wr_id,
            ah: wr.ah,
            remote_qpn: wr.remote_qpn,
            remote_qkey: wr.remote_qkey,
            imm: wr.imm,
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            bounce,
        };
        if let Some(record) = self.record_mut(qp) {
            record.held.push(held);
        }
        Ok(())
    }

    /// Posts the held sends of a queue pair, unsignaled (their completions
    /// were produced when they were held), and frees their copies.
    pub(super) fn release_held(&mut self, qpn: u32) {
        let Some(record) = self.qps.get_mut(&qpn) else {
            return;
        };
        let qp = record.handle;
        for held in mem::take(&mut record.held) {
            let sge = held.bounce.map(|mr| Sge {
                lkey: mr.lkey,
                offset: 0,
                len: mr.len,
            });
            let sg = sge.map(Gather::Registered);
            let wr = SendWr {
                wr_id: held.wr_id,
                sg_list: sg.as_slice(),
                ah: held.ah,
                remote_qpn: held.remote_qpn,
                remote_qkey: held.remote_qkey,
                imm: held.imm,
                flags: if held.solicited {
                    SendFlags::SOLICITED
                } else {
                    SendFlags::NONE
                },
            };
            if let Err(error) = self.inner.post_send(qp, &[wr]) {
                tracing::debug!(qpn, %error, "faulty: a held send was refused when released");
                self.stats.release_failures += 1;
            }
            if let Some(mr) = held.bounce {
                // The wrapped provider has consumed the bytes once
                // post_send returns.
                if let Err(error) = self.inner.dereg_mr(mr.handle) {
                    tracing::debug!(%error, "faulty: could not free a held send's copy");
                }
            }
        }
    }

    /// Records the completion of a send the wrapper took over.
    pub(super) fn complete_locally(&mut self, qp: QpHandle, wr: &SendWr<'_>, len: usize) {
        if !wr.flags.contains(SendFlags::SIGNALED) {
            return;
        }
        let Some(&qp_num) = self.qp_nums.get(&qp) else {
            return;
        };
        let Some(record) = self.qps.get_mut(&qp_num) else {
            return;
        };
        record.outstanding += 1;
        record.pending.push_back(Pending::Local(WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: len as u32,
            qp_num,
            src: None,
            imm: None,
        }));
    }

    /// Posts `wrs[start..end]` to the wrapped context as one batch, records
    /// the signaled ones it accepted, and then releases what was held
    /// before them.
    pub(super) fn flush_run(
        &mut self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
        start: usize,
        end: usize,
    ) -> Result<(), PostError> {
        let Some(run) = wrs.get(start..end).filter(|run| !run.is_empty()) else {
            return Ok(());
        };
        let result = self.inner.post_send(qp, run);
        let accepted = match &result {
            Ok(()) => run.len(),
            Err(error) => error.posted,
        };
        if let Some(&qpn) = self.qp_nums.get(&qp) {
            if let Some(record) = self.qps.get_mut(&qpn) {
                for wr in &run[..accepted] {
                    if wr.flags.contains(SendFlags::SIGNALED) {
                        record.outstanding += 1;
                        record.pending.push_back(Pending::Inner);
                    }
                }
            }
            if accepted > 0 {
                self.release_held(qpn);
            }
        }
        result.map_err(|PostError { posted, error }| PostError {
            posted: start + posted,
            error,
        })
    }
}
