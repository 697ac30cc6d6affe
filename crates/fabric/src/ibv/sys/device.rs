//! Devices: the list libibverbs finds, an opened device (context), its
//! attributes and asynchronous events; it allocates protection domains and
//! completion queues.

use std::ffi::{CStr, c_int};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use super::{
    Cq, CqInner, DevAttr, Errno, IbvContext, IbvDevice, Pd, PdInner, PortAttrRaw, check, non_null,
    udbtl_alloc_pd, udbtl_close_device, udbtl_cq_capacity, udbtl_create_cq, udbtl_device_name,
    udbtl_free_device_list, udbtl_get_async_event, udbtl_get_device_list, udbtl_open_device,
    udbtl_query_device, udbtl_query_gid, udbtl_query_pkey, udbtl_query_port,
};

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
pub(super) struct DeviceInner {
    pub(super) ctx: NonNull<IbvContext>,
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
pub(crate) struct Device(pub(super) Arc<DeviceInner>);

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
