//! The `extern "C"` surface that the C files call, and the C functions it
//! calls back: the crate's only `unsafe` code.
//!
//! Ownership: `udbtl_rs_init` returns the component (a leaked box) and
//! `udbtl_rs_finalize` takes it back; its module handles are made with it
//! and go with it. Between the two the component is only ever shared: every
//! module method takes `&self` and locks the module itself, so Open MPI may
//! call in from any thread (`MPI_THREAD_MULTIPLE`). The C side's own state
//! (descriptors, endpoints) has its own lock. Callbacks into Open MPI run
//! with no Rust lock held, so that ob1's callbacks may call this BTL again
//! (ob1 sends from inside its receive and completion callbacks).
#![allow(unsafe_code)]

pub mod rdma;
pub mod traffic;

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::AtomicBool;

use tracing::Level;
use udbtl_btl::{EndpointId, JobLayout, Module};
use udbtl_fabric::AnyContext;

use crate::gate::IdleGate;
use crate::host::COUNTERS;
use crate::params::{McaType, param_table};
use crate::transport::{Identity, OmpiTransport, job_key};
use crate::{host, log};

/// A module of the component's transport.
type Mod = Module<AnyContext>;

/// Statuses, as `udbtl.h` defines them.
const OK: c_int = 0;
const BUSY: c_int = -1;
const UNREACH: c_int = -2;
const ERROR: c_int = -3;

/// Module limits, laid out as `struct udbtl_rs_limits` in `udbtl.h`.
#[repr(C)]
#[derive(Debug)]
pub struct Limits {
    eager_limit: usize,
    alloc_limit: usize,
    rndv_eager_limit: usize,
    max_send_size: usize,
    send_frags_max: usize,
    exclusivity: u32,
    bandwidth: u32,
    loopback: c_int,
    /// Most bytes one get may read; 0 when the module cannot (unreliable).
    get_limit: usize,
}

/// Who this process is, laid out as `struct udbtl_rs_identity`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RsIdentity {
    job_id: u32,
    vpid: u32,
    local_rank: u32,
    /// Every process of the job is on this host.
    one_host: c_int,
}

/// The component as C holds it.
#[derive(Debug)]
pub struct ComponentState {
    transport: OmpiTransport,
    /// One per module, made at init; a boxed slice never moves them.
    handles: Box<[ModuleHandle]>,
}

/// A module as C holds it.
#[derive(Debug)]
pub struct ModuleHandle {
    component: *const ComponentState,
    index: usize,
    /// Which progress calls poll the module.
    gate: IdleGate,
    /// A thread is delivering this module's events: another thread, or an
    /// inner progress call from one of ob1's callbacks, must not overtake
    /// them.
    delivering: AtomicBool,
}

unsafe extern "C" {
    fn udbtl_c_log(level: c_int, message: *const c_char);
}

/// The module handle behind `module`.
///
/// # Safety
/// `module` is null or came from `udbtl_rs_module` of a component not yet
/// finalized.
unsafe fn handle<'a>(module: *mut c_void) -> Option<&'a ModuleHandle> {
    // SAFETY: per the contract, a non-null pointer is a live handle, which
    // is only ever shared.
    unsafe { module.cast::<ModuleHandle>().as_ref() }
}

impl ModuleHandle {
    fn component(&self) -> &ComponentState {
        // SAFETY: a handle lives inside its component and goes with it, so
        // its component is live whenever the handle is.
        unsafe { &*self.component }
    }

    fn module(&self) -> Option<&Mod> {
        self.component().transport.module(self.index)
    }
}

/// The component behind `component`.
///
/// # Safety
/// `component` is null or came from `udbtl_rs_init` and is not finalized.
unsafe fn component<'a>(component: *mut c_void) -> Option<&'a ComponentState> {
    // SAFETY: per the contract; only ever shared between init and finalize.
    unsafe { component.cast::<ComponentState>().as_ref() }
}

