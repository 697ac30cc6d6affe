//! Wrap-safe sequence numbers.
//!
//! [`SeqNum`] is a 32-bit counter compared with serial-number arithmetic
//! (RFC 1982): `a` is before `b` when the forward distance from `a` to `b`,
//! taken modulo 2³², is less than 2³¹. Raw `u32`s are never compared with `<`
//! anywhere in udbtl; that is the reason this type exists.
//!
//! Serial order is not a total order (two numbers exactly 2³¹ apart are
//! neither before nor after each other), so `SeqNum` deliberately does not
//! implement `PartialOrd`/`Ord`. Windows in udbtl are far smaller than 2³¹, so
//! every pair the protocol compares is well ordered.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A sequence number with serial-number (wrap-safe) arithmetic.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNum(pub u32);

impl SeqNum {
    /// The epoch of `self` (the high 32 bits of its 64-bit stream
    /// position) when it lies within 2³¹ of `reference`, whose epoch is
    /// `reference_epoch`: one less if it is before `reference` across a
    /// wrap, one more if after across one.
    #[must_use]
    pub const fn epoch_near(self, reference: Self, reference_epoch: u32) -> u32 {
        let base = ((reference_epoch as u64) << 32) | reference.0 as u64;
        let position = base.wrapping_add_signed(self.distance_from(reference) as i64);
        (position >> 32) as u32
    }

    /// The signed forward distance from `earlier` to `self`: positive when
    /// `self` comes after `earlier`.
    #[must_use]
    pub const fn distance_from(self, earlier: Self) -> i32 {
        self.0.wrapping_sub(earlier.0) as i32
    }

    /// `true` when `self` comes strictly before `other` in serial order.
    #[must_use]
    pub const fn is_before(self, other: Self) -> bool {
        other.distance_from(self) > 0
    }

    /// `true` when `self` comes strictly after `other` in serial order.
    #[must_use]
    pub const fn is_after(self, other: Self) -> bool {
        self.distance_from(other) > 0
    }

    /// The later of two sequence numbers in serial order.
    #[must_use]
    pub const fn max(self, other: Self) -> Self {
        if self.is_after(other) { self } else { other }
    }

    /// The next sequence number.
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }
}

impl Add<u32> for SeqNum {
    type Output = Self;
    fn add(self, rhs: u32) -> Self {
        Self(self.0.wrapping_add(rhs))
    }
}

impl AddAssign<u32> for SeqNum {
    fn add_assign(&mut self, rhs: u32) {
        self.0 = self.0.wrapping_add(rhs);
    }
}

impl Sub for SeqNum {
    type Output = i32;
    /// `a - b` is the signed serial distance from `b` to `a`.
    fn sub(self, rhs: Self) -> i32 {
        self.distance_from(rhs)
    }
}

impl fmt::Debug for SeqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl fmt::Display for SeqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn epochs_follow_the_wrap_on_either_side() {
        let max = SeqNum(u32::MAX);
        assert_eq!(SeqNum(5).epoch_near(SeqNum(9), 2), 2);
        // Just after a wrap, a number from just before it is one epoch back.
        assert_eq!(max.epoch_near(SeqNum(3), 2), 1);
        // Just before a wrap, a number from just after it is one ahead.
        assert_eq!(SeqNum(3).epoch_near(max, 2), 3);
        assert_eq!(max.epoch_near(max, 0), 0);
        assert_eq!(SeqNum(0).epoch_near(max, u32::MAX), 0);
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ordering_across_the_wrap() {
        let last = SeqNum(u32::MAX);
        let first = last.next();
        assert_eq!(first, SeqNum(0));
        assert!(last.is_before(first));
        assert!(first.is_after(last));
        assert_eq!(first - last, 1);
        assert_eq!(last - first, -1);
        assert_eq!(last.max(first), first);
    }

    #[test]
    fn half_range_is_unordered() {
        let a = SeqNum(0);
        let b = SeqNum(1 << 31);
        assert!(!a.is_before(b) || !b.is_before(a));
    }

    proptest! {
        #[test]
        fn addition_is_consistent_with_distance(start: u32, step in 1u32..(1 << 31)) {
            let a = SeqNum(start);
            let b = a + step;
            prop_assert_eq!(b - a, step as i32);
            prop_assert!(a.is_before(b));
            prop_assert!(b.is_after(a));
            prop_assert!(!b.is_before(a));
        }

        #[test]
        fn order_is_transitive_inside_a_window(start: u32, x in 0u32..1_000_000, y in 0u32..1_000_000) {
            let base = SeqNum(start);
            let (a, b) = (base + x, base + y);
            prop_assert_eq!(a.is_before(b), x < y);
            prop_assert_eq!(a == b, x == y);
        }
    }
}
