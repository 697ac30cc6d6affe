//! Time, as the protocol sees it: a monotonic count of nanoseconds from an
//! epoch the caller chooses. The core never reads a clock; every entry point
//! takes `now`.

use core::fmt;
use core::num::NonZeroU64;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time, in nanoseconds since the caller's epoch.
///
/// Stored as nanoseconds plus one, never zero, so that an
/// `Option<Instant>` takes 8 bytes (the per-peer state holds several).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(NonZeroU64);

impl Default for Instant {
    fn default() -> Self {
        Self::ZERO
    }
}

impl Instant {
    /// The epoch.
    pub const ZERO: Self = Self(NonZeroU64::MIN);

    /// `nanos` after the epoch (saturating one nanosecond short of
    /// `u64::MAX`, about 584 years).
    pub const fn from_nanos(nanos: u64) -> Self {
        match NonZeroU64::new(nanos.saturating_add(1)) {
            Some(n) => Self(n),
            None => Self(NonZeroU64::MAX),
        }
    }

    /// A span after the epoch, such as a fabric clock's reading
    /// (saturating at about 584 years).
    pub const fn from_duration(since_epoch: Duration) -> Self {
        Self::from_nanos(
            since_epoch
                .as_secs()
                .saturating_mul(1_000_000_000)
                .saturating_add(since_epoch.subsec_nanos() as u64),
        )
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0.get() - 1
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.get().saturating_sub(earlier.0.get()))
    }
}

impl Add<Duration> for Instant {
    type Output = Self;
    fn add(self, rhs: Duration) -> Self {
        // u64 arithmetic: `as_nanos` would go through u128 on every timer.
        let nanos = rhs
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(rhs.subsec_nanos()));
        Self(self.0.saturating_add(nanos))
    }
}

impl Sub for Instant {
    type Output = Duration;
    fn sub(self, rhs: Self) -> Duration {
        self.saturating_since(rhs)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", Duration::from_nanos(self.as_nanos()))
    }
}
