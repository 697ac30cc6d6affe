//! The fault decisions of the [`faulty`](super) wrapper, the pure and
//! seeded part: which fate a send meets given a uniform draw and the rates
//! of a [`FaultConfig`], and the seed of each context's generator stream.

use super::FaultConfig;

/// What happens to one send request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    Pass,
    Drop,
    Duplicate,
    Reorder,
}

impl Fate {
    /// The fate of a send given `r`, a uniform draw in `0.0..1.0`: the
    /// rates of `config` split the unit interval, in the order drop,
    /// duplicate, reorder; the rest passes.
    pub(super) fn from_draw(config: &FaultConfig, r: f64) -> Self {
        let FaultConfig {
            drop,
            duplicate,
            reorder,
            ..
        } = *config;
        if r < drop {
            Self::Drop
        } else if r < drop + duplicate {
            Self::Duplicate
        } else if r < drop + duplicate + reorder {
            Self::Reorder
        } else {
            Self::Pass
        }
    }
}

/// The seed of the `n`th context opened from a provider configured with
/// `seed`. Distinct, reproducible streams per context (the golden-ratio
/// increment of splitmix64 spreads consecutive indices apart).
pub(super) const fn context_seed(seed: u64, n: u64) -> u64 {
    seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}
