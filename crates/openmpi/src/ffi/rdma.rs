//! The `get` of the BTL interface, emulated over the reliable stream
//! (`udbtl_btl`'s remote reads): memory registration for peers to read, and
//! reads of theirs, whose completion reaches C's `udbtl_c_got`.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use udbtl_btl::{BtlError, EndpointId, ReadFailure, ReadTarget, RegionKey, RemoteRange};

use super::traffic::UserBuffer;
use super::{BUSY, ERROR, OK, UNREACH, handle};

/// `udbtl_c_got` statuses, as `udbtl.h` defines them.
const GOT_OK: c_int = 0;
const GOT_REFUSED: c_int = 1;
const GOT_PEER_LOST: c_int = 2;

unsafe extern "C" {
    fn udbtl_c_got(btl: *mut c_void, context: u64, status: c_int);
}

/// Names the processes whose memory this one may read by PID, for gets on
/// one host (`local_read.c`): see [`udbtl_fabric::udp::memory_domain`].
/// Returns 0 where there is none.
#[unsafe(no_mangle)]
pub extern "C" fn udbtl_rs_memory_domain() -> u64 {
    udbtl_fabric::udp::memory_domain().unwrap_or(0)
}

/// Memory ob1 reads into: a receive buffer.
#[derive(Debug)]
struct UserTarget {
    addr: usize,
    len: usize,
}

impl ReadTarget for UserTarget {
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: built by `udbtl_rs_get` from memory its caller keeps
        // writable, and touches no other way, until the read's completion
        // (ob1 completes the receive only from the get's callback); the
        // module writes it only between the two.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

/// Lets the module's peers read `len` bytes at `base`: sets `*key`, the
/// region's name for them. Returns 0, or -3 for an unknown module or an
/// empty region.
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `base` is readable for `len`
/// bytes, unchanged, until `udbtl_rs_deregister` and until the reads that
/// the peers finished are acknowledged (ob1 deregisters on the reader's
/// FIN, which acknowledges them); `key` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_register(
    module: *mut c_void,
    base: *const c_void,
    len: usize,
    key: *mut u64,
) -> c_int {
    // SAFETY: per the contract.
    let Some(module) = (unsafe { handle(module) }).and_then(|h| h.module()) else {
        return ERROR;
    };
    if base.is_null() || len == 0 {
        return ERROR;
    }
    let region = Arc::new(UserBuffer {
        addr: base as usize,
        len,
    });
    let registered = module.register_region(region);
    // SAFETY: the caller passes a writable `key`.
    unsafe { *key = registered.0 };
    OK
}

/// Stops serving reads of the region `key`. Returns 0, or -3 when the key
/// names no region of this module.
///
/// # Safety
/// `module` came from `udbtl_rs_module`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_deregister(module: *mut c_void, key: u64) -> c_int {
    // SAFETY: per the contract.
    let module = unsafe { handle(module) }.and_then(|h| h.module());
    match module.map(|m| m.deregister_region(RegionKey(key))) {
        Some(true) => OK,
        _ => ERROR,
    }
}

/// Reads `len` bytes at `remote_addr` in `endpoint`'s region `remote_key`
/// into `local`; `udbtl_c_got` reports the outcome with `context`, from
/// progress. Returns 0; -1 when no fragment is free for the request now
/// (retry later); -2 for an endpoint this module does not know or has
/// lost; -3 for anything else (an unreliable module, or a read longer than
/// the module's read limit).
///
/// # Safety
/// `module` came from `udbtl_rs_module`; `local` is writable for `len`
/// bytes, and nothing else touches them, until `udbtl_c_got` reports the
/// read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn udbtl_rs_get(
    module: *mut c_void,
    endpoint: u32,
    local: *mut c_void,
    len: usize,
    remote_addr: u64,
    remote_key: u64,
    context: u64,
) -> c_int {
    // SAFETY: per the contract.
    let Some(handle) = (unsafe { handle(module) }) else {
        return ERROR;
    };
    let Some(module) = handle.module() else {
        return ERROR;
    };
    if local.is_null() || len == 0 {
        return ERROR;
    }
    handle.gate.wake();
    let target = Box::new(UserTarget {
        addr: local as usize,
        len,
    });
    let from = RemoteRange {
        key: RegionKey(remote_key),
        addr: remote_addr,
    };
    match module.read(EndpointId::from_raw(endpoint), target, from, context) {
        Ok(()) => OK,
        Err(BtlError::NoFragment { .. }) => BUSY,
        Err(BtlError::BadEndpoint { .. } | BtlError::PeerUnavailable { .. }) => UNREACH,
        Err(err) => {
            tracing::warn!(%err, "get refused");
            ERROR
        }
    }
}

/// Tells C that a read is over.
///
/// # Safety
/// `btl` is the C module of the module that read; `context` is what C gave
/// `udbtl_rs_get`.
pub(super) unsafe fn got(btl: *mut c_void, context: u64, status: &Result<(), ReadFailure>) {
    let status = match status {
        Ok(()) => GOT_OK,
        Err(ReadFailure::PeerLost) => GOT_PEER_LOST,
        Err(_) => GOT_REFUSED,
    };
    // SAFETY: per the contract.
    unsafe { udbtl_c_got(btl, context, status) };
}
