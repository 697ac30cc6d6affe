//! Completion queues and the completions polled from them.

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{
    DeviceInner, Errno, IbvCq, RECV_BIT, WcRaw, check, udbtl_cq_capacity, udbtl_destroy_cq,
    udbtl_poll_cq, udbtl_resize_cq,
};

#[derive(Debug)]
pub(super) struct CqInner {
    pub(super) cq: NonNull<IbvCq>,
    pub(super) capacity: AtomicU32,
    pub(super) _device: Arc<DeviceInner>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: queue pairs on this queue hold its `Arc`, so none is left;
        // destroyed once.
        let rc = unsafe { udbtl_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "ibv_destroy_cq failed");
        }
    }
}

/// A completion queue.
#[derive(Debug, Clone)]
pub(crate) struct Cq(pub(super) Arc<CqInner>);

/// One polled completion. Only [`Cq::poll`] makes them, so a slot named by
/// one was really completed by the device.
#[derive(Debug, Clone, Copy, Default)]
#[repr(transparent)]
pub(crate) struct Completion(WcRaw);

impl Completion {
    /// `true` for the completion of a receive (from the `wr_id`, which is
    /// valid even in an error completion, unlike the opcode).
    pub(crate) const fn is_recv(&self) -> bool {
        self.0.wr_id & RECV_BIT != 0
    }

    /// The staging slot the work request used.
    pub(crate) const fn slot(&self) -> u32 {
        (self.0.wr_id & !RECV_BIT) as u32
    }

    /// `enum ibv_wc_status`.
    pub(crate) const fn status(&self) -> u32 {
        self.0.status
    }

    /// The vendor's error code.
    pub(crate) const fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// Bytes received, GRH included.
    pub(crate) const fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Immediate data, host order (0 unless flagged).
    pub(crate) const fn imm(&self) -> u32 {
        self.0.imm_data
    }

    /// The local queue pair.
    pub(crate) const fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// The sending queue pair of a receive.
    pub(crate) const fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// `IBV_WC_*` flags.
    pub(crate) const fn wc_flags(&self) -> u32 {
        self.0.wc_flags
    }

    /// The sender's LID.
    pub(crate) const fn slid(&self) -> u16 {
        self.0.slid
    }
}

impl Cq {
    /// Completions the queue holds.
    pub(crate) fn capacity(&self) -> u32 {
        self.0.capacity.load(Ordering::Relaxed)
    }

    /// `ibv_resize_cq` to at least `depth` (never shrinks).
    pub(crate) fn grow(&self, depth: u32) -> Result<(), Errno> {
        if depth <= self.capacity() {
            return Ok(());
        }
        let cqe = c_int::try_from(depth).map_err(|_| libc::EINVAL)?;
        // SAFETY: live queue; resizing keeps its pending completions.
        check(unsafe { udbtl_resize_cq(self.0.cq.as_ptr(), cqe) })?;
        // SAFETY: live queue.
        let now = unsafe { udbtl_cq_capacity(self.0.cq.as_ptr()) };
        self.0
            .capacity
            .store(u32::try_from(now).unwrap_or(depth), Ordering::Relaxed);
        Ok(())
    }

    /// `ibv_poll_cq` into `out`; returns how many were written.
    pub(crate) fn poll(&self, out: &mut [Completion]) -> Result<usize, Errno> {
        let count = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        // SAFETY: live queue; `Completion` is a `repr(transparent)` newtype of
        // the `repr(C)` `WcRaw`, and the shim
        // writes at most `count` of them.
        let got =
            unsafe { udbtl_poll_cq(self.0.cq.as_ptr(), count, out.as_mut_ptr().cast::<WcRaw>()) };
        usize::try_from(got).map_err(|_| libc::EIO)
    }
}
