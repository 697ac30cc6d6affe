//! The `verbs` provider's calls into libibverbs, through the C shim
//! (`shim.c`): every `unsafe` block of the provider is in this module and
//! its four files (devices, protection domains, completion queues, queue
//! pairs), each with the invariant it relies on.
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

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::NonNull;

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

// ----- the objects, each owning its raw pointer and an `Arc` of its parent --

mod cq;
mod device;
mod pd;
mod qp;

pub(crate) use cq::{Completion, Cq};
pub(crate) use device::{Device, DeviceList};
pub(crate) use pd::{Ah, Pd};
pub(crate) use qp::{SendReq, UdQp};

use cq::CqInner;
use device::DeviceInner;
use pd::PdInner;
