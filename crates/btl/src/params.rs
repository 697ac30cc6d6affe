//! The parameter registry: every tunable of the BTL, in one table.
//!
//! Each parameter has a name (the seed's `btl_ofud_<name>` without the
//! prefix, where the seed had one), a type, a default, bounds and a help line.
//! Its value is resolved at load time, each source replacing the one before:
//!
//! 1. the default;
//! 2. the program's [`BtlConfig`] (a field that is `Some`);
//! 3. the environment variable `UDBTL_<NAME>` (upper case, e.g.
//!    `UDBTL_SD_NUM=256`).
//!
//! The environment comes last so that a job can be tuned, or a compiled-in
//! choice overridden, without recompiling. [`Params::source`] tells where each
//! value came from and [`Params::describe`] lists every parameter with its
//! value, default, bounds and help (it is what `udinfo` prints). Each field of
//! [`Params`] documents one parameter.
//!
//! # Syntax
//!
//! * Integers: decimal or `0x` hex. Sizes (`*_size`, `rcache_max_bytes`,
//!   `udp_mtu`) also take the suffixes `k`, `m` and `g` (powers of 1024, either
//!   case), e.g. `UDBTL_MAX_SEND_SIZE=4k`.
//! * Booleans: `1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`.
//! * Port lists (`if_include`, `if_exclude`): comma-separated `dev` or
//!   `dev:port`, e.g. `mlx4_0,mlx4_1:2`.
//!
//! Surrounding whitespace is ignored; an empty environment value is an error,
//! not a way to unset a parameter. Only the value in force is validated: an
//! environment value replaces the config value before either is checked.
//!
//! # Parameters that are not the seed's
//!
//! `provider`, `rcache_max_entries`, `rcache_max_bytes`, `send_frags_max`,
//! `user_frags_max`, `job_key`, `udp_if`, `udp_ipv6` and `udp_mtu` are udbtl
//! additions; [`ParamInfo::from_seed`] is `false` for them. The seed's
//! `min_send_size` and `max_send_size` defaulted to 2048 on the assumption of a
//! 2 KB InfiniBand MTU that was never queried; here they are unset by default
//! and the provider's MTU decides.
//!
//! # Adding a parameter
//!
//! Add one line to the `parameters!` invocation below: [`BtlConfig`],
//! [`Params`], loading, [`Params::source`] and [`Params::describe`] all follow
//! from it.

use std::fmt;
use std::str::FromStr;

/// Where a parameter's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The built-in default.
    Default,
    /// The program's [`BtlConfig`].
    Config,
    /// The environment variable `UDBTL_<NAME>`.
    Environment,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::Config => "config",
            Self::Environment => "environment",
        })
    }
}

/// A parameter could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamError {
    /// A value does not parse or is out of bounds.
    #[error("invalid value {value:?} for {}: {reason}", origin(.name, .from))]
    Invalid {
        /// The parameter.
        name: &'static str,
        /// The value as given (for a config value, as rendered).
        value: String,
        /// Where the value came from.
        from: Source,
        /// What is wrong with it.
        reason: String,
    },
    /// Two parameters that are valid alone cannot be set together.
    #[error(
        "{} conflicts with {}: {reason}",
        origin(.first, .first_from),
        origin(.second, .second_from)
    )]
    Conflict {
        /// The first parameter.
        first: &'static str,
        /// Where its value came from.
        first_from: Source,
        /// The second parameter.
        second: &'static str,
        /// Where its value came from.
        second_from: Source,
        /// Why they conflict.
        reason: &'static str,
    },
}

/// Names a parameter in an error message, with the environment variable when
/// the value came from there, since that is what the user has to fix.
fn origin(name: &str, from: &Source) -> String {
    match from {
        Source::Environment => format!("parameter {name} (environment variable {})", env_var(name)),
        Source::Config => format!("parameter {name} (from the config)"),
        Source::Default => format!("parameter {name} (default)"),
    }
}

/// The environment variable that sets parameter `name`: `UDBTL_<NAME>`.
pub fn env_var(name: &str) -> String {
    format!("UDBTL_{}", name.to_ascii_uppercase())
}

/// One row of [`Params::describe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// The parameter's name.
    pub name: &'static str,
    /// The environment variable that sets it.
    pub env_var: String,
    /// The value in force, rendered as it could be written back.
    pub value: String,
    /// The default, rendered the same way (`unset` for an optional parameter).
    pub default: String,
    /// Where the value in force came from.
    pub source: Source,
    /// What the parameter does.
    pub help: &'static str,
    /// What values are accepted, e.g. `integer 1..=64`.
    pub syntax: String,
    /// `true` if the seed (`btl_ofud`) had this parameter; `false` for udbtl
    /// additions.
    pub from_seed: bool,
}

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

