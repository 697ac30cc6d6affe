//! The `extern "C"` surface that `src/component.c` calls, and the three C
//! functions it calls back: the crate's only `unsafe` code.
//!
//! Ownership: `udbtl_rs_init` returns the component (a leaked box) and
//! `udbtl_rs_finalize` takes it back; module handles live inside it and go
//! with it. The C side is single-threaded (the component declines
//! `MPI_THREAD_MULTIPLE`), and reentrant: ob1's callbacks, run from
//! `udbtl_rs_progress`, call the other functions here. So no Rust reference
//! to a module is held across a callback; each call takes its own, briefly,
//! from the raw handle.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;

use udbtl_btl::{Descriptor, EndpointId, HostEvent, LentBytes, Tag};

use crate::transport::{HostModule, OmpiTransport, param_table};

/// Statuses, as `component.c` defines them.
const OK: c_int = 0;
const BUSY: c_int = -1;
const UNREACH: c_int = -2;
const ERROR: c_int = -3;

/// Module limits, laid out as `struct udbtl_rs_limits` in `component.c`.
#[repr(C)]
#[derive(Debug)]
pub struct Limits {
    eager_limit: usize,
    rndv_eager_limit: usize,
    max_send_size: usize,
    exclusivity: u32,
    bandwidth: u32,
}

/// The component as C holds it.
#[derive(Debug)]
pub struct ComponentState {
    transport: OmpiTransport,
    /// Leaked boxes, reclaimed by `udbtl_rs_finalize`.
    handles: Vec<*mut ModuleHandle>,
}

/// A module as C holds it: its component and index.
#[derive(Debug)]
pub struct ModuleHandle {
    component: *mut ComponentState,
    index: usize,
}

unsafe extern "C" {
    fn udbtl_c_received(btl: *mut c_void, tag: u8, payload: *const u8, len: usize) -> c_int;
    fn udbtl_c_sent(btl: *mut c_void, context: u64, ok: c_int, owned: c_int);
    fn udbtl_c_error(btl: *mut c_void, endpoint_context: u64, fatal: c_int, message: *const c_char);
}

/// Runs `f` on the module behind `handle`; `None` for a handle that names no
/// module.
///
/// # Safety
/// `handle` is null or came from `udbtl_rs_module` of a component not yet
/// finalized, and no other reference to that component is live.
unsafe fn with_module<R>(
    handle: *mut c_void,
    f: impl FnOnce(&mut dyn HostModule) -> R,
) -> Option<R> {
    // SAFETY: per this function's contract, a non-null handle points to a
    // live ModuleHandle whose component is live and not otherwise borrowed;
    // the reference ends with this call.
    let handle = unsafe { handle.cast::<ModuleHandle>().as_ref()? };
    // SAFETY: as above.
    let component = unsafe { handle.component.as_mut()? };
    component.transport.module(handle.index).map(f)
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

/// How many parameters there are to register.
#[unsafe(no_mangle)]
pub extern "C" fn udbtl_rs_param_count() -> usize {
    param_table().len()
}

/// Parameter `index`: its name, default (null when unset), help, and whether
/// the seed had it. The strings live as long as the process. Returns 0, or
/// -3 for an index out of range.
///
/// # Safety
/// The out-pointers are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_param(
    index: usize,
    name: *mut *const c_char,
    default: *mut *const c_char,
    help: *mut *const c_char,
    from_seed: *mut c_int,
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
        *from_seed = c_int::from(entry.from_seed);
    }
    OK
}

/// Starts the transport: `values` has one entry per parameter, null where
/// Open MPI was given no value. On success returns the component and sets
/// `*modules`; on failure returns null with the reason in `error`.
///
/// # Safety
/// `values` holds `udbtl_rs_param_count()` pointers, each null or a
/// NUL-terminated string; `modules` is valid for a write; `error` is valid
/// for `error_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_init(
    values: *const *const c_char,
    job_id: u32,
    rank: u32,
    modules: *mut usize,
    error: *mut c_char,
    error_len: usize,
) -> *mut c_void {
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
    match OmpiTransport::init(&explicit, job_id, rank) {
        Ok(transport) => {
            // SAFETY: the caller passes a writable `modules`.
            unsafe { *modules = transport.module_count() };
            let state = Box::into_raw(Box::new(ComponentState {
                transport,
                handles: Vec::new(),
            }));
            state.cast()
        }
        Err(reason) => {
            // SAFETY: the caller passes `error_len` writable bytes.
            unsafe { write_c_string(&reason, error, error_len) };
            ptr::null_mut()
        }
    }
}

