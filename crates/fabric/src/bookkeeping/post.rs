//! Posting work: the checks verbs performs on receive and send requests,
//! the bytes a checked send gathers, and the completions of sends and of
//! receives delivered from memory.

use super::{Memory, MrEntry, QpEntry, Verbs, invalid, lkey_of};
use crate::table::Handle;
use crate::types::*;
use crate::{FabricError, PostError, Result};

impl<Q, A> Verbs<Q, A> {
    // ----- posting ------------------------------------------------------

    /// Validates and queues receive requests, to be consumed in the order
    /// they were posted, as verbs consumes them.
    pub(crate) fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.queue_recv(qp, wrs, false)
    }

    /// Validates and queues receive requests to be consumed newest first:
    /// a buffer given back and posted again a moment ago is the one most
    /// likely still in the cache, where an arriving datagram is written
    /// and then read at once. Cycling through the whole pool in posting
    /// order instead touches every buffer in turn (64 MiB of them on
    /// loopback), each cold. A receiver cannot tell which posted buffer a
    /// datagram landed in but by its completion, so only a provider that
    /// fills buffers itself may choose (the udp provider).
    pub(crate) fn post_recv_newest_first(
        &mut self,
        qp: QpHandle,
        wrs: &[RecvWr],
    ) -> Result<(), PostError> {
        self.queue_recv(qp, wrs, true)
    }

    fn queue_recv(
        &mut self,
        qp: QpHandle,
        wrs: &[RecvWr],
        newest_first: bool,
    ) -> Result<(), PostError> {
        for (posted, wr) in wrs.iter().enumerate() {
            self.check_recv(qp, wr)
                .map_err(|error| PostError { posted, error })?;
            if let Some(entry) = self.qps.get_mut(qp.0) {
                if newest_first {
                    entry.recv_queue.push_front(*wr);
                } else {
                    entry.recv_queue.push_back(*wr);
                }
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

    /// Records a send of `len` bytes that left, request `wr_id` with
    /// `flags`: counts it, and queues its completion if it was signaled.
    pub(crate) fn complete_send(
        &mut self,
        qp: QpHandle,
        (wr_id, flags): (u64, SendFlags),
        len: usize,
    ) {
        self.stats.tx_datagrams += 1;
        self.stats.tx_bytes += len as u64;
        if !flags.contains(SendFlags::SIGNALED) {
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
                wr_id,
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
