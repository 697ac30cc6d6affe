//! Posting for the `verbs` provider: receives into the queue pair's
//! staging slots, and sends checked by the bookkeeping, copied (or inlined)
//! into send slots and handed to the device in batches.

use super::context::{VerbsContext, invalid};
use super::logic;
use super::sys::SendReq;
use crate::{FabricError, PostError, QpHandle, RecvWr, Result, SendFlags, SendWr};

/// Most sends handed to the device per `ibv_post_send` call.
pub(super) const SEND_BATCH: usize = 32;

impl VerbsContext {
    /// [`Context::post_recv`](crate::Context::post_recv).
    pub(super) fn post_recv_hw(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        let checked = self.verbs.post_recv(qp, wrs);
        let accepted = match &checked {
            Ok(()) => wrs.len(),
            Err(err) => err.posted,
        };
        let hw = self.qps.get_mut(&qp).ok_or(PostError {
            posted: 0,
            error: invalid("queue pair"),
        })?;
        let mut reqs = Vec::with_capacity(accepted);
        for wr in &wrs[..accepted] {
            // The bookkeeping bounds posted receives by the granted queue
            // depth, so a slot is always free here.
            let Some(slot) = hw.recv_slots.take() else {
                break;
            };
            if let Some(keep) = hw.recv_wrs.get_mut(slot as usize) {
                *keep = Some(*wr);
            }
            reqs.push((slot, hw.recv_layout.post_len(wr.sge.len)));
        }
        let result = hw.hw.post_recv(&reqs);
        let posted = match &result {
            Ok(()) => reqs.len(),
            Err((posted, _)) => *posted,
        };
        // Undo what the device did not take.
        for &(slot, _) in &reqs[posted..] {
            hw.recv_slots.give(slot);
            if let Some(keep) = hw.recv_wrs.get_mut(slot as usize) {
                *keep = None;
            }
        }
        if posted < accepted {
            if let Ok(entry) = self.verbs.qp_mut(qp) {
                for _ in posted..accepted {
                    entry.recv_queue.pop_back();
                }
            }
            let capacity = self.verbs.qp(qp).map_or(0, |e| e.cap.max_recv_wr as usize);
            let errno = result.err().map_or(libc::ENOMEM, |(_, errno)| errno);
            return Err(PostError {
                posted,
                error: logic::post_errno_error(
                    errno,
                    "receive queue",
                    capacity,
                    &self.verbs.device.name,
                ),
            });
        }
        checked
    }

    /// [`Context::check_send`](crate::Context::check_send).
    pub(super) fn check_send_hw(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        let entry = self.verbs.qp(qp)?;
        let len = self.verbs.check_send(entry, wr)?;
        let hw = self.qps.get(&qp).ok_or_else(|| invalid("queue pair"))?;
        if hw.hw.send_room() == 0 {
            return Err(FabricError::QueueFull {
                queue: "send queue",
                capacity: entry.cap.max_send_wr as usize,
            });
        }
        Ok(len)
    }

    /// [`Context::post_send`](crate::Context::post_send).
    pub(super) fn post_send_hw(
        &mut self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
    ) -> Result<(), PostError> {
        let mut posted = 0;
        while posted < wrs.len() {
            // Free the slots of sends the device has finished with.
            let send_cq = self
                .qps
                .get(&qp)
                .map(|hw| (hw.send_cq, hw.hw.send_room()))
                .ok_or(PostError {
                    posted,
                    error: invalid("queue pair"),
                })?;
            if send_cq.1 < (wrs.len() - posted).min(SEND_BATCH) {
                let room = self.verbs.cq_room(send_cq.0);
                self.reap(send_cq.0, room)
                    .map_err(|error| PostError { posted, error })?;
            }
            let end = (posted + SEND_BATCH).min(wrs.len());
            match self.post_send_batch(qp, &wrs[posted..end]) {
                Ok(n) => posted += n,
                Err((n, error)) => {
                    return Err(PostError {
                        posted: posted + n,
                        error,
                    });
                }
            }
        }
        Ok(())
    }