/// Module `index` of the component, and its limits; null if there is no
/// such module.
///
/// # Safety
/// `component` came from `udbtl_rs_init` and is not finalized; `limits` is
/// valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_module(
    component: *mut c_void,
    index: usize,
    limits: *mut Limits,
) -> *mut c_void {
    let component = component.cast::<ComponentState>();
    // SAFETY: per the contract, `component` is live and not borrowed
    // elsewhere during this call.
    let Some(state) = (unsafe { component.as_mut() }) else {
        return ptr::null_mut();
    };
    let Some(found) = state.transport.limits(index) else {
        return ptr::null_mut();
    };
    // SAFETY: the caller passes a writable `limits`.
    unsafe {
        *limits = Limits {
            eager_limit: found.eager_limit,
            rndv_eager_limit: found.rndv_eager_limit,
            max_send_size: found.max_send_size,
            exclusivity: found.exclusivity,
            bandwidth: found.bandwidth,
        };
    }
    let handle = Box::into_raw(Box::new(ModuleHandle { component, index }));
    state.handles.push(handle);
    handle.cast()
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
    let Some(state) = (unsafe { component.cast::<ComponentState>().as_ref() }) else {
        return 0;
    };
    let bytes = state.transport.modex();
    if bytes.len() <= capacity {
        // SAFETY: `blob` holds `capacity >= bytes.len()` bytes.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), blob, bytes.len()) };
    }
    bytes.len()
}

/// Adds the peer that published `blob`, attaching `context` (C's endpoint)
/// to it; sets `*endpoint`. Returns 0, -2 when this module cannot reach the
/// peer, -3 on failure.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `blob` is valid for `len` bytes;
/// `endpoint` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_add_proc(
    module: *mut c_void,
    blob: *const u8,
    len: usize,
    context: u64,
    endpoint: *mut u32,
) -> c_int {
    if blob.is_null() {
        return UNREACH;
    }
    // SAFETY: the caller passes `len` readable bytes at `blob`.
    let blob = unsafe { std::slice::from_raw_parts(blob, len) };
    // SAFETY: per the contract.
    match unsafe { with_module(module, |m| m.add_proc(blob, context)) } {
        Some(Ok(Some(id))) => {
            // SAFETY: the caller passes a writable `endpoint`.
            unsafe { *endpoint = id.raw() };
            OK
        }
        Some(Ok(None)) => UNREACH,
        Some(Err(err)) => {
            tracing::error!(%err, "adding a peer failed");
            ERROR
        }
        None => ERROR,
    }
}

/// Removes a peer. Returns 0 or -3.
///
/// # Safety
/// `module` came from `udbtl_rs_module`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_del_proc(module: *mut c_void, endpoint: u32) -> c_int {
    // SAFETY: per the contract.
    match unsafe { with_module(module, |m| m.del_proc(EndpointId::from_raw(endpoint))) } {
        Some(Ok(())) => OK,
        _ => ERROR,
    }
}

/// One progress pass over `module`, then every event it produced handed to
/// C's callbacks (`btl` is C's module, passed back to them), in order.
/// Returns the completions and events handled.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `btl` is the C module it belongs
/// to. The callbacks may call back into this surface.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_progress(module: *mut c_void, btl: *mut c_void) -> c_int {
    // SAFETY: per the contract; each call below borrows the module only
    // for its own duration, never across a callback.
    let Some(mut handled) = (unsafe { with_module(module, |m| m.poll()) }) else {
        return 0;
    };
    // SAFETY: as above.
    while let Some(event) = unsafe { with_module(module, |m| m.next_event()) }.flatten() {
        handled += 1;
        let mut claimed = true;
        match &event {
            HostEvent::Received(received) => {
                // SAFETY: the payload stays valid until the event is
                // finished, after the callback.
                claimed = unsafe {
                    udbtl_c_received(
                        btl,
                        received.tag.0,
                        received.payload_ptr(),
                        received.payload_len(),
                    )
                } != 0;
            }
            HostEvent::Sent { event, owned } => {
                // SAFETY: the context is the C fragment given at send time,
                // which stays allocated until this callback.
                unsafe {
                    udbtl_c_sent(
                        btl,
                        event.context,
                        c_int::from(event.status.is_ok()),
                        c_int::from(*owned),
                    );
                }
            }
            HostEvent::Error(error) => {
                let message =
                    std::ffi::CString::new(error.message.replace('\0', " ")).unwrap_or_default();
                let context = match error.endpoint {
                    Some(endpoint) => {
                        // SAFETY: as above.
                        unsafe { with_module(module, |m| m.endpoint_context(endpoint)) }
                            .flatten()
                            .unwrap_or(0)
                    }
                    None => 0,
                };
                // SAFETY: the message is a live NUL-terminated string; the
                // context is C's endpoint for that peer, or 0.
                unsafe { udbtl_c_error(btl, context, c_int::from(error.fatal), message.as_ptr()) };
            }
        }
        // SAFETY: as above.
        unsafe { with_module(module, |m| m.finish(event, claimed)) };
    }
    c_int::try_from(handled).unwrap_or(c_int::MAX)
}

/// A send fragment of `size` bytes: sets `*des` and `*data` (where its bytes
/// go). Returns 0, or -1 when none is free or `size` is too large.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; the out-pointers are valid for
/// writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_alloc(
    module: *mut c_void,
    order: u8,
    size: usize,
    des: *mut u32,
    data: *mut *mut c_void,
) -> c_int {
    // SAFETY: per the contract.
    match unsafe { with_module(module, |m| m.alloc(order, size)) }.flatten() {
        Some((descriptor, bytes)) => {
            // SAFETY: the caller passes writable out-pointers.
            unsafe {
                *des = descriptor.raw();
                *data = bytes.cast();
            }
            OK
        }
        None => BUSY,
    }
}

