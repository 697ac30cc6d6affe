//! Opening the transport as a job does: which provider (`udp`, `udp`
//! behind the fault injector, or `verbs`), which interfaces, which
//! settings; the choice is made once, here, and boxed as an
//! [`AnyProvider`].

use udbtl_fabric::faulty::{self, FaultConfigError, FaultyProvider};
#[cfg(feature = "verbs")]
use udbtl_fabric::ibv::{VerbsConfig, VerbsProvider};
use udbtl_fabric::udp::{InterfaceScope, UdpConfig, UdpProvider};
use udbtl_fabric::{AnyProvider, Provider, sim};

use super::Component;
use crate::error::BtlError;
use crate::params::Params;

/// Where a job's processes run: what decides the interfaces a component
/// opens when `if_include` names none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobLayout {
    /// Every process is on this host: loopback carries all the traffic.
    #[default]
    OneHost,
    /// Some processes are on other hosts: every interface but loopback, as
    /// Open MPI's tcp BTL (a process reaches the others on its own host
    /// through them too).
    SpansHosts,
}

/// [`udp_config_in`] for a job on one host.
pub fn udp_config(params: &Params) -> UdpConfig {
    udp_config_in(params, JobLayout::OneHost)
}

/// The `udp` provider configuration the parameters ask for, for a job laid
/// out as `layout`: the devices and subnets of `if_include` as interfaces,
/// else those `layout` calls for; those of `if_exclude` left out;
/// `udp_ipv6`, `udp_mtu`, `udp_gso`, `udp_gro`, `udp_segment`, `udp_busy_poll`,
/// `udp_sockbuf`.
pub fn udp_config_in(params: &Params, layout: JobLayout) -> UdpConfig {
    UdpConfig {
        interfaces: params
            .if_include
            .iter()
            .flatten()
            .map(|sel| sel.device.clone())
            .collect(),
        exclude: params
            .if_exclude
            .iter()
            .flatten()
            .map(|sel| sel.device.clone())
            .collect(),
        scope: match layout {
            JobLayout::OneHost => InterfaceScope::Loopback,
            JobLayout::SpansHosts => InterfaceScope::Network,
        },
        ipv6: params.udp_ipv6,
        mtu: params.udp_mtu,
        gso: params.udp_gso,
        gro: params.udp_gro,
        segment: params.udp_segment,
        busy_poll_us: params.udp_busy_poll,
        send_buffer: params.udp_sockbuf,
        recv_buffer: params.udp_sockbuf,
        ..UdpConfig::default()
    }
}

/// The `verbs` provider configuration the parameters ask for. No parameter
/// is the provider's own yet (the GID index is chosen by link layer and
/// the payload by the port's active MTU, which `max_send_size` may lower
/// in the modules): the `ib_*` parameters reach the device through the
/// queue pair transitions (`ib_pkey_index`, `ib_qkey`) and address handles
/// (`ib_service_level`, `ib_src_path_bits`) the modules make, and
/// `if_include`/`if_exclude` through [`Component::init`]'s port filter, as
/// for every provider.
#[cfg(feature = "verbs")]
pub fn verbs_config(params: &Params) -> VerbsConfig {
    let _ = params;
    VerbsConfig::default()
}

/// The transport a job runs on: the component on whichever provider
/// [`Transport::open`] chose, boxed, so that one type serves every choice.
/// The modules' contexts are [`AnyContext`](udbtl_fabric::AnyContext)s.
pub type Transport = Component<AnyProvider>;

/// A module of a [`Transport`].
pub type TransportModule = crate::Module<udbtl_fabric::AnyContext>;