/// Declares the parameters. Each line is
/// `name: Type = (default) | unset, kind, seed | udbtl, "help";`
/// where `unset` makes the [`Params`] field an `Option<Type>` that defaults to
/// `None`.
macro_rules! parameters {
    (@field $ty:ty, unset) => { Option<$ty> };
    (@field $ty:ty, ($default:expr)) => { $ty };
    (@default unset) => { None };
    (@default ($default:expr)) => { $default };
    (@wrap unset, $value:expr) => { Some($value) };
    (@wrap ($default:expr), $value:expr) => { $value };
    (@render unset, $value:expr, $kind:expr) => {
        match $value {
            Some(value) => Value::render(value, $kind),
            None => String::from("unset"),
        }
    };
    (@render ($default:expr), $value:expr, $kind:expr) => { Value::render($value, $kind) };
    (@seed seed) => { true };
    (@seed udbtl) => { false };
    ($(
        $name:ident: $ty:ty = $default:tt, $kind:expr, $origin:ident, $help:literal;
    )*) => {
        /// Parameter values chosen by the program. A field left `None` keeps
        /// the default; the environment overrides any field.
        ///
        /// Build it with `BtlConfig::default()` and assign the fields to set.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct BtlConfig {
            $(
                #[doc = $help]
                pub $name: Option<$ty>,
            )*
        }

        /// The parameters in force, after defaults, config and environment.
        ///
        /// Load them with [`Params::load`]. The fields are public so that a
        /// test or a tool can adjust a loaded set; such changes are not
        /// validated and keep their recorded [`Source`].
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Params {
            $(
                #[doc = $help]
                pub $name: parameters!(@field $ty, $default),
            )*
            sources: Sources,
        }

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        struct Sources {
            $($name: Source,)*
        }

        impl Params {
            fn defaults() -> Self {
                Self {
                    $($name: parameters!(@default $default),)*
                    sources: Sources { $($name: Source::Default,)* },
                }
            }

            fn resolve(
                config: &BtlConfig,
                env: &dyn Fn(&str) -> Option<String>,
            ) -> Result<Self, ParamError> {
                let mut params = Self::defaults();
                $(
                    if let Some((value, source)) =
                        resolve::<$ty>(stringify!($name), &$kind, config.$name.as_ref(), env)?
                    {
                        params.$name = parameters!(@wrap $default, value);
                        params.sources.$name = source;
                    }
                )*
                Ok(params)
            }

            /// Where the value of parameter `name` came from, or `None` if
            /// there is no such parameter.
            pub fn source(&self, name: &str) -> Option<Source> {
                match name {
                    $(stringify!($name) => Some(self.sources.$name),)*
                    _ => None,
                }
            }

            /// Every parameter, in table order, with its value in force.
            pub fn describe(&self) -> Vec<ParamInfo> {
                let defaults = Self::defaults();
                vec![$(
                    ParamInfo {
                        name: stringify!($name),
                        env_var: env_var(stringify!($name)),
                        value: parameters!(@render $default, &self.$name, &$kind),
                        default: parameters!(@render $default, &defaults.$name, &$kind),
                        source: self.sources.$name,
                        help: $help,
                        syntax: $kind.syntax(),
                        from_seed: parameters!(@seed $origin),
                    },
                )*]
            }
        }

        /// Every parameter with a default, set in a config to that default.
        #[cfg(test)]
        fn defaults_as_config() -> BtlConfig {
            let defaults = Params::defaults();
            BtlConfig {
                $($name: defaults_as_config!($default, defaults.$name),)*
            }
        }
    };
}

#[cfg(test)]
macro_rules! defaults_as_config {
    (unset, $value:expr) => {
        None
    };
    (($default:expr), $value:expr) => {
        Some($value)
    };
}

// ----- the table ---------------------------------------------------------------

const MIB: u64 = 1 << 20;
/// The largest UDP payload over IPv6 (65535 less the UDP header); IPv4 allows
/// less, which the provider checks against the interface.
const MAX_UDP_PAYLOAD: u64 = 65_527;
const USIZE_MAX: u64 = usize::MAX as u64;