/// Copies `text` into C's buffer of `capacity` bytes, NUL-terminated and
/// cut if need be; returns the length of `text`.
///
/// # Safety
/// `buffer` is null or valid for `capacity` bytes of writes.
unsafe fn write_c_string(text: &str, buffer: *mut c_char, capacity: usize) -> usize {
    if !buffer.is_null() && capacity > 0 {
        let n = text.len().min(capacity - 1);
        // SAFETY: `buffer` holds `capacity` bytes and `n + 1 <= capacity`;
        // the source is a live string of at least `n` bytes.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buffer, n);
            *buffer.add(n) = 0;
        }
    }
    text.len()
}

/// A Rust string for C: NUL bytes, which C cannot carry, become spaces.
fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', " ")).unwrap_or_default()
}

/// The log sink: every record through Open MPI's output.
fn log_to_open_mpi(level: Level, text: &str) {
    let code = match level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    };
    let text = c_string(text);
    // SAFETY: a live NUL-terminated string, read during the call only.
    unsafe { udbtl_c_log(code, text.as_ptr()) };
}

// ----- parameters and counters ------------------------------------------

/// How many parameters there are to register.
#[unsafe(no_mangle)]
pub extern "C" fn udbtl_rs_param_count() -> usize {
    param_table().len()
}

/// Parameter `index`: its name, default (null when unset), help, type (see
/// [`McaType`]) and `ompi_info` level. The strings live as long as the
/// process. Returns 0, or -3 for an index out of range.
///
/// # Safety
/// The out-pointers are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_param(
    index: usize,
    name: *mut *const c_char,
    default: *mut *const c_char,
    help: *mut *const c_char,
    mca_type: *mut c_int,
    level: *mut c_int,
) -> c_int {
    let Some(entry) = param_table().get(index) else {
        return ERROR;
    };
    // SAFETY: the caller passes valid out-pointers; the strings are in a
    // process-wide table that is never freed.
    unsafe {
        *name = entry.name.as_ptr();
        *default = entry.default.as_ref().map_or(ptr::null(), |d| d.as_ptr());
        *help = entry.help.as_ptr();
        *mca_type = entry.mca_type as c_int;
        *level = c_int::from(entry.level);
    }
    OK
}

/// Name `choice` of parameter `index` (a [`McaType::Choice`]), or null past
/// the last. The string lives as long as the process.
#[unsafe(no_mangle)]
pub extern "C" fn udbtl_rs_param_choice(index: usize, choice: usize) -> *const c_char {
    param_table()
        .get(index)
        .filter(|e| e.mca_type == McaType::Choice)
        .and_then(|e| e.choices.get(choice))
        .map_or(ptr::null(), |c| c.as_ptr())
}

/// How many counters there are ([`COUNTERS`]).
#[unsafe(no_mangle)]
pub extern "C" fn udbtl_rs_counter_count() -> usize {
    COUNTERS.len()
}

/// Counter `index`'s name and description, NUL-terminated into the
/// caller's buffers. Returns 0, or -3 for an index out of range.
///
/// # Safety
/// `name` and `help` are valid for `name_len` and `help_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_counter_info(
    index: usize,
    name: *mut c_char,
    name_len: usize,
    help: *mut c_char,
    help_len: usize,
) -> c_int {
    let Some((counter_name, counter_help)) = COUNTERS.get(index) else {
        return ERROR;
    };
    // SAFETY: the caller passes buffers of the lengths given.
    unsafe {
        write_c_string(counter_name, name, name_len);
        write_c_string(counter_help, help, help_len);
    }
    OK
}

/// Counter `index` summed over the modules; 0 without a component.
///
/// # Safety
/// `component` is null or came from `udbtl_rs_init` and is not finalized.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_counter(component: *mut c_void, index: usize) -> u64 {
    // SAFETY: per the contract.
    let Some(state) = (unsafe { self::component(component) }) else {
        return 0;
    };
    state.transport.counters().get(index).copied().unwrap_or(0)
}

