//! The `verbs` provider's calls into libibverbs, through the C shim
//! (`shim.c`): every `unsafe` block of the provider is here, each with the
//! invariant it relies on.
//!
//! Ownership is ibverbs-crate style: every object is an `Arc` of an inner
//! value that holds the raw pointer **and an `Arc` of its parent**, so a
//! device outlives its protection domains and completion queues, and a
//! protection domain outlives its queue pairs, registrations and address
//! handles, whatever order the safe layer drops them in.
//!
//! Memory the device writes (receive staging) or reads (send staging) is
//! owned by the queue pair that posts into it ([`UdQp`]) and is never
//! reachable through a Rust reference while posted: a slot is posted by
//! [`UdQp::post_recv`]/[`UdQp::post_send`] and comes back only through
//! [`UdQp::take_recv`]/[`UdQp::take_send`], which accept a [`Completion`]
//! (constructible only here, from `ibv_poll_cq`) naming that slot. Dropping
//! a [`UdQp`] destroys the hardware queue pair before freeing its memory,
//! and leaks the memory rather than free it if the destroy fails.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::logic::{AhSpec, SlotPool};

/// `wr_id` bit that marks a receive; the low bits are the slot.
const RECV_BIT: u64 = 1 << 63;

/// An errno from a failed verb.
pub(crate) type Errno = i32;

fn last_errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|e| *e != 0)
        .unwrap_or(libc::EIO)
}

// ----- the shim's types: keep in sync with shim.c -------------------------

#[repr(C)]
struct IbvDevice {
    _opaque: [u8; 0],
}
#[repr(C)]
struct IbvContext {
    _opaque: [u8; 0],
}
#[repr(C)]
struct IbvPd {
    _opaque: [u8; 0],
}
#[repr(C)]
struct IbvMr {
    _opaque: [u8; 0],
}
#[repr(C)]
struct IbvCq {
    _opaque: [u8; 0],
}
#[repr(C)]
struct IbvQp {
    _opaque: [u8; 0],
}
#[repr(C)]
struct IbvAh {
    _opaque: [u8; 0],
}

/// `struct udbtl_dev_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DevAttr {
    pub(crate) max_qp: u32,
    pub(crate) max_qp_wr: u32,
    pub(crate) max_sge: u32,
    pub(crate) max_cq: u32,
    pub(crate) max_cqe: u32,
    pub(crate) max_mr: u32,
    pub(crate) max_ah: u32,
    pub(crate) phys_port_cnt: u32,
    pub(crate) node_guid: u64,
}

/// `struct udbtl_port_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PortAttrRaw {
    pub(crate) state: u32,
    pub(crate) max_mtu: u32,
    pub(crate) active_mtu: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) gid_tbl_len: i32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) link_layer: u8,
}

/// `struct udbtl_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QpCapRaw {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

#[repr(C)]
struct AhAttrRaw {
    dgid: [u8; 16],
    flow_label: u32,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    port_num: u8,
    is_global: u8,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
}

#[repr(C)]
struct SendRaw {
    wr_id: u64,
    addr: u64,
    ah: *mut IbvAh,
    length: u32,
    lkey: u32,
    remote_qpn: u32,
    remote_qkey: u32,
    imm: u32,
    flags: u32,
}