parameters! {
    max_btls: u32 = (4), int(1, 64), seed,
        "Maximum number of modules (active ports) to use";
    sd_num: u32 = (128), int(1, 65_536), seed,
        "Send work requests outstanding per module; also each queue pair's max_send_wr";
    rd_num: u32 = (6000), int(1, 65_536), seed,
        "Receive buffers posted per module; also each queue pair's max_recv_wr";
    min_send_size: usize = unset, size(64, 16 * MIB), seed,
        "Data size of a rendezvous's first fragment (the BTL's rndv_eager_limit); \
         unset: the eager limit";
    max_send_size: usize = unset, size(64, 16 * MIB), seed,
        "Largest datagram payload, BTL header included; the eager limit and maximum \
         send size are this less the header; unset: the provider's MTU";
    ib_pkey_index: u16 = (0), int(0, 0xffff), seed,
        "Partition key index set on each queue pair when it moves to INIT";
    ib_qkey: u32 = (0x0133_0133), hex(0, 0xffff_ffff), seed,
        "Queue key of every queue pair and every send";
    ib_service_level: u8 = (0), int(0, 15), seed,
        "Service level put into each address handle";
    ib_src_path_bits: u8 = (0), int(0, 127), seed,
        "Source path bits put into each address handle";
    mpool: String = (String::from("rdma")), choice(&["rdma", "grdma", "none"]), seed,
        "Registration cache: rdma or grdma (both the LRU cache), or none \
         (register and deregister on every use)";
    exclusivity: u32 = (1024), int(0, 0xffff_ffff), seed,
        "Exclusivity: of the BTLs that reach a peer, those with the highest are used";
    bandwidth: u32 = (800), int(0, 0xffff_ffff), seed,
        "Bandwidth in MB/s, for striping weights";
    if_include: Vec<PortSelector> = unset, PORTS, seed,
        "Devices or ports to use (dev or dev:port, comma-separated); exclusive with if_exclude";
    if_exclude: Vec<PortSelector> = unset, PORTS, seed,
        "Devices or ports to skip (dev or dev:port, comma-separated); exclusive with if_include";
    provider: String = (String::from("udp")), choice(&["udp", "sim"]), udbtl,
        "Fabric provider: udp or sim";
    rcache_max_entries: usize = (256), int(1, 65_536), udbtl,
        "Registrations the registration cache keeps";
    rcache_max_bytes: usize = (1 << 30), size(1, USIZE_MAX), udbtl,
        "Bytes of user memory the registration cache keeps registered";
    rd_mem: usize = (64 << 20), size(MIB, USIZE_MAX), udbtl,
        "Bytes of receive buffers per module while rd_num is left at its default: rd_num \
         is lowered until the pool fits (64 KiB loopback datagrams would make 6000 buffers \
         pin 375 MiB)";
    send_frags_max: usize = (8192), int(1, 1 << 20), udbtl,
        "Send fragments a module's free list may grow to (the seed's bound of sd_num<<2 \
         hung alltoall; unbounded lists pin unbounded memory)";
    user_frags_max: usize = (8192), int(1, 1 << 20), udbtl,
        "User (zero-copy) fragments a module's free list may grow to";
    reliable: bool = (true), BOOL, udbtl,
        "Reliable, ordered, exactly-once delivery per peer (sequence numbers, ACKs, \
         retransmission); off gives the seed's unreliable behaviour";
    rel_window: u32 = (64), int(1, 65), udbtl,
        "Datagrams in flight per peer at most, and the receive credit advertised";
    peer_timeout: u32 = (30_000), int(10, 86_400_000), udbtl,
        "Milliseconds without acknowledgement, while data waits, before a peer is \
         declared lost (time, not a retry count, decides)";
    checksum: String = (String::from("auto")), choice(&["auto", "on", "off"]), udbtl,
        "Checksum every reliable datagram: auto does so on fabrics that do not check \
         integrity themselves (sim); UDP has its own checksum";
    job_key: u32 = (0), int(0, 0xffff_ffff), udbtl,
        "Key carried in every BTL header; datagrams carrying another key are dropped";
    udp_if: String = unset, TEXT, udbtl,
        "Network interface for the udp provider; unset: loopback";
    udp_ipv6: bool = (false), BOOL, udbtl,
        "Prefer IPv6 addresses for the udp provider";
    udp_mtu: usize = unset, size(64, MAX_UDP_PAYLOAD), udbtl,
        "Largest payload per UDP datagram; unset: the interface MTU less the IP and UDP headers";
}

impl Params {
    /// Loads the parameters from their defaults, `config` and the process
    /// environment (see the [module documentation](self) for precedence).
    ///
    /// # Errors
    /// The first invalid value or conflicting pair, naming the parameter and,
    /// for a value from the environment, the variable.
    pub fn load(config: &BtlConfig) -> Result<Self, ParamError> {
        // A variable that is not UTF-8 is kept (lossily) so that it fails
        // validation with its name, instead of being silently ignored.
        Self::load_from(config, |key| {
            std::env::var_os(key).map(|v| v.to_string_lossy().into_owned())
        })
    }

