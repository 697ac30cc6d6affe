//! A send the fault injector holds back to reorder it, and the flags it
//! leaves with later.

use crate::types::{AhHandle, Mr, SendFlags};

/// A send held back for reordering, with its bytes in a wrapper-owned
/// registration (none for an empty payload).
#[derive(Debug)]
pub(super) struct Held {
    pub(super) wr_id: u64,
    pub(super) ah: AhHandle,
    pub(super) remote_qpn: u32,
    pub(super) remote_qkey: u32,
    pub(super) imm: Option<u32>,
    pub(super) solicited: bool,
    pub(super) bounce: Option<Mr>,
}

/// `flags` without [`SendFlags::SIGNALED`].
pub(super) fn without_signaled(flags: SendFlags) -> SendFlags {
    [SendFlags::INLINE, SendFlags::SOLICITED]
        .into_iter()
        .filter(|f| flags.contains(*f))
        .fold(SendFlags::NONE, |acc, f| acc | f)
}
