//! Round-trip time estimation and the retransmission timeout.
//!
//! RFC 6298 §2: the first sample R sets SRTT = R and RTTVAR = R/2; each later
//! sample sets RTTVAR = 3/4·RTTVAR + 1/4·|SRTT − R| and SRTT = 7/8·SRTT +
//! 1/8·R; RTO = SRTT + max(G, 4·RTTVAR), clamped to [min, max]. §5.5: each
//! timeout doubles the RTO (exponential backoff) until a new sample arrives.
//! Samples come only from datagrams sent once (Karn's algorithm, §3).

use core::time::Duration;

/// Clock granularity `G`: the smallest variance term.
const GRANULARITY_NS: u64 = 10_000;

/// Estimator state: 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rtt {
    srtt_ns: u64,
    rttvar_ns: u32,
    /// Timeout from the estimate, without backoff, in microseconds.
    base_rto_us: u32,
    /// Timeout in force, backoff included, in microseconds.
    rto_us: u32,
}

impl Rtt {
    pub(crate) fn new(initial: Duration) -> Self {
        let us = duration_us(initial);
        Self {
            srtt_ns: 0,
            rttvar_ns: 0,
            base_rto_us: us,
            rto_us: us,
        }
    }

    pub(crate) fn sample(&mut self, rtt: Duration, min: Duration, max: Duration) {
        let r = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX).max(1);
        if self.srtt_ns == 0 {
            self.srtt_ns = r;
            self.rttvar_ns = u32::try_from(r / 2).unwrap_or(u32::MAX);
        } else {
            let diff = self.srtt_ns.abs_diff(r);
            let var = (3 * u64::from(self.rttvar_ns) + diff) / 4;
            self.rttvar_ns = u32::try_from(var).unwrap_or(u32::MAX);
            self.srtt_ns = (7 * self.srtt_ns + r) / 8;
        }
        let rto_ns = self.srtt_ns + (4 * u64::from(self.rttvar_ns)).max(GRANULARITY_NS);
        self.base_rto_us = duration_us(Duration::from_nanos(rto_ns).clamp(min, max));
        self.rto_us = self.base_rto_us;
    }

    /// Doubles the timeout after an expiry, up to `max`.
    /// Makes the estimate cover `delay`, the round trip of a first
    /// transmission whose resend proved spurious (the Eifel response, RFC
    /// 4015): the smoothed round trip becomes at least `delay` and the
    /// variance at least half of it, and the backoff ends.
    pub(crate) fn cover(&mut self, delay: Duration, min: Duration, max: Duration) {
        let r = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.srtt_ns = self.srtt_ns.max(r);
        self.rttvar_ns = self.rttvar_ns.max(u32::try_from(r / 2).unwrap_or(u32::MAX));
        let rto_ns = self.srtt_ns + (4 * u64::from(self.rttvar_ns)).max(GRANULARITY_NS);
        self.base_rto_us = duration_us(Duration::from_nanos(rto_ns).clamp(min, max));
        self.rto_us = self.base_rto_us;
    }

    pub(crate) fn back_off(&mut self, max: Duration) {
        let doubled = Duration::from_micros(u64::from(self.rto_us) * 2);
        self.rto_us = duration_us(doubled.min(max));
    }

    /// Ends a backoff once the peer acknowledges new data, even without a
    /// sample (Karn forbids sampling retransmitted datagrams): otherwise, on
    /// a lossy path where most acknowledgements cover retransmissions, the
    /// timeout would stay at its maximum.
    pub(crate) fn end_backoff(&mut self) {
        self.rto_us = self.base_rto_us;
    }

    pub(crate) fn rto(&self) -> Duration {
        Duration::from_micros(u64::from(self.rto_us))
    }

    /// The smoothed round trip plus four times its variance: the
    /// retransmission timeout before its floor and ceiling.
    pub(crate) fn variance_bound(&self) -> Duration {
        Duration::from_nanos(self.srtt_ns + 4 * u64::from(self.rttvar_ns))
    }

    pub(crate) fn srtt(&self) -> Duration {
        Duration::from_nanos(self.srtt_ns)
    }
}

fn duration_us(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(1);
    const MAX: Duration = Duration::from_secs(1);

    #[test]
    fn follows_rfc6298() {
        let mut rtt = Rtt::new(Duration::from_millis(20));
        assert_eq!(rtt.rto(), Duration::from_millis(20));
        rtt.sample(Duration::from_millis(10), MIN, MAX);
        // SRTT 10 ms, RTTVAR 5 ms: RTO = 10 + 20 = 30 ms.
        assert_eq!(rtt.rto(), Duration::from_millis(30));
        rtt.sample(Duration::from_millis(10), MIN, MAX);
        // RTTVAR = 3/4 * 5 = 3.75 ms: RTO = 10 + 15 = 25 ms.
        assert_eq!(rtt.rto(), Duration::from_millis(25));
        assert_eq!(rtt.srtt(), Duration::from_millis(10));
    }

    #[test]
    fn covering_a_delay_raises_the_estimate_never_lowers_it() {
        let mut rtt = Rtt::new(Duration::from_millis(20));
        rtt.sample(Duration::from_millis(10), MIN, MAX);
        rtt.back_off(MAX);
        rtt.cover(Duration::from_millis(40), MIN, MAX);
        assert_eq!(rtt.srtt(), Duration::from_millis(40));
        assert_eq!(rtt.rto(), Duration::from_millis(40 + 4 * 20));
        rtt.cover(Duration::from_millis(5), MIN, MAX);
        assert_eq!(rtt.srtt(), Duration::from_millis(40));
    }

    #[test]
    fn clamps_and_backs_off() {
        let mut rtt = Rtt::new(Duration::from_millis(20));
        rtt.sample(Duration::from_micros(5), MIN, MAX);
        assert_eq!(rtt.rto(), MIN);
        for _ in 0..20 {
            rtt.back_off(MAX);
        }
        assert_eq!(rtt.rto(), MAX);
        rtt.sample(Duration::from_micros(5), MIN, MAX);
        assert_eq!(rtt.rto(), MIN, "a new sample ends the backoff");
    }
}