    /// As [`load`](Self::load), reading the environment through `env`, which
    /// maps a variable name to its value. `|_| None` gives the defaults
    /// overridden by `config` only.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn load_from(
        config: &BtlConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ParamError> {
        let params = Self::resolve(config, &env)?;
        params.check_conflicts()?;
        Ok(params)
    }

    /// `true` unless `mpool` is `none`: whether user registrations are cached.
    pub fn rcache_enabled(&self) -> bool {
        self.mpool != "none"
    }

    /// Whether `if_include`/`if_exclude` let a module be built on `port` of
    /// `device`: with an include list, only the ports it names; with an
    /// exclude list, all but those it names; with neither, every port.
    pub fn port_allowed(&self, device: &str, port: u8) -> bool {
        let named = |list: &[PortSelector]| list.iter().any(|s| s.matches(device, port));
        match (&self.if_include, &self.if_exclude) {
            (Some(include), _) => named(include),
            (None, Some(exclude)) => !named(exclude),
            (None, None) => true,
        }
    }

    fn check_conflicts(&self) -> Result<(), ParamError> {
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

impl Default for Params {
    /// The built-in defaults, ignoring the environment: the same as
    /// `Params::load_from(&BtlConfig::default(), |_| None)`.
    fn default() -> Self {
        Self::defaults()
    }
}

/// Resolves one parameter: the environment's value if set, else the config's.
/// `None` leaves the default in place.
fn resolve<T: Value>(
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

// ----- kinds and values --------------------------------------------------------

/// How a parameter's text is read and its bounds checked.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Int { min: u64, max: u64, style: IntStyle },
    Bool,
    Text,
    Choice(&'static [&'static str]),
    Ports,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntStyle {
    Decimal,
    /// Rendered in hex: values that are conventionally written so.
    Hex,
    /// Accepts k/m/g suffixes and renders with the largest exact one.
    Size,
}

const fn int(min: u64, max: u64) -> Kind {
    Kind::Int {
        min,
        max,
        style: IntStyle::Decimal,
    }
}

const fn hex(min: u64, max: u64) -> Kind {
    Kind::Int {
        min,
        max,
        style: IntStyle::Hex,
    }
}

const fn size(min: u64, max: u64) -> Kind {
    Kind::Int {
        min,
        max,
        style: IntStyle::Size,
    }
}

const fn choice(names: &'static [&'static str]) -> Kind {
    Kind::Choice(names)
}

const BOOL: Kind = Kind::Bool;
const TEXT: Kind = Kind::Text;
const PORTS: Kind = Kind::Ports;

impl Kind {
    fn syntax(&self) -> String {
        match *self {
            Self::Int { min, max, style } => {
                let what = match style {
                    IntStyle::Decimal | IntStyle::Hex => "integer",
                    IntStyle::Size => "size (k/m/g suffixes)",
                };
                format!(
                    "{what} {}..={}",
                    render_int(min, style),
                    render_int(max, style)
                )
            }
            Self::Bool => "bool (1/0, true/false, yes/no, on/off)".to_owned(),
            Self::Text => "text".to_owned(),
            Self::Choice(names) => names.join("|"),
            Self::Ports => "dev[:port],...".to_owned(),
        }
    }

    /// A kind that does not fit the field's type is a mistake in the table;
    /// it fails every value, so the defaults test catches it.
    fn mismatch(&self) -> String {
        format!("parameter table error: kind {self:?} does not fit the parameter's type")
    }
}

/// A parameter's value type: how it is read from text, checked against its
/// kind, and rendered back.
trait Value: Clone + Sized {
    /// Syntax only; `text` is trimmed and non-empty.
    fn from_text(text: &str, kind: &Kind) -> Result<Self, String>;
    /// Bounds, and the canonical form.
    fn validate(self, kind: &Kind) -> Result<Self, String>;
    fn render(&self, kind: &Kind) -> String;
}

fn parse_int(text: &str, style: IntStyle) -> Result<u64, String> {
    let (digits, shift) = match (style, text.as_bytes().last()) {
        (IntStyle::Size, Some(b'k' | b'K')) => (&text[..text.len() - 1], 10),
        (IntStyle::Size, Some(b'm' | b'M')) => (&text[..text.len() - 1], 20),
        (IntStyle::Size, Some(b'g' | b'G')) => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let expected = || {
        let suffixes = if style == IntStyle::Size {
            ", optionally with a k, m or g suffix"
        } else {
            ""
        };
        format!("expected a non-negative integer (decimal or 0x hex{suffixes})")
    };
    let (digits, radix) = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => (hex, 16),
        None => (digits, 10),
    };
    // from_str_radix accepts a leading '+', which no documented syntax has.
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(expected());
    }
    let n = u64::from_str_radix(digits, radix).map_err(|_| "too large".to_owned())?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| "too large".to_owned())
}