#[repr(C)]
struct RecvRaw {
    wr_id: u64,
    addr: u64,
    length: u32,
    lkey: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct WcRaw {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

unsafe extern "C" {
    fn udbtl_get_device_list(count: *mut c_int) -> *mut *mut IbvDevice;
    fn udbtl_free_device_list(list: *mut *mut IbvDevice);
    fn udbtl_device_name(dev: *mut IbvDevice) -> *const c_char;
    fn udbtl_event_type_str(event: u32) -> *const c_char;
    fn udbtl_open_device(dev: *mut IbvDevice) -> *mut IbvContext;
    fn udbtl_close_device(ctx: *mut IbvContext) -> c_int;
    fn udbtl_query_device(ctx: *mut IbvContext, out: *mut DevAttr) -> c_int;
    fn udbtl_query_port(ctx: *mut IbvContext, port: u8, out: *mut PortAttrRaw) -> c_int;
    fn udbtl_query_gid(ctx: *mut IbvContext, port: u8, index: c_int, out: *mut u8) -> c_int;
    fn udbtl_query_pkey(ctx: *mut IbvContext, port: u8, index: c_int, out: *mut u16) -> c_int;
    fn udbtl_alloc_pd(ctx: *mut IbvContext) -> *mut IbvPd;
    fn udbtl_dealloc_pd(pd: *mut IbvPd) -> c_int;
    fn udbtl_reg_mr(pd: *mut IbvPd, addr: *mut c_void, len: usize) -> *mut IbvMr;
    fn udbtl_mr_lkey(mr: *const IbvMr) -> u32;
    fn udbtl_dereg_mr(mr: *mut IbvMr) -> c_int;
    fn udbtl_create_cq(ctx: *mut IbvContext, cqe: c_int) -> *mut IbvCq;
    fn udbtl_cq_capacity(cq: *const IbvCq) -> c_int;
    fn udbtl_resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int;
    fn udbtl_destroy_cq(cq: *mut IbvCq) -> c_int;
    fn udbtl_create_ud_qp(
        pd: *mut IbvPd,
        send_cq: *mut IbvCq,
        recv_cq: *mut IbvCq,
        cap: *mut QpCapRaw,
    ) -> *mut IbvQp;
    fn udbtl_qp_num(qp: *const IbvQp) -> u32;
    fn udbtl_modify_qp_init(qp: *mut IbvQp, pkey_index: u16, port: u8, qkey: u32) -> c_int;
    fn udbtl_modify_qp_rtr(qp: *mut IbvQp) -> c_int;
    fn udbtl_modify_qp_rts(qp: *mut IbvQp, sq_psn: u32) -> c_int;
    fn udbtl_destroy_qp(qp: *mut IbvQp) -> c_int;
    fn udbtl_create_ah(pd: *mut IbvPd, attr: *const AhAttrRaw) -> *mut IbvAh;
    fn udbtl_destroy_ah(ah: *mut IbvAh) -> c_int;
    fn udbtl_post_send(
        qp: *mut IbvQp,
        list: *const SendRaw,
        count: c_int,
        posted: *mut c_int,
    ) -> c_int;
    fn udbtl_post_recv(
        qp: *mut IbvQp,
        list: *const RecvRaw,
        count: c_int,
        posted: *mut c_int,
    ) -> c_int;
    fn udbtl_poll_cq(cq: *mut IbvCq, count: c_int, out: *mut WcRaw) -> c_int;
    fn udbtl_get_async_event(ctx: *mut IbvContext, event_type: *mut u32, port: *mut u32) -> c_int;
}

/// Turns a returned pointer into an owned one, or the errno.
fn non_null<T>(ptr: *mut T) -> Result<NonNull<T>, Errno> {
    NonNull::new(ptr).ok_or_else(last_errno)
}

/// Turns a shim return code into a result.
fn check(rc: c_int) -> Result<(), Errno> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(rc),
        _ => Err(last_errno()),
    }
}

