//! How the registry's values are loaded: one parameter resolved from the
//! environment or the config ([`resolve`]), and the pairs that cannot be
//! set together checked once all are ([`Params::check_conflicts`]).

use super::value::{Kind, Value};
use super::{ParamError, Params, Source, env_var};

impl Params {
    /// The first pair of parameters that are valid alone but cannot be
    /// set together, as an error naming both and where each came from.
    pub(super) fn check_conflicts(&self) -> Result<(), ParamError> {
        let conflict = |first, second, reason| {
            Err(ParamError::Conflict {
                first,
                first_from: self.source(first).unwrap_or(Source::Default),
                second,
                second_from: self.source(second).unwrap_or(Source::Default),
                reason,
            })
        };
        if self.if_include.is_some() && self.if_exclude.is_some() {
            return conflict(
                "if_include",
                "if_exclude",
                "set either the ports to include or those to exclude, not both",
            );
        }
        if self.protection().is_some() && !self.reliable {
            return conflict(
                "auth",
                "reliable",
                "authentication rides on the reliability extension, and its sequence numbers \
                 are what refuse a replay",
            );
        }
        if let (Some(min), Some(max)) = (self.min_send_size, self.max_send_size) {
            if min > max {
                return conflict(
                    "min_send_size",
                    "max_send_size",
                    "a rendezvous's first fragment cannot exceed the largest send",
                );
            }
        }
        Ok(())
    }
}

/// Resolves one parameter: the environment's value if set, else the config's.
/// `None` leaves the default in place.
pub(super) fn resolve<T: Value>(
    name: &'static str,
    kind: &Kind,
    config: Option<&T>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(T, Source)>, ParamError> {
    if let Some(text) = env(&env_var(name)) {
        let invalid = |reason| ParamError::Invalid {
            name,
            value: text.clone(),
            from: Source::Environment,
            reason,
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(invalid("empty value".to_owned()));
        }
        let value = T::from_text(trimmed, kind)
            .and_then(|v| v.validate(kind))
            .map_err(invalid)?;
        tracing::debug!(parameter = name, value = %value.render(kind), "set from the environment");
        return Ok(Some((value, Source::Environment)));
    }
    match config {
        Some(value) => {
            let value = value
                .clone()
                .validate(kind)
                .map_err(|reason| ParamError::Invalid {
                    name,
                    value: value.render(kind),
                    from: Source::Config,
                    reason,
                })?;
            Ok(Some((value, Source::Config)))
        }
        None => Ok(None),
    }
}