// ----- the component ----------------------------------------------------

/// Starts the transport: `values` has one entry per parameter, null where
/// Open MPI was given no value. On success returns the component and sets
/// `*modules`; on failure returns null with the reason in `error`.
///
/// # Safety
/// `values` holds `udbtl_rs_param_count()` pointers, each null or a
/// NUL-terminated string; `who` and `modules` are valid; `error` is valid
/// for `error_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_init(
    values: *const *const c_char,
    who: *const RsIdentity,
    modules: *mut usize,
    error: *mut c_char,
    error_len: usize,
) -> *mut c_void {
    log::install(log_to_open_mpi);
    let explicit: Vec<Option<String>> = (0..param_table().len())
        .map(|i| {
            // SAFETY: the caller passes one pointer per parameter.
            let value = unsafe { *values.add(i) };
            (!value.is_null()).then(|| {
                // SAFETY: a non-null entry is a NUL-terminated string.
                unsafe { CStr::from_ptr(value) }
                    .to_string_lossy()
                    .into_owned()
            })
        })
        .collect();
    // SAFETY: the caller passes a valid identity.
    let who = unsafe { *who };
    let identity = Identity {
        job_id: who.job_id,
        vpid: who.vpid,
        local_rank: who.local_rank,
        layout: if who.one_host != 0 {
            JobLayout::OneHost
        } else {
            JobLayout::SpansHosts
        },
    };
    match OmpiTransport::init(&explicit, identity) {
        Ok(transport) => {
            let count = transport.module_count();
            let raw = Box::into_raw(Box::new(ComponentState {
                transport,
                handles: Box::default(),
            }));
            // SAFETY: just leaked: this is the only reference, and it ends
            // before the pointer is handed out.
            let state = unsafe { &mut *raw };
            state.handles = (0..count)
                .map(|index| ModuleHandle {
                    component: raw,
                    index,
                    gate: IdleGate::default(),
                    delivering: AtomicBool::new(false),
                })
                .collect();
            // SAFETY: the caller passes a writable `modules`.
            unsafe { *modules = count };
            raw.cast()
        }
        Err(reason) => {
            // SAFETY: the caller passes `error_len` writable bytes.
            unsafe { write_c_string(&reason, error, error_len) };
            ptr::null_mut()
        }
    }
}

/// Module `index` of the component; null if there is no such module.
///
/// # Safety
/// `component` came from `udbtl_rs_init` and is not finalized.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_module(component: *mut c_void, index: usize) -> *mut c_void {
    // SAFETY: per the contract.
    let Some(state) = (unsafe { self::component(component) }) else {
        return ptr::null_mut();
    };
    state.handles.get(index).map_or(ptr::null_mut(), |h| {
        ptr::from_ref::<ModuleHandle>(h).cast_mut().cast()
    })
}

/// The module's limits now (they shrink when a peer with smaller datagrams
/// is added). Returns 0, or -3 for an unknown module.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `limits` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_limits(module: *mut c_void, limits: *mut Limits) -> c_int {
    // SAFETY: per the contract.
    let Some(handle) = (unsafe { handle(module) }) else {
        return ERROR;
    };
    let Some(module) = handle.module() else {
        return ERROR;
    };
    let found = module.limits();
    // SAFETY: the caller passes a writable `limits`.
    unsafe {
        *limits = Limits {
            eager_limit: found.eager_limit,
            alloc_limit: found.alloc_limit,
            rndv_eager_limit: found.rndv_eager_limit.min(found.eager_limit),
            max_send_size: found.frag_limit,
            send_frags_max: found.send_frags_max,
            exclusivity: found.exclusivity,
            bandwidth: found.bandwidth,
            loopback: c_int::from(host::is_loopback(module)),
            get_limit: if module.reliability_stats().is_some() {
                found.read_limit()
            } else {
                0
            },
        };
    }
    OK
}

