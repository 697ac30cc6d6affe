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
//! Every parameter from `provider` on in the table below (the registration
//! cache's bounds, reliability, coalescing, the progress helper, checksums, keepalive,
//! the job key, the UDP provider's settings) is a udbtl addition;
//! [`ParamInfo::from_seed`] is `false` for them. The seed's
//! `min_send_size` and `max_send_size` defaulted to 2048 on the assumption of a
//! 2 KB InfiniBand MTU that was never queried; here they are unset by default
//! and the provider's MTU decides. The seed's `ib_qkey` was a fixed
//! 0x01330133 that anyone could put on a datagram; here it defaults to 0,
//! which draws a random Q_Key for each module.
//!
//! # Adding a parameter
//!
//! Add one line to the `parameters!` invocation below: [`BtlConfig`],
//! [`Params`], loading, [`Params::source`] and [`Params::describe`] all follow
//! from it.

use std::fmt;

use udbtl_wire::datagram::AuthKey;
use udbtl_wire::seal::Protection;

pub mod alias;
pub mod env;
mod load;
mod selector;
#[cfg(test)]
mod tests;
mod value;

use load::resolve;
pub use selector::{PortSelector, SelectorError};
use value::{BOOL, PORTS, Value, choice, hex, int, size};
pub use value::{ValueType, parse_bool};

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
    /// A renamed parameter's old variable and its new one are both set.
    #[error(
        "{old} and {} are both set; {old} is the old name of {}: set only the second",
        env_var(.now),
        env_var(.now)
    )]
    Renamed {
        /// The old variable.
        old: &'static str,
        /// The parameter it now sets.
        now: &'static str,
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
    /// The type of its values.
    pub value_type: ValueType,
    /// `true` if the seed (`btl_ofud`) had this parameter; `false` for udbtl
    /// additions.
    pub from_seed: bool,
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
            /// The job's datagram secret. With `auth`, each module derives
            /// its receive key from it ([`modex::derive_receive_key`]) and
            /// publishes no key, instead of publishing a random one. Not a
            /// parameter: a runtime that holds a job secret from its
            /// launcher sets it; it is never read from the environment nor
            /// shown by [`describe`](Self::describe).
            ///
            /// [`modex::derive_receive_key`]: udbtl_wire::modex::derive_receive_key
            pub auth_secret: Option<AuthKey>,
            sources: Sources,
        }

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        struct Sources {
            $($name: Source,)*
        }

        impl Params {
    /// How `auth` asks datagrams to be sealed; `None`: they are not.
    #[must_use]
    pub fn protection(&self) -> Option<Protection> {
        match self.auth.as_str() {
            "on" => Some(Protection::Authenticate),
            "encrypt" => Some(Protection::Encrypt),
            _ => None,
        }
    }

            fn defaults() -> Self {
                Self {
                    $($name: parameters!(@default $default),)*
                    auth_secret: None,
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
                        value_type: $kind.value_type(),
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
/// A quarter of the default socket buffer, the smallest allowed.
const MIN_UDP_SOCKBUF: u64 = MIB;
/// The largest UDP payload over IPv6 (65535 less the UDP header); IPv4 allows
/// less, which the provider checks against the interface.
const MAX_UDP_PAYLOAD: u64 = 65_527;
const USIZE_MAX: u64 = usize::MAX as u64;
/// The smallest eager payload `udp_mtu` may leave: a barrier, a greeting or
/// a small control message must fit one datagram.
pub const MIN_EAGER_PAYLOAD: usize = 256;
/// The smallest `udp_mtu`: the UD header, the BTL header with its
/// reliability extension, and [`MIN_EAGER_PAYLOAD`]. Any real path carries
/// more (IPv4's minimum, 576 bytes, leaves 548 for UDP).
pub const MIN_UDP_MTU: usize =
    udbtl_wire::ud::HEADER_LEN + udbtl_wire::datagram::HEADER_LEN + MIN_EAGER_PAYLOAD;

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
    ib_qkey: u32 = (0), hex(0, 0x7fff_ffff), seed,
        "Q_Key of this module's queue pairs, which peers put on their sends to it; \
         0: random per module, with a random job key mask (the modex carries both); \
         other values: that Q_Key and no mask, as the seed's fixed 0x01330133";
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
        "Devices, ports or subnets to use (dev, dev:port or 10.0.0.0/24, comma-separated); \
         unset: loopback for a job on one host, every other interface for a job across hosts; \
         exclusive with if_exclude";
    if_exclude: Vec<PortSelector> = unset, PORTS, seed,
        "Devices, ports or subnets to skip (dev, dev:port or 10.0.0.0/24, comma-separated); \
         exclusive with if_include";
    provider: String = (String::from("udp")), choice(&["udp", "sim", "verbs"]), udbtl,
        "Fabric provider: udp, sim, or verbs (RDMA; needs a build with the verbs feature)";
    rcache_max_entries: usize = (256), int(1, 65_536), udbtl,
        "Registrations the registration cache keeps";
    rcache_max_bytes: usize = (1 << 30), size(1, USIZE_MAX), udbtl,
        "Bytes of user memory the registration cache keeps registered";
    rd_mem: usize = (64 << 20), size(MIB, USIZE_MAX), udbtl,
        "Bytes of receive buffers per module while rd_num is left at its default: rd_num \
         is lowered until the pool fits (64 KiB loopback datagrams would make 6000 buffers \
         pin 375 MiB)";
    send_mem: usize = (64 << 20), size(MIB, USIZE_MAX), udbtl,
        "Bytes of send fragments per module while send_frags_max is left at its default: \
         send_frags_max is lowered until the list fits (a send fragment holds an eager \
         message, so 8192 of loopback's 64 KiB would let a flood pin 512 MiB)";
    send_frags_max: usize = (8192), int(1, 1 << 20), udbtl,
        "Send fragments a module's free list may grow to (the seed's bound of sd_num<<2 \
         hung alltoall; unbounded lists pin unbounded memory)";
    user_frags_max: usize = (8192), int(1, 1 << 20), udbtl,
        "User (zero-copy) fragments a module's free list may grow to";
    eager_max: usize = (66 << 10), size(64, 16 * MIB), udbtl,
        "Largest message a send fragment from alloc holds on a reliable module (what ob1 \
         takes as the eager limit): longer than one datagram's payload, it is a bounce \
         buffer that leaves as a train of datagrams; never less than one datagram's \
         payload. 66 KiB: a 64 KiB message and ob1's header go without a rendezvous, whose \
         extra round trip costs a time slice when ranks share CPUs. Bounce buffers are made \
         as needed within send_mem. An unreliable module allocs one datagram at most";
    frag_size: usize = (64 << 10), size(64, 16 * MIB), udbtl,
        "Largest fragment of a message one send carries from the caller's memory (the \
         BTL's max_send_size, what ob1 cuts a large message into) on a reliable module: \
         the BTL cuts it into a train of datagrams, each with its own sequence number, \
         and the receiver delivers it whole; rounded down to whole datagrams, never less \
         than one (64 KiB is 46 datagrams of an MTU-1500 path, and one of loopback's). An \
         unreliable module sends one datagram per fragment";
    read_copy: String = (String::from("cached")), choice(&["cached", "streaming"]), udbtl,
        "How remote reads (ob1's rendezvous gets) copy into their target: cached (ordinary \
         stores) or streaming (non-temporal stores, which do not read the target into the \
         cache first: about twice as fast into memory that is not in the cache, half as fast \
         into memory that is, and the application then reads the bytes from memory)";
    reliable: bool = (true), BOOL, udbtl,
        "Reliable, ordered, exactly-once delivery per peer (sequence numbers, ACKs, \
         retransmission); off gives the seed's unreliable behaviour";
    rel_window: u32 = (0), int(0, 1024), udbtl,
        "Datagrams in flight per peer at most, and the receive credit advertised; \
         0 picks about 1 MiB of datagrams, within 64..=1024 (64 where udp_segment makes \
         them 23 KB or more, 740 of an MTU-1500 path's with it off)";
    rel_first_seq: u32 = unset, hex(0, 0xffff_ffff), udbtl,
        "Sequence number every stream starts at, the same for every pair of processes: for \
         tests that cross the 32-bit wrap (0xffffff00 wraps after 256 datagrams); unset: \
         a place drawn per pair from both modex entries, which no one outside the job can \
         guess. Every process of the job must set it alike";
    peer_timeout: u32 = (30_000), int(10, 86_400_000), udbtl,
        "Milliseconds without acknowledgement, while data waits, before a peer is \
         declared lost (time, not a retry count, decides)";
    rto_min: u32 = (5000), int(10, 1_000_000), udbtl,
        "Microseconds the retransmission timeout never goes below, whatever the measured \
         round trip; losses are mostly repaired sooner, by time-based detection and the \
         tail-loss probe (two round trips). Above a scheduler's time slice, so that a peer \
         descheduled on a shared CPU is not taken for a loss (at 250 us, 4 ranks on 2 CPUs \
         retransmitted ten times as much and ran up to 2.4 times as long)";
    keepalive: bool = (true), BOOL, udbtl,
        "After data last flowed with a peer, probe it a few times while idle (every quarter \
         of peer_timeout, until it has answered for a whole peer_timeout), so that a peer \
         that dies while this process only waits for its data is reported within \
         peer_timeout instead of never";
    coalesce: bool = (true), BOOL, udbtl,
        "Pack a small whole message into the datagram of the previous one to the same peer \
         when both fit the eager limit and that one has not left: it waits for the peer's \
         window or credit, or it was sent in a burst (no progress call since the send before \
         it) and is held back until the next progress call; the receiver delivers each on its \
         own, in order, exactly once, and each send completes when the datagram is \
         acknowledged";
    progress_thread: bool = (true), BOOL, udbtl,
        "A helper thread services each reliable module (acknowledgements, retransmissions, \
         credit, the peer-failure clock) while the application does not call progress, so \
         that a rank busy computing is never taken for a dead one; it sleeps on the sockets \
         or a timer, and callbacks still run only in the application's own progress. Off \
         for programs that progress continuously";
    checksum: String = (String::from("auto")), choice(&["auto", "on", "off"]), udbtl,
        "Checksum every reliable datagram (CRC-32, hardware-accelerated): auto does so on \
         every fabric without end-to-end integrity of its own, which is all but InfiniBand \
         (ICRC); UDP's 16-bit checksum is weak and loopback does not even verify it";
    auth: String = (String::from("off")), choice(&["off", "on", "encrypt"]), udbtl,
        "Seal every datagram instead of checksumming it, so that a host outside the job \
         can neither inject nor replay traffic: on authenticates (AES-256-GCM tag, payload \
         in clear), encrypt also encrypts payloads; 1/0 and the other boolean spellings \
         mean on/off. Each datagram carries a 64-bit packet number a receiver takes once; \
         keys are per pair of processes and change every 2^32 datagrams. Under udrun \
         they derive from the job secret it hands every rank; under other launchers \
         each module draws a random key and publishes it in its address, through the \
         job's key-value space. Needs reliable; every process of the job must set it \
         alike";
    job_key: u32 = (0), int(0, 0xffff_ffff), udbtl,
        "Key carried in every BTL header; datagrams carrying another key are dropped";
    udp_ipv6: bool = (false), BOOL, udbtl,
        "Prefer IPv6 addresses for the udp provider";
    udp_mtu: usize = unset, size(MIN_UDP_MTU as u64, MAX_UDP_PAYLOAD), udbtl,
        "Largest payload per UDP datagram; unset: what one GSO send carries, up to 16 packets, \
         where udp_segment cuts datagrams into pieces, about 64 KiB on loopback, else the interface MTU less the IP and UDP headers. \
         At least 312: the 16-byte UD header, the 40-byte BTL header with its reliability \
         extension and a 256-byte payload";
    udp_sockbuf: usize = (4 << 20), size(MIN_UDP_SOCKBUF, 1 << 30), udbtl,
        "Bytes asked for each UDP socket's send and receive buffers (SO_SNDBUF, SO_RCVBUF); \
         the kernel caps them at net.core.wmem_max and net.core.rmem_max unless the process \
         has CAP_NET_ADMIN, with a warning";
    udp_gso: bool = (true), BOOL, udbtl,
        "Send trains of equal datagrams to one peer with one system call (UDP GSO)";
    udp_gro: bool = (true), BOOL, udbtl,
        "Receive coalesced trains (UDP GRO) where datagrams are small enough to form them";
    udp_segment: bool = (true), BOOL, udbtl,
        "On paths whose packets hold at most 9000 bytes (MTU 1500 or 9000, not loopback), carry \
         datagrams of up to 16 packets and one GSO send (23 408 bytes at MTU 1500, 62 748 at \
         MTU 9000), each cut into packet-sized pieces that leave as one GSO send and are put \
         back together on arrival: headers, checksums and acknowledgements are then paid per \
         datagram, not per packet. Needs udp_gso; a datagram missing a piece is lost whole. \
         Off: a datagram is at most one packet";
    udp_busy_poll: u32 = (0), int(0, 1_000_000), udbtl,
        "Microseconds a receive may busy-poll the network device's queue (SO_BUSY_POLL, needs \
         CAP_NET_ADMIN); 0: off. Helps only on devices with NAPI receive queues";
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
        let env = alias::follow(&env)?;
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
    /// Subnets are not judged here: the `udp` provider offers only the
    /// interfaces they let through, so an include list with a subnet lets
    /// every device the provider offers pass.
    pub fn port_allowed(&self, device: &str, port: u8) -> bool {
        let named = |list: &[PortSelector]| list.iter().any(|s| s.matches(device, port));
        match (&self.if_include, &self.if_exclude) {
            (Some(include), _) => named(include) || include.iter().any(PortSelector::is_subnet),
            (None, Some(exclude)) => !named(exclude),
            (None, None) => true,
        }
    }
}

impl Default for Params {
    /// The built-in defaults, ignoring the environment: the same as
    /// `Params::load_from(&BtlConfig::default(), |_| None)`.
    fn default() -> Self {
        Self::defaults()
    }
}