/// [`Transport::open`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// `UDBTL_FAULT_*` held an invalid rate.
    #[error("fault injection: {0}")]
    Faults(#[from] FaultConfigError),
    /// No module could be built.
    #[error(transparent)]
    Btl(#[from] BtlError),
    /// The `provider` parameter names a provider this build lacks.
    #[error("provider {provider} is not built in (rebuild with the `{provider}` feature)")]
    NotBuilt {
        /// The provider asked for.
        provider: String,
    },
    /// `provider=sim` outside a test: the simulated fabric lives inside one
    /// process and cannot carry a job.
    #[error(
        "provider sim ({from}) is the in-process simulated fabric of the tests: it cannot \
         connect processes, so a job cannot run on it; use udp (the default) or verbs"
    )]
    SimulatedFabric {
        /// Where the setting came from, e.g. `UDBTL_PROVIDER=sim`.
        from: String,
    },
    /// No interface is left to use: the job spans hosts and the host has
    /// loopback only, or `if_exclude` left out every one.
    #[error(
        "no interface to use: {why}; this host's interfaces are: {}",
        if .present.is_empty() { "none".to_owned() } else { .present.join(", ") }
    )]
    NoInterface {
        /// Why none is left.
        why: String,
        /// The host's interfaces, with their addresses.
        present: Vec<String>,
    },
    /// The interfaces `if_include` names are not on this host.
    #[error(
        "{setting} names {} this host does not have: {}; its interfaces are: {}",
        if .missing.len() == 1 { "an interface" } else { "interfaces" },
        .missing.join(", "),
        if .present.is_empty() { "none".to_owned() } else { .present.join(", ") }
    )]
    NoSuchInterface {
        /// The setting, e.g. `UDBTL_IF_INCLUDE=eth9`.
        setting: String,
        /// The names or subnets no interface matches.
        missing: Vec<String>,
        /// The host's interfaces, with their addresses.
        present: Vec<String>,
    },
}

/// How an error names the setting of parameter `name`: `UDBTL_NAME=value`
/// (or the old name the user set) when the environment set it, `parameter
/// name=value` otherwise.
fn setting(params: &Params, name: &str, value: &str) -> String {
    match params.source(name) {
        Some(crate::params::Source::Environment) => {
            format!("{}={value}", crate::params::alias::spelled(name))
        }
        _ => format!("parameter {name}={value}"),
    }
}

/// Checks what [`Transport::open`] checks before it opens the `udp`
/// provider: that `provider` is not `sim`, that the interfaces
/// `if_include` names exist (listing those the host has when none does;
/// warning when only some are missing), and that some interface is left to
/// use.
///
/// # Errors
/// [`TransportError::SimulatedFabric`],
/// [`TransportError::NoSuchInterface`] or
/// [`TransportError::NoInterface`].
pub fn check_udp_settings(udp: &UdpProvider, params: &Params) -> Result<(), TransportError> {
    if params.provider == sim::PROVIDER_NAME {
        return Err(TransportError::SimulatedFabric {
            from: setting(params, "provider", &params.provider),
        });
    }
    let (missing, present) = match udp.unmatched_interfaces() {
        Ok(found) => found,
        // Component::init reports a listing failure itself.
        Err(_) => return Ok(()),
    };
    if !missing.is_empty() {
        check_named_interfaces(udp, params, missing, present.clone())?;
    }
    if udp.devices().is_ok_and(|devices| devices.is_empty()) {
        return Err(TransportError::NoInterface {
            why: why_none_left(udp.config(), params),
            present,
        });
    }
    Ok(())
}

/// Why the provider offers no interface at all, for
/// [`TransportError::NoInterface`].
fn why_none_left(config: &UdpConfig, params: &Params) -> String {
    let would_use = match (config.interfaces.is_empty(), config.scope) {
        (false, _) => "those named",
        (true, InterfaceScope::Network) => "every interface but loopback, for a job across hosts",
        (true, _) => "loopback, for a job on one host",
    };
    match &params.if_exclude {
        Some(exclude) => {
            let list: Vec<String> = exclude.iter().map(ToString::to_string).collect();
            format!(
                "{} left out all of the interfaces this process would use ({would_use})",
                setting(params, "if_exclude", &list.join(","))
            )
        }
        None if config.interfaces.is_empty() && config.scope == InterfaceScope::Network => {
            "the job spans hosts, and this host has no interface but loopback, which cannot \
             reach another host"
                .to_owned()
        }
        None => {
            format!("this host has none of the interfaces this process would use ({would_use})")
        }
    }
}