/// Writes this process's address blob into `blob` (up to `capacity` bytes);
/// returns its length, which exceeds `capacity` if it did not fit.
///
/// # Safety
/// `component` came from `udbtl_rs_init` and is live; `blob` is valid for
/// `capacity` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_modex(
    component: *mut c_void,
    blob: *mut u8,
    capacity: usize,
) -> usize {
    // SAFETY: per the contract.
    let Some(state) = (unsafe { self::component(component) }) else {
        return 0;
    };
    let bytes = state.transport.modex();
    if bytes.len() <= capacity {
        // SAFETY: `blob` holds `capacity >= bytes.len()` bytes.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), blob, bytes.len()) };
    }
    bytes.len()
}

/// Releases the component and its module handles. Returns 0, or -3 with the
/// leaks or failures found in `error`.
///
/// # Safety
/// `component` came from `udbtl_rs_init`, no call into it or its modules is
/// in progress on any thread, and neither is used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_finalize(
    component: *mut c_void,
    error: *mut c_char,
    error_len: usize,
) -> c_int {
    if component.is_null() {
        return OK;
    }
    // SAFETY: per the contract, this is the box `udbtl_rs_init` leaked,
    // taken back once, with no other reference live.
    let state = unsafe { Box::from_raw(component.cast::<ComponentState>()) };
    let ComponentState { transport, handles } = *state;
    drop(handles);
    match transport.finalize() {
        Ok(()) => OK,
        Err(reason) => {
            // SAFETY: the caller passes `error_len` writable bytes.
            unsafe { write_c_string(&reason, error, error_len) };
            ERROR
        }
    }
}

// ----- peers ------------------------------------------------------------

/// Adds the peer `vpid` of job `job_id` (`own_job` when it is this
/// process's job) that published `blob`, if this module is the one to carry
/// its traffic, attaching `context` (C's endpoint) to it. Sets `*endpoint`,
/// and `*existing` to the context of an endpoint that was already there
/// (added by another thread, or by an add made from inside this one), else
/// to `context`. Returns 0, -2 when this module does not take the peer, -3
/// on failure.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `blob` is valid for `len` bytes;
/// `endpoint` and `existing` are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_add_proc(
    module: *mut c_void,
    blob: *const u8,
    len: usize,
    job_id: u32,
    vpid: u32,
    own_job: c_int,
    context: u64,
    endpoint: *mut u32,
    existing: *mut u64,
) -> c_int {
    // SAFETY: per the contract.
    let Some(handle) = (unsafe { handle(module) }) else {
        return ERROR;
    };
    if blob.is_null() {
        return UNREACH;
    }
    // SAFETY: the caller passes `len` readable bytes at `blob`.
    let blob = unsafe { std::slice::from_raw_parts(blob, len) };
    let transport = &handle.component().transport;
    let key = if own_job != 0 {
        transport.job_key()
    } else {
        job_key(job_id)
    };
    let peer = if own_job != 0 {
        format!("rank {vpid}")
    } else {
        format!("rank {vpid} of job {job_id}")
    };
    match transport.add_proc(handle.index, &peer, blob, key, context) {
        Ok(Some((id, in_force))) => {
            // SAFETY: the caller passes writable out-pointers.
            unsafe {
                *endpoint = id.raw();
                *existing = in_force;
            }
            OK
        }
        Ok(None) => UNREACH,
        Err(err) => {
            tracing::error!(%err, "adding a peer failed");
            ERROR
        }
    }
}

/// Removes a peer. Sends to it that cannot complete any more are reported
/// at the next progress. Returns 0 or -3.
///
/// # Safety
/// `module` came from `udbtl_rs_module`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_del_proc(module: *mut c_void, endpoint: u32) -> c_int {
    // SAFETY: per the contract.
    let module = unsafe { handle(module) }.and_then(ModuleHandle::module);
    match module.map(|m| m.del_procs_host(&[EndpointId::from_raw(endpoint)])) {
        Some(Ok(())) => OK,
        _ => ERROR,
    }
}
