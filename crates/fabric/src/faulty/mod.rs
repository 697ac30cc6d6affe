//! Loss, duplication and reordering injected on the send side of any
//! provider.
//!
//! [`FaultyProvider`] wraps a [`Provider`] and hands out [`FaultyContext`]s,
//! which pass every verb through to the wrapped context except
//! [`post_send`](crate::Context::post_send), where each send request independently
//! meets one fate, drawn from a seeded generator:
//!
//! * **drop** (probability [`FaultConfig::drop`]): it is checked, completes
//!   successfully, and is never handed to the wrapped provider, as if the
//!   network had lost it;
//! * **duplicate** ([`FaultConfig::duplicate`]): it is posted twice, the copy
//!   unsignaled, so the receiver may see it twice but the sender sees one
//!   completion;
//! * **reorder** ([`FaultConfig::reorder`]): it is checked, its bytes are
//!   copied into a registration the wrapper owns, it completes, and the copy
//!   is posted after the next send that leaves on the same queue pair, or at
//!   the latest when the context is next polled;
//! * otherwise it is passed through untouched.
//!
//! The fates are exclusive, so the three rates must add up to at most 1.
//!
//! # What stays honest
//!
//! A dropped or held request never reaches the wrapped provider's
//! `post_send`, so the wrapper asks the provider's own
//! [`check_send`](crate::Context::check_send) first, and adds the send queue room
//! its own completions take: a request the wrapped provider would refuse is
//! refused whatever its fate. Send
//! completions are returned in posting order per queue pair, including those
//! the wrapper produces. Registrations the wrapper makes for held requests are
//! not counted in [`resources`](crate::Context::resources).
//!
//! One limit: completions produced by the wrapper are not counted against
//! the depth of the wrapped completion queue, so an overrun caused by them
//! is not reported.
//!
//! # Configuration from the environment
//!
//! [`FaultConfig::from_env`] reads [`ENV_DROP`], [`ENV_DUPLICATE`],
//! [`ENV_REORDER`] (fractions in `0.0..=1.0`) and [`ENV_SEED`] (an unsigned
//! integer). A variable that is unset or empty leaves its default (no fault,
//! seed 0); a value that does not parse or is out of range is an error naming
//! the variable.

mod context;
mod fate;
mod held;
mod send;

use std::sync::atomic::{AtomicU64, Ordering};

pub use context::FaultyContext;

use crate::types::DeviceInfo;
use crate::{Provider, Result};

/// Environment variable with the drop rate.
pub const ENV_DROP: &str = "UDBTL_FAULT_DROP";
/// Environment variable with the duplication rate.
pub const ENV_DUPLICATE: &str = "UDBTL_FAULT_DUPLICATE";
/// Environment variable with the reordering rate.
pub const ENV_REORDER: &str = "UDBTL_FAULT_REORDER";
/// Environment variable with the seed of the fault generator.
pub const ENV_SEED: &str = "UDBTL_FAULT_SEED";

/// Rates of the faults a [`FaultyContext`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Fraction of sends dropped.
    pub drop: f64,
    /// Fraction of sends posted twice.
    pub duplicate: f64,
    /// Fraction of sends held back behind the next one.
    pub reorder: f64,
    /// Seed of the generator that draws the fates. Each context opened from
    /// one provider gets its own stream derived from it.
    pub seed: u64,
}

