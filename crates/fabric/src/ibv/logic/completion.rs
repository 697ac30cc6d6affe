//! Completions and staging: the verbs completion fields ([`wc_status`],
//! [`wc_opcode`], the `WC_*` bits, [`grh_source_gid`]), where the device
//! writes a receive, GRH included ([`RecvLayout`]), and which staging slots
//! are free ([`SlotPool`]).

use super::port::Gid;
use crate::types::{GRH_LEN, WcOpcode, WcStatus};

/// `IBV_WC_RECV`: receive opcodes have this bit set.
pub const WC_RECV_BIT: u32 = 1 << 7;
/// `IBV_WC_GRH`: the receive buffer starts with a valid GRH.
pub const WC_FLAG_GRH: u32 = 1 << 0;
/// `IBV_WC_WITH_IMM`: the completion carries immediate data.
pub const WC_FLAG_WITH_IMM: u32 = 1 << 1;

/// A completion status (`enum ibv_wc_status`) as a [`WcStatus`].
pub const fn wc_status(status: u32) -> WcStatus {
    match status {
        0 => WcStatus::Success,
        1 => WcStatus::LocalLengthError,
        4 => WcStatus::LocalProtectionError,
        5 => WcStatus::WrFlushError,
        _ => WcStatus::GeneralError,
    }
}

/// A completion opcode (`enum ibv_wc_opcode`) as a [`WcOpcode`].
pub const fn wc_opcode(opcode: u32) -> WcOpcode {
    if opcode & WC_RECV_BIT != 0 {
        WcOpcode::Recv
    } else {
        WcOpcode::Send
    }
}

/// The source GID of a received GRH: bytes 8..24 of the 40-byte header
/// the device writes in front of the payload.
pub fn grh_source_gid(grh: &[u8; GRH_LEN]) -> Gid {
    let mut raw = [0; 16];
    raw.copy_from_slice(&grh[8..24]);
    Gid(raw)
}

/// Where the provider stages receives: a registered region of `slots`
/// equal slots, each `GRH_LEN + max_payload` bytes. The device writes a
/// datagram's GRH at the start of its slot and the payload right after, so
/// a completion's `byte_len` is `GRH_LEN + payload`: the same layout the
/// fabric contract gives every receive buffer ([`GRH_LEN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvLayout {
    /// Number of slots.
    pub slots: usize,
    /// Bytes per slot.
    pub slot_len: usize,
}

impl RecvLayout {
    /// The layout for `slots` receives of up to `max_payload` bytes.
    pub const fn new(slots: usize, max_payload: usize) -> Self {
        Self {
            slots,
            slot_len: GRH_LEN + max_payload,
        }
    }

    /// The region's length in bytes.
    pub const fn region_len(&self) -> usize {
        self.slots * self.slot_len
    }

    /// Byte offset of slot `slot` in the region.
    pub const fn offset(&self, slot: usize) -> usize {
        slot * self.slot_len
    }

    /// Length of the scatter entry to post for a caller buffer of
    /// `buffer_len` bytes: the caller's length, capped at the slot, so the
    /// device itself reports a datagram that does not fit the caller's
    /// buffer (`IBV_WC_LOC_LEN_ERR`) exactly as it would in place.
    pub fn post_len(&self, buffer_len: usize) -> u32 {
        u32::try_from(buffer_len.min(self.slot_len)).unwrap_or(u32::MAX)
    }

    /// The range of slot `slot` a completion of `byte_len` bytes filled
    /// (GRH included), clamped to the slot.
    pub fn filled(&self, slot: usize, byte_len: u32) -> core::ops::Range<usize> {
        let start = self.offset(slot);
        start..start + (byte_len as usize).min(self.slot_len)
    }
}

/// A free list of staging slots, handed out by index: a slot belongs to
/// exactly one posted work request until its completion is polled.
#[derive(Debug, Clone)]
pub struct SlotPool {
    free: Vec<u32>,
    busy: Vec<bool>,
}

impl SlotPool {
    /// A pool of `count` free slots.
    pub fn new(count: u32) -> Self {
        Self {
            free: (0..count).rev().collect(),
            busy: vec![false; count as usize],
        }
    }

    /// Takes a free slot, or `None` when all are posted.
    pub fn take(&mut self) -> Option<u32> {
        let slot = self.free.pop()?;
        if let Some(busy) = self.busy.get_mut(slot as usize) {
            *busy = true;
        }
        Some(slot)
    }

    /// Returns a slot; `false` (and no change) if it was not taken.
    pub fn give(&mut self, slot: u32) -> bool {
        match self.busy.get_mut(slot as usize) {
            Some(busy) if *busy => {
                *busy = false;
                self.free.push(slot);
                true
            }
            _ => false,
        }
    }

    /// Slots free.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Slots in the pool.
    pub fn capacity(&self) -> usize {
        self.busy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(text: &str) -> Gid {
        text.parse().expect("gid")
    }

    #[test]
    fn completion_fields_map_from_verbs_values() {
        assert_eq!(wc_status(0), WcStatus::Success);
        assert_eq!(wc_status(1), WcStatus::LocalLengthError);
        assert_eq!(wc_status(4), WcStatus::LocalProtectionError);
        assert_eq!(wc_status(5), WcStatus::WrFlushError);
        assert_eq!(wc_status(12), WcStatus::GeneralError);
        assert_eq!(wc_opcode(0), WcOpcode::Send);
        assert_eq!(wc_opcode(128), WcOpcode::Recv);
        assert_eq!(wc_opcode(129), WcOpcode::Recv);
    }

    #[test]
    fn receive_slots_hold_the_grh_then_the_payload() {
        let layout = RecvLayout::new(4, 4096);
        assert_eq!(layout.slot_len, GRH_LEN + 4096);
        assert_eq!(layout.region_len(), 4 * (40 + 4096));
        assert_eq!(layout.offset(2), 2 * 4136);
        // A caller buffer smaller than a slot is posted at its own length,
        // a larger one at the slot's.
        assert_eq!(layout.post_len(GRH_LEN + 100), 140);
        assert_eq!(layout.post_len(1 << 20), 4136);
        // A completion of GRH + 10 bytes filled the slot's first 50 bytes:
        // GRH at 0..40, payload at 40..50, as GRH_LEN promises.
        assert_eq!(layout.filled(1, 50), 4136..4186);
        assert_eq!(layout.filled(0, u32::MAX), 0..4136);
        let mut grh = [0u8; GRH_LEN];
        grh[8..24].copy_from_slice(&gid("fe80::0202:c9ff:fe00:1234").raw());
        assert_eq!(grh_source_gid(&grh), gid("fe80::202:c9ff:fe00:1234"));
    }

    #[test]
    fn slot_pool_hands_each_slot_to_one_owner() {
        let mut pool = SlotPool::new(3);
        assert_eq!(pool.capacity(), 3);
        let a = pool.take().expect("slot");
        let b = pool.take().expect("slot");
        let c = pool.take().expect("slot");
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(pool.take(), None);
        assert!(pool.give(b));
        assert!(!pool.give(b), "a slot is returned once");
        assert!(!pool.give(7), "an unknown slot is refused");
        assert_eq!(pool.available(), 1);
        assert_eq!(pool.take(), Some(b));
    }
}