    /// Posts one batch of at most [`SEND_BATCH`] sends; returns how many
    /// were accepted, or the refusal with that count.
    fn post_send_batch(
        &mut self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
    ) -> Result<usize, (usize, FabricError)> {
        let Self { verbs, qps, .. } = self;
        let hw = qps.get_mut(&qp).ok_or((0, invalid("queue pair")))?;
        let entry = verbs.qp(qp).map_err(|e| (0, e))?;
        let max_inline = hw.hw.cap().max_inline_data as usize;
        let mut gathers: Vec<Vec<&[u8]>> = Vec::with_capacity(wrs.len());
        let mut lens = Vec::with_capacity(wrs.len());
        let mut refusal = None;
        let mut signaled = 0u32;
        let cq_room = verbs.cq_room(entry.send_cq);
        for (i, wr) in wrs.iter().enumerate() {
            let checked = verbs.check_send(entry, wr).and_then(|len| {
                if wr.flags.contains(SendFlags::SIGNALED) {
                    let outstanding = entry.sends_outstanding + signaled;
                    if outstanding >= entry.cap.max_send_wr || signaled as usize >= cq_room {
                        return Err(FabricError::QueueFull {
                            queue: if outstanding >= entry.cap.max_send_wr {
                                "send queue"
                            } else {
                                "completion queue"
                            },
                            capacity: entry.cap.max_send_wr as usize,
                        });
                    }
                }
                if i >= hw.hw.send_room() {
                    return Err(FabricError::QueueFull {
                        queue: "send queue",
                        capacity: entry.cap.max_send_wr as usize,
                    });
                }
                Ok(len)
            });
            match checked {
                Ok(len) => {
                    signaled += u32::from(wr.flags.contains(SendFlags::SIGNALED));
                    gathers.push(wr.sg_list.iter().map(|g| verbs.gather_bytes(g)).collect());
                    lens.push(len);
                }
                Err(error) => {
                    refusal = Some((i, error));
                    break;
                }
            }
        }
        let mut reqs = Vec::with_capacity(gathers.len());
        for (wr, gather) in wrs.iter().zip(&gathers) {
            let ah = &verbs.ah(wr.ah).map_err(|e| (reqs.len(), e))?.route;
            reqs.push(SendReq {
                gather,
                ah,
                remote_qpn: wr.remote_qpn,
                remote_qkey: wr.remote_qkey,
                imm: wr.imm,
                inline: wr.len() <= max_inline,
                solicited: wr.flags.contains(SendFlags::SOLICITED),
            });
        }
        let mut slots = [0u32; SEND_BATCH];
        let posted = match hw.hw.post_send(&reqs, &mut slots) {
            Ok(()) => reqs.len(),
            Err((posted, errno)) => {
                let capacity = entry.cap.max_send_wr as usize;
                let error =
                    logic::post_errno_error(errno, "send queue", capacity, &verbs.device.name);
                refusal = Some((posted, error));
                posted
            }
        };
        drop(reqs);
        for (i, wr) in wrs[..posted].iter().enumerate() {
            let signaled = wr.flags.contains(SendFlags::SIGNALED);
            if let Some(info) = hw.sends.get_mut(slots[i] as usize) {
                *info = Some((wr.wr_id, signaled));
            }
        }
        let sent: u32 = wrs[..posted]
            .iter()
            .map(|wr| u32::from(wr.flags.contains(SendFlags::SIGNALED)))
            .sum();
        if let Ok(entry) = verbs.qp_mut(qp) {
            entry.sends_outstanding += sent;
        }
        verbs.stats.tx_datagrams += posted as u64;
        verbs.stats.tx_bytes += lens[..posted].iter().sum::<usize>() as u64;
        match refusal {
            Some((at, error)) => Err((at.min(posted), error)),
            None => Ok(posted),
        }
    }
}