fn render_int(n: u64, style: IntStyle) -> String {
    match style {
        IntStyle::Decimal => n.to_string(),
        IntStyle::Hex => format!("{n:#010x}"),
        IntStyle::Size => [(30, 'G'), (20, 'M'), (10, 'K')]
            .iter()
            .find(|(shift, _)| n != 0 && n % (1 << shift) == 0)
            .map_or_else(
                || n.to_string(),
                |(shift, suffix)| format!("{}{suffix}", n >> shift),
            ),
    }
}

fn check_range(n: u64, kind: &Kind) -> Result<(), String> {
    match *kind {
        Kind::Int { min, max, style } if !(min..=max).contains(&n) => Err(format!(
            "{} is outside {}..={}",
            render_int(n, style),
            render_int(min, style),
            render_int(max, style)
        )),
        Kind::Int { .. } => Ok(()),
        _ => Err(kind.mismatch()),
    }
}

macro_rules! int_value {
    ($($ty:ty),*) => {$(
        impl Value for $ty {
            fn from_text(text: &str, kind: &Kind) -> Result<Self, String> {
                let Kind::Int { style, .. } = *kind else { return Err(kind.mismatch()) };
                let n = parse_int(text, style)?;
                check_range(n, kind)?;
                Self::try_from(n).map_err(|_| format!("{n} does not fit in {}", stringify!($ty)))
            }

            fn validate(self, kind: &Kind) -> Result<Self, String> {
                check_range(u64::try_from(self).unwrap_or(u64::MAX), kind)?;
                Ok(self)
            }

            fn render(&self, kind: &Kind) -> String {
                let style = match *kind {
                    Kind::Int { style, .. } => style,
                    _ => IntStyle::Decimal,
                };
                render_int(u64::try_from(*self).unwrap_or(u64::MAX), style)
            }
        }
    )*};
}
int_value!(u8, u16, u32, usize);

impl Value for bool {
    fn from_text(text: &str, kind: &Kind) -> Result<Self, String> {
        if !matches!(kind, Kind::Bool) {
            return Err(kind.mismatch());
        }
        match text.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err("expected 1/0, true/false, yes/no or on/off".to_owned()),
        }
    }

    fn validate(self, kind: &Kind) -> Result<Self, String> {
        if matches!(kind, Kind::Bool) {
            Ok(self)
        } else {
            Err(kind.mismatch())
        }
    }

    fn render(&self, _: &Kind) -> String {
        self.to_string()
    }
}

impl Value for String {
    fn from_text(text: &str, _: &Kind) -> Result<Self, String> {
        Ok(text.to_owned())
    }

    fn validate(self, kind: &Kind) -> Result<Self, String> {
        match *kind {
            Kind::Text if self.trim().is_empty() => Err("empty value".to_owned()),
            Kind::Text => Ok(self.trim().to_owned()),
            Kind::Choice(names) => {
                let lower = self.trim().to_ascii_lowercase();
                if names.contains(&lower.as_str()) {
                    Ok(lower)
                } else {
                    Err(format!("expected one of {}", names.join(", ")))
                }
            }
            _ => Err(kind.mismatch()),
        }
    }

    fn render(&self, _: &Kind) -> String {
        self.clone()
    }
}

impl Value for Vec<PortSelector> {
    fn from_text(text: &str, kind: &Kind) -> Result<Self, String> {
        if !matches!(kind, Kind::Ports) {
            return Err(kind.mismatch());
        }
        PortSelector::parse_list(text).map_err(|e| e.to_string())
    }

    fn validate(self, kind: &Kind) -> Result<Self, String> {
        match kind {
            // An empty include list would silently select no port at all.
            Kind::Ports if self.is_empty() => Err("empty list".to_owned()),
            Kind::Ports => Ok(self),
            _ => Err(kind.mismatch()),
        }
    }

    fn render(&self, _: &Kind) -> String {
        self.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn load_env(pairs: &[(&str, &str)]) -> Result<Params, ParamError> {
        load_with(&BtlConfig::default(), pairs)
    }

    fn load_with(config: &BtlConfig, pairs: &[(&str, &str)]) -> Result<Params, ParamError> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Params::load_from(config, |key| env.get(key).cloned())
    }

