//! UD queue pairs, created in a protection domain, and the staging
//! memory they post from and into.

use std::alloc::{self, Layout};
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use super::{
    Ah, Completion, Cq, CqInner, Errno, IbvMr, IbvQp, Pd, PdInner, QpCapRaw, RECV_BIT, RecvRaw,
    SendRaw, check, non_null, udbtl_create_ud_qp, udbtl_dereg_mr, udbtl_destroy_qp,
    udbtl_modify_qp_init, udbtl_modify_qp_rtr, udbtl_modify_qp_rts, udbtl_mr_lkey, udbtl_post_recv,
    udbtl_post_send, udbtl_qp_num, udbtl_reg_mr,
};
use crate::ibv::logic::SlotPool;

/// Page-aligned memory registered for local write, freed after
/// deregistration. It is never borrowed as a whole: the owning [`UdQp`]
/// reads and writes it only through raw pointers to slots that are not
/// posted.
#[derive(Debug)]
pub(super) struct Staging {
    ptr: NonNull<u8>,
    layout: Layout,
    mr: NonNull<IbvMr>,
    lkey: u32,
}

// SAFETY: the memory is owned; the registration may be used from any thread.
unsafe impl Send for Staging {}

impl Staging {
    fn new(pd: &Pd, len: usize) -> Result<Self, Errno> {
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|_| libc::EINVAL)?;
        // SAFETY: `layout` has a nonzero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or(libc::ENOMEM)?;
        // SAFETY: live domain; `ptr..ptr + size` is owned by this value and
        // stays allocated until after `ibv_dereg_mr` (in `Drop`).
        let mr = match non_null(unsafe {
            udbtl_reg_mr(pd.0.pd.as_ptr(), ptr.as_ptr().cast(), layout.size())
        }) {
            Ok(mr) => mr,
            Err(errno) => {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
                return Err(errno);
            }
        };
        // SAFETY: `mr` was just registered.
        let lkey = unsafe { udbtl_mr_lkey(mr.as_ptr()) };
        Ok(Self {
            ptr,
            layout,
            mr,
            lkey,
        })
    }

    fn addr(&self, offset: usize) -> u64 {
        self.ptr.as_ptr() as u64 + offset as u64
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: registered once in `new`; deregistered once.
        let rc = unsafe { udbtl_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            // The device may still reach the memory: leak it.
            tracing::error!(errno = rc, "ibv_dereg_mr failed; leaking its memory");
            return;
        }
        // SAFETY: allocated in `new` with `layout`; the device can no longer
        // reach it.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// One send for [`UdQp::post_send`].
#[derive(Debug)]
pub(crate) struct SendReq<'a> {
    /// The payload, gathered in order (copied into a staging slot).
    pub(crate) gather: &'a [&'a [u8]],
    /// The route.
    pub(crate) ah: &'a Ah,
    /// Destination queue pair.
    pub(crate) remote_qpn: u32,
    /// Queue key to present.
    pub(crate) remote_qkey: u32,
    /// Immediate data.
    pub(crate) imm: Option<u32>,
    /// Post inline (the caller checked the granted limit).
    pub(crate) inline: bool,
    /// Solicited event at the receiver.
    pub(crate) solicited: bool,
}

/// A UD queue pair with the staging memory its work requests use.
#[derive(Debug)]
pub(crate) struct UdQp {
    qp: NonNull<IbvQp>,
    qp_num: u32,
    cap: QpCapRaw,
    recv: Option<Staging>,
    send: Option<Staging>,
    /// Receive slots posted and not yet completed.
    recv_posted: Vec<bool>,
    /// Send slots.
    send_slots: SlotPool,
    /// The address handle of each posted send, kept alive until its
    /// completion.
    send_ahs: Vec<Option<Ah>>,
    recv_slot: usize,
    send_slot: usize,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _pd: Arc<PdInner>,
}

impl Pd {
    /// `ibv_create_qp` for a UD queue pair, with staging memory for
    /// `cap.max_recv_wr` receives of `recv_slot` bytes and
    /// `cap.max_send_wr` sends of `send_slot` bytes, both registered in
    /// this domain. `cap` is the request; the queue pair reports the grant.
    pub(crate) fn create_ud_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: QpCapRaw,
        recv_slot: usize,
        send_slot: usize,
    ) -> Result<UdQp, Errno> {
        let mut granted = cap;
        // SAFETY: live domain and queues, `granted` valid in and out; the
        // queue pair is destroyed once, by `UdQp::drop`.
        let qp = non_null(unsafe {
            udbtl_create_ud_qp(
                self.0.pd.as_ptr(),
                send_cq.0.cq.as_ptr(),
                recv_cq.0.cq.as_ptr(),
                &mut granted,
            )
        })?;
        // SAFETY: `qp` was just created.
        let qp_num = unsafe { udbtl_qp_num(qp.as_ptr()) };
        // From here on, dropping `out` (on any error below) destroys the
        // queue pair before the staging memory.
        let mut out = UdQp {
            qp,
            qp_num,
            cap: granted,
            recv: None,
            send: None,
            recv_posted: vec![false; granted.max_recv_wr as usize],
            send_slots: SlotPool::new(granted.max_send_wr),
            send_ahs: vec![None; granted.max_send_wr as usize],
            recv_slot,
            send_slot,
            _send_cq: send_cq.0.clone(),
            _recv_cq: recv_cq.0.clone(),
            _pd: self.0.clone(),
        };
        out.recv = Some(Staging::new(
            self,
            granted.max_recv_wr as usize * recv_slot,
        )?);
        out.send = Some(Staging::new(
            self,
            granted.max_send_wr as usize * send_slot,
        )?);
        Ok(out)
    }
}

