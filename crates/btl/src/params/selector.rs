//! Port selectors: the `dev` or `dev:port` items of `if_include` and
//! `if_exclude`, parsed, matched against ports and rendered back.

use std::fmt;
use std::str::FromStr;

/// A device, or one port of a device, named in `if_include` or `if_exclude`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortSelector {
    /// Device name, e.g. `mlx4_0`.
    pub device: String,
    /// Port number (from 1), or `None` for every port of the device.
    pub port: Option<u8>,
}

impl PortSelector {
    /// `true` if this selector names `port` of `device`.
    pub fn matches(&self, device: &str, port: u8) -> bool {
        self.device == device && self.port.is_none_or(|p| p == port)
    }

    /// Parses a comma-separated list, e.g. `mlx4_0,mlx4_1:2`.
    ///
    /// # Errors
    /// The first selector that does not parse.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, SelectorError> {
        text.split(',').map(|item| item.trim().parse()).collect()
    }
}

impl FromStr for PortSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (device, port) = match text.split_once(':') {
            Some((device, port)) => (device, Some(port)),
            None => (text, None),
        };
        if device.is_empty() {
            return Err(SelectorError::EmptyDevice {
                text: text.to_owned(),
            });
        }
        let port = match port {
            None => None,
            Some(port) => match port.parse::<u8>() {
                Ok(n) if n > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Some(n),
                _ => {
                    return Err(SelectorError::BadPort {
                        text: text.to_owned(),
                    });
                }
            },
        };
        Ok(Self {
            device: device.to_owned(),
            port,
        })
    }
}

impl fmt::Display for PortSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.device),
            None => f.write_str(&self.device),
        }
    }
}

/// A port selector did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// Nothing before the colon (or an empty list item).
    #[error("port selector {text:?} has no device name")]
    EmptyDevice {
        /// The selector as given.
        text: String,
    },
    /// The port is not a number from 1 to 255.
    #[error("port selector {text:?}: the port must be a number from 1 to 255")]
    BadPort {
        /// The selector as given.
        text: String,
    },
}