    #[test]
    fn defaults_are_the_seeds() {
        let p = load_env(&[]).unwrap();
        assert_eq!(p, Params::default());
        assert_eq!(p.max_btls, 4);
        assert_eq!(p.sd_num, 128);
        assert_eq!(p.rd_num, 6000);
        assert_eq!(p.min_send_size, None);
        assert_eq!(p.max_send_size, None);
        assert_eq!(p.ib_pkey_index, 0);
        assert_eq!(p.ib_qkey, 0x0133_0133);
        assert_eq!(p.ib_service_level, 0);
        assert_eq!(p.ib_src_path_bits, 0);
        assert_eq!(p.mpool, "rdma");
        assert!(p.rcache_enabled());
        assert_eq!(p.exclusivity, 1024);
        assert_eq!(p.bandwidth, 800);
        assert_eq!(p.if_include, None);
        assert_eq!(p.if_exclude, None);
        assert_eq!(p.provider, "udp");
        assert_eq!(p.rcache_max_entries, 256);
        assert_eq!(p.rcache_max_bytes, 1 << 30);
        assert_eq!(p.send_frags_max, 8192);
        assert_eq!(p.user_frags_max, 8192);
        assert_eq!(p.job_key, 0);
        assert_eq!(p.udp_if, None);
        assert!(!p.udp_ipv6);
        assert_eq!(p.udp_mtu, None);
        assert!(p.describe().iter().all(|i| i.source == Source::Default));
    }

    #[test]
    fn defaults_satisfy_their_own_bounds() {
        // Catches a default outside its bounds, or a kind that does not fit
        // its field's type.
        let p = Params::load_from(&defaults_as_config(), |_| None).unwrap();
        let expected = Params {
            sources: p.sources,
            ..Params::default()
        };
        assert_eq!(p, expected);
        for info in p.describe() {
            let optional = info.default == "unset";
            let want = if optional {
                Source::Default
            } else {
                Source::Config
            };
            assert_eq!(info.source, want, "{}", info.name);
        }
    }

    #[test]
    fn describe_renders_values_that_parse_back() {
        let p = Params::default();
        let infos = p.describe();
        assert_eq!(infos.len(), 28);
        let pairs: Vec<(String, String)> = infos
            .iter()
            .filter(|i| i.value != "unset")
            .map(|i| (i.env_var.clone(), i.value.clone()))
            .collect();
        let env: HashMap<_, _> = pairs.into_iter().collect();
        let reloaded = Params::load_from(&BtlConfig::default(), |k| env.get(k).cloned()).unwrap();
        let expected = Params {
            sources: reloaded.sources,
            ..p.clone()
        };
        assert_eq!(reloaded, expected);
        let qkey = infos.iter().find(|i| i.name == "ib_qkey").unwrap();
        assert_eq!(qkey.value, "0x01330133");
        assert_eq!(qkey.env_var, "UDBTL_IB_QKEY");
        assert!(qkey.from_seed);
        let bytes = infos.iter().find(|i| i.name == "rcache_max_bytes").unwrap();
        assert_eq!(bytes.default, "1G");
        assert!(!bytes.from_seed);
        assert_eq!(
            infos.iter().find(|i| i.name == "max_btls").unwrap().syntax,
            "integer 1..=64"
        );
    }

    #[test]
    fn environment_overrides_config_overrides_default() {
        let config = BtlConfig {
            sd_num: Some(64),
            rd_num: Some(100),
            ..BtlConfig::default()
        };
        let p = load_with(&config, &[("UDBTL_SD_NUM", "256")]).unwrap();
        assert_eq!(
            (p.sd_num, p.source("sd_num")),
            (256, Some(Source::Environment))
        );
        assert_eq!((p.rd_num, p.source("rd_num")), (100, Some(Source::Config)));
        assert_eq!(
            (p.max_btls, p.source("max_btls")),
            (4, Some(Source::Default))
        );
        assert_eq!(p.source("no_such_parameter"), None);
    }