/// Fails when none of the interfaces `if_include` names exists
/// (`missing` of them do not), and warns when only some are missing.
fn check_named_interfaces(
    udp: &UdpProvider,
    params: &Params,
    missing: Vec<String>,
    present: Vec<String>,
) -> Result<(), TransportError> {
    let setting = match &params.if_include {
        Some(include) => {
            let list: Vec<String> = include.iter().map(ToString::to_string).collect();
            setting(params, "if_include", &list.join(","))
        }
        None => "the udp provider's configuration".to_owned(),
    };
    let err = TransportError::NoSuchInterface {
        setting,
        missing,
        present,
    };
    if let TransportError::NoSuchInterface { missing, .. } = &err {
        if missing.len() < udp.config().interfaces.len() {
            tracing::warn!("{err}; using the others");
            return Ok(());
        }
    }
    Err(err)
}

impl Component<AnyProvider> {
    /// Opens the provider that `params` choose and builds the modules
    /// ([`Component::init`]): `verbs` when `provider` is `verbs` (and the
    /// build has the `verbs` feature), else the `udp` provider that
    /// `params` describe ([`udp_config`]), behind the fault injector when
    /// the `UDBTL_FAULT_*` variables ask for losses (so that real
    /// multi-process runs can be made lossy).
    ///
    /// # Errors
    /// A provider this build lacks, a bad fault setting, a setting
    /// [`check_udp_settings`] refuses, or no module could be built.
    pub fn open(params: Params) -> Result<Self, TransportError> {
        Self::open_in_job(params, None, JobLayout::OneHost)
    }

    /// As [`open`](Self::open), for rank `rank` of a job laid out as
    /// `layout`, which chooses the interfaces when the parameters name none
    /// ([`udp_config_in`]). The warning that faults are injected, which
    /// every rank would give alike, is given by rank 0 only (at debug level
    /// by the others); `None` warns, as [`open`](Self::open) does.
    ///
    /// # Errors
    /// As [`open`](Self::open), and [`TransportError::NoInterface`] when no
    /// interface is left to use.
    pub fn open_in_job(
        params: Params,
        rank: Option<u32>,
        layout: JobLayout,
    ) -> Result<Self, TransportError> {
        let provider = choose_provider(&params, rank, layout)?;
        Ok(Self::init(provider, params)?)
    }
}

/// The provider [`Transport::open_in_job`] opens, boxed.
fn choose_provider(
    params: &Params,
    rank: Option<u32>,
    layout: JobLayout,
) -> Result<AnyProvider, TransportError> {
    if params.provider == "verbs" {
        #[cfg(feature = "verbs")]
        return Ok(AnyProvider::new(VerbsProvider::new(verbs_config(params))));
        #[cfg(not(feature = "verbs"))]
        return Err(TransportError::NotBuilt {
            provider: params.provider.clone(),
        });
    }
    let udp = UdpProvider::new(udp_config_in(params, layout));
    check_udp_settings(&udp, params)?;
    let faulty = FaultyProvider::from_env(udp.clone())?;
    if !faulty.config().is_active() {
        return Ok(AnyProvider::new(udp));
    }
    let faults = faulty.config();
    let what = format!(
        "fault injection is on: {}={} {}={} {}={} {}={}: datagrams are dropped, duplicated or \
         reordered on purpose (for testing); unset UDBTL_FAULT_* for a normal run",
        faulty::ENV_DROP,
        faults.drop,
        faulty::ENV_DUPLICATE,
        faults.duplicate,
        faulty::ENV_REORDER,
        faults.reorder,
        faulty::ENV_SEED,
        faults.seed
    );
    if rank.is_none_or(|rank| rank == 0) {
        tracing::warn!("{what}");
    } else {
        tracing::debug!("{what}");
    }
    Ok(AnyProvider::new(faulty))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `provider=verbs` opens libibverbs when built in (no device here, so
    /// no module), and says it is not built in otherwise.
    #[test]
    fn verbs_provider_is_selected_by_the_provider_parameter() {
        let params = Params::load_from(&crate::BtlConfig::default(), |name| {
            (name == "UDBTL_PROVIDER").then(|| "verbs".to_owned())
        })
        .expect("params");
        assert_eq!(params.provider, "verbs");
        let result = Transport::open(params);
        if cfg!(feature = "verbs") {
            if std::env::var_os("UDBTL_TEST_VERBS_DEVICE").is_none() {
                assert!(matches!(result, Err(TransportError::Btl(_))), "{result:?}");
            }
        } else {
            assert!(
                matches!(result, Err(TransportError::NotBuilt { ref provider }) if provider == "verbs"),
                "{result:?}"
            );
        }
    }
}