// SAFETY: the queue pair may be used from any thread; the staging memory is
// owned; `&UdQp` offers nothing that mutates.
unsafe impl Send for UdQp {}

impl UdQp {
    /// The queue pair number.
    pub(crate) const fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The capacities granted.
    pub(crate) const fn cap(&self) -> QpCapRaw {
        self.cap
    }

    /// Free send slots.
    pub(crate) fn send_room(&self) -> usize {
        self.send_slots.available()
    }

    /// RESET → INIT.
    pub(crate) fn modify_init(
        &mut self,
        pkey_index: u16,
        port: u8,
        qkey: u32,
    ) -> Result<(), Errno> {
        // SAFETY: live queue pair.
        check(unsafe { udbtl_modify_qp_init(self.qp.as_ptr(), pkey_index, port, qkey) })
    }

    /// INIT → RTR.
    pub(crate) fn modify_rtr(&mut self) -> Result<(), Errno> {
        // SAFETY: live queue pair.
        check(unsafe { udbtl_modify_qp_rtr(self.qp.as_ptr()) })
    }

    /// RTR → RTS.
    pub(crate) fn modify_rts(&mut self, sq_psn: u32) -> Result<(), Errno> {
        // SAFETY: live queue pair.
        check(unsafe { udbtl_modify_qp_rts(self.qp.as_ptr(), sq_psn) })
    }

    /// Posts receives into staging slots: `(slot, len)` with `len` at most
    /// the slot size. A slot already posted is refused (`EBUSY`).
    ///
    /// # Errors
    /// `(accepted, errno)`: the first `accepted` were posted.
    pub(crate) fn post_recv(&mut self, reqs: &[(u32, u32)]) -> Result<(), (usize, Errno)> {
        let Some(staging) = &self.recv else {
            return Err((0, libc::EINVAL));
        };
        let mut raw = Vec::with_capacity(reqs.len());
        for (i, &(slot, len)) in reqs.iter().enumerate() {
            let idle = self.recv_posted.get(slot as usize) == Some(&false);
            let taken = reqs[..i].iter().any(|&(s, _)| s == slot);
            if !idle || taken || len as usize > self.recv_slot {
                return self.finish_recv(&raw, Some((i, libc::EBUSY)));
            }
            raw.push(RecvRaw {
                wr_id: RECV_BIT | u64::from(slot),
                addr: staging.addr(slot as usize * self.recv_slot),
                length: len,
                lkey: staging.lkey,
            });
        }
        self.finish_recv(&raw, None)
    }

    fn finish_recv(
        &mut self,
        raw: &[RecvRaw],
        refusal: Option<(usize, Errno)>,
    ) -> Result<(), (usize, Errno)> {
        let mut posted: c_int = 0;
        let count = c_int::try_from(raw.len()).unwrap_or(c_int::MAX);
        let rc = if raw.is_empty() {
            0
        } else {
            // SAFETY: live queue pair; every entry names a slot of this queue
            // pair's registered staging memory that is not posted, within
            // the slot; the memory outlives the queue pair (`Drop`).
            unsafe { udbtl_post_recv(self.qp.as_ptr(), raw.as_ptr(), count, &mut posted) }
        };
        let posted = usize::try_from(posted).unwrap_or(0).min(raw.len());
        for r in &raw[..posted] {
            if let Some(flag) = self.recv_posted.get_mut((r.wr_id & !RECV_BIT) as usize) {
                *flag = true;
            }
        }
        if rc != 0 {
            return Err((posted, rc));
        }
        refusal.map_or(Ok(()), Err)
    }

    /// Takes back the receive slot `wc` completed, and the bytes the device
    /// wrote there (GRH included; empty on error). `None` if `wc` is not a
    /// receive completion of this queue pair's posted slot.
    pub(crate) fn take_recv(&mut self, wc: &Completion) -> Option<(u32, &[u8])> {
        if !wc.is_recv() || wc.qp_num() != self.qp_num {
            return None;
        }
        let slot = wc.slot();
        let flag = self.recv_posted.get_mut(slot as usize)?;
        if !*flag {
            return None;
        }
        *flag = false;
        let staging = self.recv.as_ref()?;
        let len = if wc.status() == 0 {
            (wc.byte_len() as usize).min(self.recv_slot)
        } else {
            0
        };
        let offset = slot as usize * self.recv_slot;
        // SAFETY: the slot lies inside the staging allocation
        // (`slot < max_recv_wr`, region = slots × slot size); its completion
        // was polled, so the device no longer writes it, and it cannot be
        // posted again while the returned borrow of `self` lives.
        let bytes = unsafe { std::slice::from_raw_parts(staging.ptr.as_ptr().add(offset), len) };
        Some((slot, bytes))
    }