    #[test]
    fn integers_take_decimal_hex_and_size_suffixes() {
        let p = load_env(&[
            ("UDBTL_IB_QKEY", "0x11223344"),
            ("UDBTL_JOB_KEY", "12345"),
            ("UDBTL_MAX_SEND_SIZE", "4k"),
            ("UDBTL_MIN_SEND_SIZE", " 0x400 "),
            ("UDBTL_RCACHE_MAX_BYTES", "2G"),
            ("UDBTL_UDP_MTU", "9000"),
        ])
        .unwrap();
        assert_eq!(p.ib_qkey, 0x1122_3344);
        assert_eq!(p.job_key, 12345);
        assert_eq!(p.max_send_size, Some(4096));
        assert_eq!(p.min_send_size, Some(1024));
        assert_eq!(p.rcache_max_bytes, 2 << 30);
        assert_eq!(p.udp_mtu, Some(9000));
        assert_eq!(
            load_env(&[("UDBTL_MAX_SEND_SIZE", "1M")])
                .unwrap()
                .max_send_size,
            Some(MIB as usize)
        );
    }

    #[test]
    fn suffixes_are_only_for_sizes() {
        let err = load_env(&[("UDBTL_SD_NUM", "1k")]).unwrap_err();
        assert!(
            matches!(err, ParamError::Invalid { name: "sd_num", .. }),
            "{err}"
        );
    }

