//! Port selectors: the `dev`, `dev:port` or subnet (`10.0.0.0/24`,
//! `fd00::/64`) items of `if_include` and `if_exclude`, parsed, matched
//! against ports and rendered back.

use std::fmt;
use std::str::FromStr;

/// A device, one port of a device, or a subnet, named in `if_include` or
/// `if_exclude`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortSelector {
    /// Device name, e.g. `mlx4_0`, or a subnet, e.g. `10.0.0.0/24`, which
    /// the `udp` provider matches against its interfaces' addresses.
    pub device: String,
    /// Port number (from 1), or `None` for every port of the device.
    pub port: Option<u8>,
}

impl PortSelector {
    /// `true` if this selector names `port` of `device`. A subnet names
    /// no device by name (see [`is_subnet`](Self::is_subnet)).
    pub fn matches(&self, device: &str, port: u8) -> bool {
        self.device == device && self.port.is_none_or(|p| p == port)
    }

    /// Whether this selector is a subnet (`address/prefix`) rather than a
    /// device: a provider with IP interfaces applies it to their addresses.
    pub fn is_subnet(&self) -> bool {
        self.device.contains('/')
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
        // A subnet's address may hold colons (IPv6): it has no port.
        let (device, port) = match text.split_once(':') {
            Some((device, port)) if !text.contains('/') => (device, Some(port)),
            _ => (text, None),
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