    /// Copies each send into a free staging slot and posts it, signaled (so
    /// that every slot comes back through [`take_send`](Self::take_send)).
    /// Slot numbers used are written to `slots`, in order.
    ///
    /// # Errors
    /// `(accepted, errno)`: `ENOMEM` when no slot is free, `EMSGSIZE` for a
    /// send larger than a slot, or what the device refused.
    pub(crate) fn post_send(
        &mut self,
        reqs: &[SendReq<'_>],
        slots: &mut [u32],
    ) -> Result<(), (usize, Errno)> {
        let Some(staging) = &self.send else {
            return Err((0, libc::EINVAL));
        };
        let mut raw = Vec::with_capacity(reqs.len());
        let mut refusal = None;
        for (i, req) in reqs.iter().enumerate() {
            let len: usize = req.gather.iter().map(|g| g.len()).sum();
            if len > self.send_slot || i >= slots.len() {
                refusal = Some((i, libc::EMSGSIZE));
                break;
            }
            let Some(slot) = self.send_slots.take() else {
                refusal = Some((i, libc::ENOMEM));
                break;
            };
            let offset = slot as usize * self.send_slot;
            let mut at = 0;
            for part in req.gather {
                // SAFETY: `slot` was free (not posted), so the device does
                // not read it; `offset + len <= region size` since
                // `len <= send_slot` and `slot < max_send_wr`; `part` is a
                // live borrow that cannot overlap owned staging memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        part.as_ptr(),
                        staging.ptr.as_ptr().add(offset + at),
                        part.len(),
                    );
                }
                at += part.len();
            }
            slots[i] = slot;
            let flags = 1
                | (u32::from(req.inline) << 1)
                | (u32::from(req.solicited) << 2)
                | (u32::from(req.imm.is_some()) << 3);
            raw.push(SendRaw {
                wr_id: u64::from(slot),
                addr: staging.addr(offset),
                ah: req.ah.0.ah.as_ptr(),
                length: u32::try_from(len).unwrap_or(u32::MAX),
                lkey: staging.lkey,
                remote_qpn: req.remote_qpn,
                remote_qkey: req.remote_qkey,
                imm: req.imm.unwrap_or(0),
                flags,
            });
            if let Some(keep) = self.send_ahs.get_mut(slot as usize) {
                *keep = Some(req.ah.clone());
            }
        }
        let mut posted: c_int = 0;
        let count = c_int::try_from(raw.len()).unwrap_or(c_int::MAX);
        let rc = if raw.is_empty() {
            0
        } else {
            // SAFETY: live queue pair; every entry names a filled slot of this
            // queue pair's registered staging memory and a live address
            // handle, both kept until the completion is taken (`send_ahs`,
            // `Drop`).
            unsafe { udbtl_post_send(self.qp.as_ptr(), raw.as_ptr(), count, &mut posted) }
        };
        let posted = usize::try_from(posted).unwrap_or(0).min(raw.len());
        // Slots of sends the device did not accept are free again.
        for r in &raw[posted..] {
            let slot = r.wr_id as u32;
            self.send_slots.give(slot);
            if let Some(keep) = self.send_ahs.get_mut(slot as usize) {
                *keep = None;
            }
        }
        if rc != 0 {
            return Err((posted, rc));
        }
        refusal.map_or(Ok(()), Err)
    }

    /// Takes back the send slot `wc` completed, releasing its address
    /// handle. `None` if `wc` is not a send completion of this queue pair's
    /// posted slot.
    pub(crate) fn take_send(&mut self, wc: &Completion) -> Option<u32> {
        if wc.is_recv() || wc.qp_num() != self.qp_num {
            return None;
        }
        let slot = wc.slot();
        if !self.send_slots.give(slot) {
            return None;
        }
        if let Some(keep) = self.send_ahs.get_mut(slot as usize) {
            *keep = None;
        }
        Some(slot)
    }
}

impl Drop for UdQp {
    fn drop(&mut self) {
        // SAFETY: created once in `Pd::create_ud_qp`; destroyed once, before
        // the staging memory and the queues and domain it uses (their
        // fields drop after this body).
        let rc = unsafe { udbtl_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            // The device may still write the receive slots or read the send
            // slots: never free them.
            tracing::error!(
                errno = rc,
                qp_num = self.qp_num,
                "ibv_destroy_qp failed; leaking its staging memory"
            );
            std::mem::forget(self.recv.take());
            std::mem::forget(self.send.take());
        }
    }
}