    #[test]
    fn bad_integers_name_the_parameter_and_variable() {
        for bad in [
            "abc",
            "-1",
            "+5",
            "0x",
            "12x",
            "1.5",
            "99999999999999999999999",
        ] {
            let err = load_env(&[("UDBTL_SD_NUM", bad)]).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("sd_num") && msg.contains("UDBTL_SD_NUM"),
                "{msg}"
            );
            assert!(matches!(
                err,
                ParamError::Invalid {
                    from: Source::Environment,
                    ..
                }
            ));
        }
    }

    #[test]
    fn bounds_are_enforced_from_env_and_config() {
        for (var, value) in [
            ("UDBTL_MAX_BTLS", "0"),
            ("UDBTL_MAX_BTLS", "65"),
            ("UDBTL_SD_NUM", "65537"),
            ("UDBTL_IB_SERVICE_LEVEL", "16"),
            ("UDBTL_IB_SRC_PATH_BITS", "128"),
            ("UDBTL_IB_PKEY_INDEX", "65536"),
            ("UDBTL_MAX_SEND_SIZE", "63"),
            ("UDBTL_MAX_SEND_SIZE", "17M"),
            ("UDBTL_RCACHE_MAX_ENTRIES", "0"),
            ("UDBTL_UDP_MTU", "65528"),
            ("UDBTL_IB_QKEY", "0x100000000"),
        ] {
            let err = load_env(&[(var, value)]).unwrap_err();
            assert!(err.to_string().contains(var), "{var}={value}: {err}");
        }
        let config = BtlConfig {
            ib_service_level: Some(16),
            ..BtlConfig::default()
        };
        let err = load_with(&config, &[]).unwrap_err();
        assert_eq!(
            err,
            ParamError::Invalid {
                name: "ib_service_level",
                value: "16".to_owned(),
                from: Source::Config,
                reason: "16 is outside 0..=15".to_owned(),
            }
        );
        assert!(
            err.to_string()
                .contains("parameter ib_service_level (from the config)")
        );
    }

    #[test]
    fn an_empty_environment_value_is_an_error() {
        for var in [
            "UDBTL_SD_NUM",
            "UDBTL_UDP_IF",
            "UDBTL_IF_INCLUDE",
            "UDBTL_UDP_IPV6",
        ] {
            let err = load_env(&[(var, "  ")]).unwrap_err();
            assert!(err.to_string().contains("empty value"), "{err}");
        }
    }

    #[test]
    fn the_environment_may_fix_a_bad_config_value() {
        let config = BtlConfig {
            sd_num: Some(0),
            ..BtlConfig::default()
        };
        assert_eq!(
            load_with(&config, &[("UDBTL_SD_NUM", "8")]).unwrap().sd_num,
            8
        );
    }

    #[test]
    fn booleans() {
        for (text, want) in [
            ("1", true),
            ("yes", true),
            ("ON", true),
            ("True", true),
            ("0", false),
            ("off", false),
            ("No", false),
        ] {
            assert_eq!(
                load_env(&[("UDBTL_UDP_IPV6", text)]).unwrap().udp_ipv6,
                want,
                "{text}"
            );
        }
        assert!(load_env(&[("UDBTL_UDP_IPV6", "2")]).is_err());
    }

    #[test]
    fn mpool_and_provider_are_choices() {
        let p = load_env(&[("UDBTL_MPOOL", "GRDMA"), ("UDBTL_PROVIDER", "sim")]).unwrap();
        assert_eq!((p.mpool.as_str(), p.provider.as_str()), ("grdma", "sim"));
        assert!(p.rcache_enabled());
        let config = BtlConfig {
            mpool: Some("none".into()),
            ..BtlConfig::default()
        };
        assert!(!load_with(&config, &[]).unwrap().rcache_enabled());
        let err = load_env(&[("UDBTL_MPOOL", "bogus")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("expected one of rdma, grdma, none"),
            "{err}"
        );
        assert!(load_env(&[("UDBTL_PROVIDER", "verbs")]).is_err());
    }

    #[test]
    fn port_selectors_parse_and_match() {
        let list = PortSelector::parse_list("mlx4_0, mlx4_1:2").unwrap();
        assert_eq!(
            list,
            [
                PortSelector {
                    device: "mlx4_0".into(),
                    port: None
                },
                PortSelector {
                    device: "mlx4_1".into(),
                    port: Some(2)
                },
            ]
        );
        assert!(list[0].matches("mlx4_0", 1) && list[0].matches("mlx4_0", 2));
        assert!(list[1].matches("mlx4_1", 2) && !list[1].matches("mlx4_1", 1));
        assert!(!list[0].matches("mlx4_00", 1));
        assert_eq!(list[1].to_string(), "mlx4_1:2");
        for bad in [
            "", ":1", "dev:", "dev:0", "dev:x", "dev:+1", "dev:256", "dev:1:2", "a,,b", "a,",
        ] {
            assert!(PortSelector::parse_list(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            "dev:0".parse::<PortSelector>(),
            Err(SelectorError::BadPort { .. })
        ));
        assert!(matches!(
            ":1".parse::<PortSelector>(),
            Err(SelectorError::EmptyDevice { .. })
        ));
    }

    #[test]
    fn port_lists_load_from_env_and_config() {
        let p = load_env(&[("UDBTL_IF_INCLUDE", "lo,eth0:1")]).unwrap();
        assert_eq!(p.if_include.as_ref().map(Vec::len), Some(2));
        let info = p
            .describe()
            .into_iter()
            .find(|i| i.name == "if_include")
            .unwrap();
        assert_eq!(info.value, "lo,eth0:1");
        let err = load_env(&[("UDBTL_IF_EXCLUDE", "eth0:0")]).unwrap_err();
        assert!(err.to_string().contains("UDBTL_IF_EXCLUDE"), "{err}");
        let config = BtlConfig {
            if_exclude: Some(Vec::new()),
            ..BtlConfig::default()
        };
        assert!(load_with(&config, &[]).is_err());
    }

    #[test]
    fn port_allowed_follows_include_or_exclude() {
        assert!(Params::default().port_allowed("mlx4_0", 1));
        let include = load_env(&[("UDBTL_IF_INCLUDE", "mlx4_0:2,mlx4_1")]).unwrap();
        assert!(!include.port_allowed("mlx4_0", 1));
        assert!(include.port_allowed("mlx4_0", 2));
        assert!(include.port_allowed("mlx4_1", 1));
        let exclude = load_env(&[("UDBTL_IF_EXCLUDE", "mlx4_0:2")]).unwrap();
        assert!(exclude.port_allowed("mlx4_0", 1));
        assert!(!exclude.port_allowed("mlx4_0", 2));
    }

    #[test]
    fn include_and_exclude_conflict() {
        let config = BtlConfig {
            if_include: Some(vec!["lo".parse().unwrap()]),
            ..BtlConfig::default()
        };
        let err = load_with(&config, &[("UDBTL_IF_EXCLUDE", "eth0")]).unwrap_err();
        assert_eq!(
            err,
            ParamError::Conflict {
                first: "if_include",
                first_from: Source::Config,
                second: "if_exclude",
                second_from: Source::Environment,
                reason: "set either the ports to include or those to exclude, not both",
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("if_include") && msg.contains("UDBTL_IF_EXCLUDE"),
            "{msg}"
        );
    }

    #[test]
    fn min_send_size_may_not_exceed_max_send_size() {
        let err =
            load_env(&[("UDBTL_MIN_SEND_SIZE", "4k"), ("UDBTL_MAX_SEND_SIZE", "2k")]).unwrap_err();
        assert!(
            matches!(
                err,
                ParamError::Conflict {
                    first: "min_send_size",
                    ..
                }
            ),
            "{err}"
        );
        assert!(load_env(&[("UDBTL_MIN_SEND_SIZE", "2k"), ("UDBTL_MAX_SEND_SIZE", "2k")]).is_ok());
    }

    #[test]
    fn text_is_trimmed() {
        let p = load_env(&[("UDBTL_UDP_IF", " eth0 ")]).unwrap();
        assert_eq!(p.udp_if.as_deref(), Some("eth0"));
    }
}