impl FaultConfig {
    /// Reads the configuration from the `UDBTL_FAULT_*` environment
    /// variables (see the [module documentation](self)).
    ///
    /// # Errors
    /// A value that does not parse, is out of range, or rates that add up to
    /// more than 1.
    pub fn from_env() -> Result<Self, FaultConfigError> {
        // A value that is not Unicode cannot be a number; lossy conversion
        // turns it into one that fails to parse and is reported by name.
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the configuration through `lookup`, which returns the value of
    /// a variable or `None` if it is unset. [`from_env`](Self::from_env) is
    /// this with the process environment; tests pass a map.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup<F>(mut lookup: F) -> Result<Self, FaultConfigError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        let mut value = |var: &'static str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .map(|v| (var, v))
        };
        let mut config = Self::default();
        for (var, field) in [
            (ENV_DROP, &mut config.drop),
            (ENV_DUPLICATE, &mut config.duplicate),
            (ENV_REORDER, &mut config.reorder),
        ] {
            if let Some((var, text)) = value(var) {
                *field = text.parse().map_err(|_| FaultConfigError::NotANumber {
                    var,
                    value: text.clone(),
                })?;
            }
        }
        if let Some((var, text)) = value(ENV_SEED) {
            config.seed = text
                .parse()
                .map_err(|_| FaultConfigError::NotANumber { var, value: text })?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks that each rate lies in `0.0..=1.0` and that they add up to at
    /// most 1.
    ///
    /// # Errors
    /// [`FaultConfigError::OutOfRange`] or
    /// [`FaultConfigError::RatesExceedOne`].
    pub fn validate(&self) -> Result<(), FaultConfigError> {
        for (var, value) in [
            (ENV_DROP, self.drop),
            (ENV_DUPLICATE, self.duplicate),
            (ENV_REORDER, self.reorder),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultConfigError::OutOfRange { var, value });
            }
        }
        let sum = self.drop + self.duplicate + self.reorder;
        if sum > 1.0 {
            return Err(FaultConfigError::RatesExceedOne { sum });
        }
        Ok(())
    }

    /// `true` if any fault has a nonzero rate.
    pub fn is_active(&self) -> bool {
        self.drop > 0.0 || self.duplicate > 0.0 || self.reorder > 0.0
    }
}

/// A fault configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultConfigError {
    /// A variable's value is not a number of the expected kind.
    #[error("{var}={value:?} is not a valid number")]
    NotANumber {
        /// The environment variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A rate is outside `0.0..=1.0`.
    #[error("{var}={value} is outside 0.0..=1.0")]
    OutOfRange {
        /// The environment variable setting the rate (also when the
        /// configuration was built in code).
        var: &'static str,
        /// The rate.
        value: f64,
    },
    /// The rates of the exclusive fates add up to more than 1.
    #[error("{ENV_DROP} + {ENV_DUPLICATE} + {ENV_REORDER} = {sum}, more than 1")]
    RatesExceedOne {
        /// The sum.
        sum: f64,
    },
}

/// What a [`FaultyContext`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultStats {
    /// Sends completed without being handed to the wrapped provider.
    pub dropped: u64,
    /// Extra copies posted.
    pub duplicated: u64,
    /// Sends held back and posted later.
    pub reordered: u64,
    /// Held sends the wrapped provider refused when they were finally posted
    /// (for instance because their address handle was destroyed meanwhile);
    /// to the peer they look lost.
    pub release_failures: u64,
}

/// A provider whose contexts inject send-side faults; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct FaultyProvider<P> {
    inner: P,
    config: FaultConfig,
    /// Contexts opened so far; each gets its own generator stream.
    opened: AtomicU64,
}

impl<P: Provider> FaultyProvider<P> {
    /// Wraps `inner`.
    ///
    /// # Errors
    /// An invalid configuration ([`FaultConfig::validate`]).
    pub fn new(inner: P, config: FaultConfig) -> Result<Self, FaultConfigError> {
        config.validate()?;
        Ok(Self {
            inner,
            config,
            opened: AtomicU64::new(0),
        })
    }

    /// Wraps `inner` with the configuration of the environment
    /// ([`FaultConfig::from_env`]).
    ///
    /// # Errors
    /// As [`FaultConfig::from_env`].
    pub fn from_env(inner: P) -> Result<Self, FaultConfigError> {
        Self::new(inner, FaultConfig::from_env()?)
    }

    /// The wrapped provider.
    pub const fn inner(&self) -> &P {
        &self.inner
    }

    /// The fault configuration.
    pub const fn config(&self) -> &FaultConfig {
        &self.config
    }
}

impl<P: Provider> Provider for FaultyProvider<P> {
    type Context = FaultyContext<P::Context>;

    /// The wrapped provider's name: upper layers select devices by it, and
    /// a faulty run should select the same ones.
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        self.inner.devices()
    }

    fn open(&self, device: &str) -> Result<Self::Context> {
        let inner = self.inner.open(device)?;
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let seed = fate::context_seed(self.config.seed, n);
        Ok(FaultyContext::new(inner, self.config, seed))
    }
}
