//! The traffic half of the `extern "C"` surface: progress (a poll, then
//! every event handed to C's callbacks), descriptors and sends, and the
//! diagnostics C prints. Setup, peers and the helpers every entry point
//! shares are in `mod.rs`.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use udbtl_btl::{DesFlags, Descriptor, EndpointId, HostEvent, LentBytes, SendArgs, Tag};

use super::{BUSY, ERROR, Mod, ModuleHandle, OK, UNREACH, c_string, handle, rdma, write_c_string};
use crate::host;

unsafe extern "C" {
    fn udbtl_c_received(btl: *mut c_void, tag: u8, payload: *const u8, len: usize) -> c_int;
    fn udbtl_c_sent(btl: *mut c_void, context: u64, ok: c_int, owned: c_int);
    fn udbtl_c_error(btl: *mut c_void, endpoint_context: u64, fatal: c_int, message: *const c_char);
    fn udbtl_c_adopt(btl: *mut c_void, vpid: u32);
}

// ----- progress -----------------------------------------------------------

/// One progress pass over a module, if its idle gate lets this call poll
/// and no other thread is delivering its events: a poll of the fabric, then
/// every event handed to C's callbacks (`btl` is C's module, passed back to
/// them) in order, then the senders it does not know yet handed to C to
/// adopt. Returns the completions and events handled.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `btl` is the C module it belongs
/// to. The callbacks may call back into this surface.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_progress(module: *mut c_void, btl: *mut c_void) -> c_int {
    // SAFETY: per the contract.
    let Some(handle) = (unsafe { handle(module) }) else {
        return 0;
    };
    if !handle.gate.should_poll()
        || handle
            .delivering
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return 0;
    }
    let Some(module) = handle.module() else {
        handle.delivering.store(false, Ordering::Release);
        return 0;
    };
    let polled = module.poll();
    handle.gate.record(polled);
    let mut handled = polled.handled;
    while let Some(event) = module.next_event() {
        handled += 1;
        // SAFETY: per the contract, `btl` is the C module.
        let claimed = unsafe { deliver(module, btl, &event) };
        host::finish(module, event, claimed);
    }
    if polled.handled > 0 {
        // Unknown senders are only ever noted when datagrams arrive.
        for vpid in module.take_unknown_peers() {
            // SAFETY: per the contract, `btl` is the C module; adopting
            // calls back into this surface (add_proc), which is allowed.
            unsafe { udbtl_c_adopt(btl, vpid) };
        }
    }
    handle.delivering.store(false, Ordering::Release);
    c_int::try_from(handled).unwrap_or(c_int::MAX)
}

/// Hands one event to C's callback for it; returns whether a receive
/// callback took a received message.
///
/// # Safety
/// `btl` is the C module of `module`.
unsafe fn deliver(module: &Mod, btl: *mut c_void, event: &HostEvent) -> bool {
    match event {
        HostEvent::Received(received) => {
            // SAFETY: the payload stays valid until the event is finished,
            // after the callback.
            unsafe {
                udbtl_c_received(
                    btl,
                    received.tag.0,
                    received.payload_ptr(),
                    received.payload_len(),
                ) != 0
            }
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
            true
        }
        HostEvent::Error(error) => {
            let message = c_string(&error.message);
            let context = error
                .endpoint
                .and_then(|endpoint| module.endpoint_context(endpoint))
                .unwrap_or(0);
            // SAFETY: the message is a live NUL-terminated string; the
            // context is C's endpoint for that peer (endpoints live until
            // the module is finalized), or 0.
            unsafe { udbtl_c_error(btl, context, c_int::from(error.fatal), message.as_ptr()) };
            true
        }
        HostEvent::ReadDone(read) => {
            // SAFETY: `btl` is the C module; the context is what C gave
            // `udbtl_rs_get`, which it keeps until this call.
            unsafe { rdma::got(btl, read.context, &read.status) };
            true
        }
    }
}

/// Reads what is left on a module that Open MPI is closing, without
/// calling back into it: messages are dropped, sends are over, and
/// descriptors the BTL did not own are freed (Open MPI no longer will).
/// Returns the events dropped.
///
/// # Safety
/// `module` came from `udbtl_rs_module`, and no other thread uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_drain(module: *mut c_void) -> c_int {
    // SAFETY: per the contract.
    let Some(module) = (unsafe { handle(module) }).and_then(ModuleHandle::module) else {
        return 0;
    };
    let _ = module.poll();
    let mut dropped = 0;
    while let Some(event) = module.next_event() {
        dropped += 1;
        let lent = match &event {
            HostEvent::Sent {
                event,
                owned: false,
            } => Some(event.descriptor),
            _ => None,
        };
        module.finish_unclaimed(event);
        if let Some(des) = lent {
            let _ = module.free(des);
        }
    }
    dropped
}

// ----- descriptors and sends ----------------------------------------------

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
    let module = unsafe { handle(module) }.and_then(ModuleHandle::module);
    match module.and_then(|m| host::alloc(m, order, size)) {
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

/// A user buffer ob1 lends for a zero-copy send, or registers for its
/// peers to read.
#[derive(Debug)]
pub(super) struct UserBuffer {
    pub(super) addr: usize,
    pub(super) len: usize,
}

impl LentBytes for UserBuffer {
    fn bytes(&self) -> &[u8] {
        // SAFETY: built by `udbtl_rs_prepare_lent` from memory its caller
        // keeps readable and unchanged until the send completes or the
        // descriptor is freed, which is as long as the BTL reads it (ob1
        // completes the request only from the send callback); or by
        // `udbtl_rs_register` from memory kept so until deregistered and
        // the replies read from it are acknowledged (see its contract).
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
    let module = unsafe { handle(module) }.and_then(ModuleHandle::module);
    match module.and_then(|m| host::prepare_lent(m, lent, order, reserve)) {
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
    let module = unsafe { handle(module) }.and_then(ModuleHandle::module);
    match module.map(|m| m.free(Descriptor::from_raw(des))) {
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
    let Some(handle) = (unsafe { handle(module) }) else {
        return ERROR;
    };
    let Some(module) = handle.module() else {
        return ERROR;
    };
    handle.gate.wake();
    let args = SendArgs {
        len,
        tag: Tag(tag),
        flags: if owned != 0 {
            DesFlags::BTL_OWNERSHIP
        } else {
            DesFlags::NONE
        },
        context,
    };
    match module.send_with(
        EndpointId::from_raw(endpoint),
        Descriptor::from_raw(des),
        args,
    ) {
        Ok(_) => OK,
        Err(udbtl_btl::BtlError::BadEndpoint { .. }) => UNREACH,
        Err(err) => {
            tracing::warn!(%err, "send refused");
            ERROR
        }
    }
}

// ----- diagnostics ----------------------------------------------------------

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
    let module = unsafe { handle(module) }.and_then(ModuleHandle::module);
    let dump = module.map(ToString::to_string).unwrap_or_default();
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
    let module = unsafe { handle(module) }.and_then(ModuleHandle::module);
    let line = module.map(host::stats_line).unwrap_or_default();
    // SAFETY: the caller passes `capacity` writable bytes.
    unsafe { write_c_string(&line, text, capacity) }
}
