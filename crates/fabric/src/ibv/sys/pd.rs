//! Protection domains and the address handles created in them.

use std::ptr::NonNull;
use std::sync::Arc;

use super::{
    AhAttrRaw, DeviceInner, Errno, IbvAh, IbvPd, non_null, udbtl_create_ah, udbtl_dealloc_pd,
    udbtl_destroy_ah,
};
use crate::ibv::logic::AhSpec;

#[derive(Debug)]
pub(super) struct PdInner {
    pub(super) pd: NonNull<IbvPd>,
    pub(super) _device: Arc<DeviceInner>,
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
pub(crate) struct Pd(pub(super) Arc<PdInner>);

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
}

#[derive(Debug)]
pub(super) struct AhInner {
    pub(super) ah: NonNull<IbvAh>,
    pub(super) _pd: Arc<PdInner>,
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
pub(crate) struct Ah(pub(super) Arc<AhInner>);
