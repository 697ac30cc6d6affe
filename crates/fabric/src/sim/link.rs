//! The fault model of one directed link.

use std::time::Duration;

use crate::{FabricError, Result};

/// How one directed link (source port → destination port) treats the
/// datagrams that cross it.
///
/// Faults are decided per datagram, at send time, in this order: port
/// state, blackout window, MTU, loss, destination lookup, corruption,
/// reordering, duplication. Each probability is drawn independently from the
/// network's seeded generator (and only if it is nonzero). A datagram stopped
/// by an earlier check is counted there and draws nothing for the later ones.
///
/// The default is a perfect link: lossless, in order, no latency, no MTU.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkConfig {
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice. The copy arrives
    /// [`duplicate_delay`](Self::duplicate_delay) after the original.
    pub duplicate: f64,
    /// Probability that a datagram is held back by an extra delay drawn
    /// uniformly from [`reorder_delay`](Self::reorder_delay), so that later
    /// datagrams can overtake it.
    pub reorder: f64,
    /// Bounds (inclusive) of the extra delay of a reordered datagram.
    pub reorder_delay: (Duration, Duration),
    /// Probability that one uniformly chosen bit of the payload is flipped.
    /// UD has no end-to-end checksum, so the receiver gets the bad bytes and
    /// upper layers must detect them. Empty payloads are never corrupted.
    pub corrupt: f64,
    /// Time from send to arrival.
    pub latency: Duration,
    /// Largest payload the link carries; larger datagrams are dropped
    /// silently (and counted), as a switch with a smaller MTU would.
    pub mtu: Option<usize>,
    /// A window `[start, end)` of virtual time during which every datagram
    /// sent on the link is dropped.
    pub blackout: Option<(Duration, Duration)>,
    /// Extra delay of a duplicate copy after its original.
    pub duplicate_delay: Duration,
}

impl LinkConfig {
    /// Checks that every probability lies in `0.0..=1.0` and that the delay
    /// and blackout bounds are ordered.
    ///
    /// # Errors
    /// [`FabricError::InvalidArgument`] naming the offending field.
    pub fn validate(&self) -> Result<()> {
        for (name, p) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(FabricError::InvalidArgument {
                    what: "link configuration",
                    detail: format!("{name} = {p} is not a probability in 0.0..=1.0"),
                });
            }
        }
        if self.reorder_delay.0 > self.reorder_delay.1 {
            return Err(FabricError::InvalidArgument {
                what: "link configuration",
                detail: format!(
                    "reorder_delay minimum {:?} exceeds its maximum {:?}",
                    self.reorder_delay.0, self.reorder_delay.1
                ),
            });
        }
        if let Some((start, end)) = self.blackout {
            if start > end {
                return Err(FabricError::InvalidArgument {
                    what: "link configuration",
                    detail: format!("blackout starts at {start:?}, after its end {end:?}"),
                });
            }
        }
        Ok(())
    }

    /// `true` if `now` falls inside the blackout window.
    pub(crate) fn blacked_out(&self, now: Duration) -> bool {
        self.blackout
            .is_some_and(|(start, end)| start <= now && now < end)
    }
}