/// A user buffer ob1 lends for a zero-copy send.
#[derive(Debug)]
struct UserBuffer {
    addr: usize,
    len: usize,
}

impl LentBytes for UserBuffer {
    fn bytes(&self) -> &[u8] {
        // SAFETY: built by `udbtl_rs_prepare_lent` from memory its caller
        // keeps readable and unchanged until the send completes or the
        // descriptor is freed, which is as long as the BTL reads it (ob1
        // completes the request only from the send callback).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

/// A descriptor that sends `len` bytes at `data` without copying them, after
/// `reserve` bytes of header: sets `*des` and `*header` (where the header
/// goes). Returns 0, or -1 when it cannot (the caller copies instead).
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `data` is readable for `len` bytes
/// and stays unchanged until the descriptor's send completes or it is
/// freed; the out-pointers are valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_prepare_lent(
    module: *mut c_void,
    order: u8,
    reserve: usize,
    data: *const c_void,
    len: usize,
    des: *mut u32,
    header: *mut *mut c_void,
) -> c_int {
    if data.is_null() || len == 0 {
        return BUSY;
    }
    let lent = Box::new(UserBuffer {
        addr: data as usize,
        len,
    });
    // SAFETY: per the contract.
    match unsafe { with_module(module, |m| m.prepare_lent(lent, order, reserve)) }.flatten() {
        Some((descriptor, bytes)) => {
            // SAFETY: the caller passes writable out-pointers.
            unsafe {
                *des = descriptor.raw();
                *header = bytes.cast();
            }
            OK
        }
        None => BUSY,
    }
}

/// Frees a descriptor the caller owns. Returns 0 or -3.
///
/// # Safety
/// `module` came from `udbtl_rs_module`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_free(module: *mut c_void, des: u32) -> c_int {
    // SAFETY: per the contract.
    match unsafe { with_module(module, |m| m.free(Descriptor::from_raw(des))) } {
        Some(Ok(())) => OK,
        _ => ERROR,
    }
}

/// Sends the first `len` bytes of `des` to `endpoint` with `tag`; `owned`
/// lets the BTL free it on completion, whose callback gets `context`.
/// Returns 0, -2 for an endpoint this module does not know, -3 on failure
/// (the descriptor is then still the caller's).
///
/// # Safety
/// `module` came from `udbtl_rs_module`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_send(
    module: *mut c_void,
    endpoint: u32,
    des: u32,
    len: usize,
    tag: u8,
    owned: c_int,
    context: u64,
) -> c_int {
    // SAFETY: per the contract.
    let sent = unsafe {
        with_module(module, |m| {
            m.send(
                EndpointId::from_raw(endpoint),
                Descriptor::from_raw(des),
                len,
                Tag(tag),
                owned != 0,
                context,
            )
        })
    };
    match sent {
        Some(Ok(_)) => OK,
        Some(Err(udbtl_btl::BtlError::BadEndpoint { .. })) => UNREACH,
        Some(Err(err)) => {
            tracing::warn!(%err, "send refused");
            ERROR
        }
        None => ERROR,
    }
}

/// Writes the module's state for humans into `text`; returns its length.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `text` is valid for `capacity`
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_dump(
    module: *mut c_void,
    text: *mut c_char,
    capacity: usize,
) -> usize {
    // SAFETY: per the contract.
    let dump = unsafe { with_module(module, |m| m.dump()) }.unwrap_or_default();
    // SAFETY: the caller passes `capacity` writable bytes.
    unsafe { write_c_string(&dump, text, capacity) }
}

/// Writes the module's counters as `key=value` pairs into `text`; returns
/// their length.
///
/// # Safety
/// As `udbtl_rs_dump`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_stats_line(
    module: *mut c_void,
    text: *mut c_char,
    capacity: usize,
) -> usize {
    // SAFETY: per the contract.
    let line = unsafe { with_module(module, |m| m.stats_line()) }.unwrap_or_default();
    // SAFETY: the caller passes `capacity` writable bytes.
    unsafe { write_c_string(&line, text, capacity) }
}

/// Releases the component and its module handles. Returns 0, or -3 with the
/// leaks or failures found in `error`.
///
/// # Safety
/// `component` came from `udbtl_rs_init`, and neither it nor its module
/// handles are used again.
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
    // taken back once.
    let state = unsafe { Box::from_raw(component.cast::<ComponentState>()) };
    let ComponentState { transport, handles } = *state;
    for handle in handles {
        // SAFETY: each handle is a box `udbtl_rs_module` leaked, freed once.
        drop(unsafe { Box::from_raw(handle) });
    }
    match transport.finalize() {
        Ok(()) => OK,
        Err(reason) => {
            // SAFETY: the caller passes `error_len` writable bytes.
            unsafe { write_c_string(&reason, error, error_len) };
            ERROR
        }
    }
}