/// The name verbs gives an asynchronous event type.
pub(crate) fn event_name(event: u32) -> String {
    // SAFETY: `ibv_event_type_str` returns a pointer to a static string for
    // any value (an "unknown" string for values it does not define).
    let name = unsafe { udbtl_event_type_str(event) };
    if name.is_null() {
        return format!("event {event}");
    }
    // SAFETY: non-null, NUL-terminated and static, as above.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

// ----- devices ------------------------------------------------------------

/// The result of `ibv_get_device_list`, freed on drop.
#[derive(Debug)]
pub(crate) struct DeviceList {
    list: NonNull<*mut IbvDevice>,
    len: usize,
}

impl DeviceList {
    /// Lists the RDMA devices libibverbs finds.
    pub(crate) fn new() -> Result<Self, Errno> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer; the returned list is owned
        // by this value and freed once, in `Drop`.
        let list = non_null(unsafe { udbtl_get_device_list(&mut count) })?;
        Ok(Self {
            list,
            len: usize::try_from(count).unwrap_or(0),
        })
    }

    fn device(&self, index: usize) -> Option<*mut IbvDevice> {
        if index >= self.len {
            return None;
        }
        // SAFETY: the list holds `len` device pointers (then a NULL), and
        // lives as long as `self`.
        Some(unsafe { *self.list.as_ptr().add(index) })
    }

    /// The devices' names, in list order.
    pub(crate) fn names(&self) -> Vec<String> {
        (0..self.len)
            .filter_map(|i| self.device(i))
            .map(|dev| {
                // SAFETY: `dev` is a device of the live list; the name is a
                // NUL-terminated string inside it.
                let name = unsafe { udbtl_device_name(dev) };
                if name.is_null() {
                    return String::new();
                }
                // SAFETY: non-null and NUL-terminated, as above; copied out
                // before the list can be freed.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }

    /// Opens the device named `name`; `Ok(None)` if there is none.
    pub(crate) fn open(&self, name: &str) -> Result<Option<Device>, Errno> {
        let Some(index) = self.names().iter().position(|n| n == name) else {
            return Ok(None);
        };
        let Some(dev) = self.device(index) else {
            return Ok(None);
        };
        // SAFETY: `dev` belongs to the live list. An opened context stays
        // valid after the list is freed (libibverbs keeps the device
        // referenced); it is closed once, by `DeviceInner::drop`.
        let ctx = non_null(unsafe { udbtl_open_device(dev) })?;
        Ok(Some(Device(Arc::new(DeviceInner { ctx }))))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from `ibv_get_device_list` and is freed once.
        unsafe { udbtl_free_device_list(self.list.as_ptr()) }
    }
}

#[derive(Debug)]
struct DeviceInner {
    ctx: NonNull<IbvContext>,
}

// SAFETY: a verbs context may be used from any thread; libibverbs
// serializes what needs it. The pointer is only closed in `Drop`.
unsafe impl Send for DeviceInner {}
// SAFETY: as above: every call made through `&DeviceInner` is thread-safe
// in libibverbs.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: every child holds an `Arc` of this value, so none is left;
        // the context is closed once.
        let rc = unsafe { udbtl_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "ibv_close_device failed");
        }
    }
}

/// An asynchronous event of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AsyncEvent {
    /// `enum ibv_event_type`.
    pub(crate) kind: u32,
    /// The port of a port event, else 0.
    pub(crate) port: u8,
}

/// An opened device (`struct ibv_context`).
#[derive(Debug, Clone)]
pub(crate) struct Device(Arc<DeviceInner>);

impl Device {
    fn ctx(&self) -> *mut IbvContext {
        self.0.ctx.as_ptr()
    }

    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> Result<DevAttr, Errno> {
        let mut out = DevAttr::default();
        // SAFETY: live context, valid out-pointer.
        check(unsafe { udbtl_query_device(self.ctx(), &mut out) })?;
        Ok(out)
    }

    /// `ibv_query_port`.
    pub(crate) fn query_port(&self, port: u8) -> Result<PortAttrRaw, Errno> {
        let mut out = PortAttrRaw::default();
        // SAFETY: live context, valid out-pointer.
        check(unsafe { udbtl_query_port(self.ctx(), port, &mut out) })?;
        Ok(out)
    }

    /// `ibv_query_gid`.
    pub(crate) fn query_gid(&self, port: u8, index: u16) -> Result<[u8; 16], Errno> {
        let mut out = [0u8; 16];
        // SAFETY: live context; `out` has the 16 bytes the shim writes.
        check(unsafe { udbtl_query_gid(self.ctx(), port, c_int::from(index), out.as_mut_ptr()) })?;
        Ok(out)
    }

    /// `ibv_query_pkey`, in host order.
    pub(crate) fn query_pkey(&self, port: u8, index: u16) -> Result<u16, Errno> {
        let mut out = 0u16;
        // SAFETY: live context, valid out-pointer.
        check(unsafe { udbtl_query_pkey(self.ctx(), port, c_int::from(index), &mut out) })?;
        Ok(out)
    }

    /// `ibv_alloc_pd`.
    pub(crate) fn alloc_pd(&self) -> Result<Pd, Errno> {
        // SAFETY: live context; the domain is freed once, by `PdInner::drop`,
        // before the context (it holds the context's `Arc`).
        let pd = non_null(unsafe { udbtl_alloc_pd(self.ctx()) })?;
        Ok(Pd(Arc::new(PdInner {
            pd,
            _device: self.0.clone(),
        })))
    }

    /// `ibv_create_cq` with room for at least `depth` completions.
    pub(crate) fn create_cq(&self, depth: u32) -> Result<Cq, Errno> {
        let cqe = c_int::try_from(depth).map_err(|_| libc::EINVAL)?;
        // SAFETY: live context; the queue is destroyed once, by
        // `CqInner::drop`, after every queue pair on it (they hold its `Arc`).
        let cq = non_null(unsafe { udbtl_create_cq(self.ctx(), cqe) })?;
        // SAFETY: `cq` was just created.
        let capacity = unsafe { udbtl_cq_capacity(cq.as_ptr()) };
        Ok(Cq(Arc::new(CqInner {
            cq,
            capacity: AtomicU32::new(u32::try_from(capacity).unwrap_or(depth)),
            _device: self.0.clone(),
        })))
    }

    /// Reads one pending asynchronous event, acknowledged; `None` if there
    /// is none (the event file is nonblocking).
    pub(crate) fn next_async_event(&self) -> Result<Option<AsyncEvent>, Errno> {
        let (mut kind, mut port) = (0u32, 0u32);
        // SAFETY: live context (its async fd was made nonblocking at open),
        // valid out-pointers; the shim acknowledges the event it read.
        match unsafe { udbtl_get_async_event(self.ctx(), &mut kind, &mut port) } {
            0 => Ok(Some(AsyncEvent {
                kind,
                port: u8::try_from(port).unwrap_or(0),
            })),
            libc::EAGAIN => Ok(None),
            rc => Err(rc),
        }
    }
}

// ----- protection domains and address handles ------------------------------

#[derive(Debug)]
struct PdInner {
    pd: NonNull<IbvPd>,
    _device: Arc<DeviceInner>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: queue pairs, registrations and address handles hold this
        // value's `Arc`, so none is left; freed once.
        let rc = unsafe { udbtl_dealloc_pd(self.pd.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A protection domain.
#[derive(Debug, Clone)]
pub(crate) struct Pd(Arc<PdInner>);

impl Pd {
    /// `ibv_create_ah`.
    pub(crate) fn create_ah(&self, spec: &AhSpec) -> Result<Ah, Errno> {
        let grh = spec.grh;
        let attr = AhAttrRaw {
            dgid: grh.map(|g| g.dgid.raw()).unwrap_or_default(),
            flow_label: 0,
            dlid: spec.dlid,
            sl: spec.sl,
            src_path_bits: spec.src_path_bits,
            port_num: spec.port_num,
            is_global: u8::from(grh.is_some()),
            sgid_index: grh.map_or(0, |g| g.sgid_index),
            hop_limit: grh.map_or(0, |g| g.hop_limit),
            traffic_class: 0,
        };
        // SAFETY: live domain, `attr` valid for the call; the handle is
        // destroyed once, by `AhInner::drop`, when neither the safe layer nor
        // a posted send holds it.
        let ah = non_null(unsafe { udbtl_create_ah(self.0.pd.as_ptr(), &attr) })?;
        Ok(Ah(Arc::new(AhInner {
            ah,
            _pd: self.0.clone(),
        })))
    }

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

#[derive(Debug)]
struct AhInner {
    ah: NonNull<IbvAh>,
    _pd: Arc<PdInner>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: no posted send names this handle (each holds an `Arc` of
        // it until its completion is polled); destroyed once.
        let rc = unsafe { udbtl_destroy_ah(self.ah.as_ptr()) };
        if rc != 0 {
            tracing::warn!(errno = rc, "ibv_destroy_ah failed");
        }
    }
}

/// An address handle. Clones share it; it is destroyed with the last.
#[derive(Debug, Clone)]
pub(crate) struct Ah(Arc<AhInner>);

// ----- completion queues ----------------------------------------------------

#[derive(Debug)]
struct CqInner {
    cq: NonNull<IbvCq>,
    capacity: AtomicU32,
    _device: Arc<DeviceInner>,
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
pub(crate) struct Cq(Arc<CqInner>);

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

// ----- staging memory and queue pairs ----------------------------------------

/// Page-aligned memory registered for local write, freed after
/// deregistration. It is never borrowed as a whole: the owning [`UdQp`]
/// reads and writes it only through raw pointers to slots that are not
/// posted.
#[derive(Debug)]
struct Staging {
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
