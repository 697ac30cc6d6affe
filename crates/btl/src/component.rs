//! The component: finds ports and builds modules.

use udbtl_fabric::faulty::{self, FaultConfigError, FaultyProvider};
#[cfg(feature = "verbs")]
use udbtl_fabric::ibv::{VerbsConfig, VerbsProvider};
use udbtl_fabric::udp::{UdpConfig, UdpProvider};
use udbtl_fabric::{Context, PortState, Provider, sim};
use udbtl_wire::modex;

use crate::error::BtlError;
use crate::module::{AddProcs, Module};
use crate::params::Params;

/// The BTL component: the modules built on a provider's active ports.
pub struct Component<P: Provider> {
    provider: P,
    params: Params,
    modules: Vec<Module<P::Context>>,
}

impl<P: Provider> std::fmt::Debug for Component<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Component")
            .field("provider", &self.provider.name())
            .field("modules", &self.modules)
            .finish_non_exhaustive()
    }
}

impl<P: Provider> Component<P> {
    /// Opens the provider's devices and builds one module per ACTIVE port,
    /// up to `max_btls`, skipping ports `if_include`/`if_exclude` rule out.
    /// A module that fails to initialise is logged and skipped, as in the
    /// seed; its resources are released.
    ///
    /// # Errors
    /// [`BtlError::NoPorts`] when no module could be built, or the device
    /// listing failed.
    pub fn init(provider: P, params: Params) -> Result<Self, BtlError> {
        let devices = provider.devices().map_err(|source| BtlError::Fabric {
            step: "list devices",
            device: provider.name().into(),
            port: 0,
            source,
        })?;
        let mut modules = Vec::new();
        let mut failures = Vec::new();
        let mut skipped = Vec::new();
        'devices: for device in &devices {
            for port in 1..=device.port_count {
                if modules.len() >= params.max_btls as usize {
                    break 'devices;
                }
                if !params.port_allowed(&device.name, port) {
                    let why = if params.if_include.is_some() {
                        "not in if_include"
                    } else {
                        "in if_exclude"
                    };
                    skipped.push(format!("{}:{port} ({why})", device.name));
                    continue;
                }
                let ctx = match provider.open(&device.name) {
                    Ok(ctx) => ctx,
                    Err(err) => {
                        failures.push(format!("{}: {err}", device.name));
                        continue 'devices;
                    }
                };
                match ctx.query_port(port) {
                    Ok(attr) if attr.state == PortState::Active => {}
                    Ok(_) => {
                        skipped.push(format!("{}:{port} (down)", device.name));
                        continue;
                    }
                    Err(err) => {
                        failures.push(format!("{}:{port}: {err}", device.name));
                        continue;
                    }
                }
                match Module::new(ctx, port, &params) {
                    Ok(module) => modules.push(module),
                    Err((ctx, err)) => {
                        tracing::warn!(device = %device.name, port, %err, "module initialisation failed; port skipped");
                        if !ctx.resources().is_empty() {
                            tracing::error!(resources = ?ctx.resources(), "failed module left resources behind");
                        }
                        failures.push(format!("{}:{port}: {err}", device.name));
                    }
                }
            }
        }
        if modules.is_empty() {
            let listed: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            let mut detail = format!(" on provider {} (devices: {listed:?})", provider.name());
            if !skipped.is_empty() {
                detail.push_str(&format!("; skipped: {}", skipped.join(", ")));
            }
            if !failures.is_empty() {
                detail.push_str(&format!("; failures: {}", failures.join("; ")));
            }
            return Err(BtlError::NoPorts { detail });
        }
        Ok(Self {
            provider,
            params,
            modules,
        })
    }

    /// The modules, one per port in use.
    pub fn modules(&self) -> &[Module<P::Context>] {
        &self.modules
    }

    /// The modules, mutably.
    pub fn modules_mut(&mut self) -> &mut [Module<P::Context>] {
        &mut self.modules
    }

    /// The parameters in force.
    pub const fn params(&self) -> &Params {
        &self.params
    }

    /// The provider the modules run on.
    pub const fn provider(&self) -> &P {
        &self.provider
    }

    /// This process's addresses, one per module, as the blob peers pass to
    /// [`add_procs`](Self::add_procs).
    pub fn modex(&self) -> Vec<u8> {
        let addresses: Vec<modex::Address> = self.modules.iter().map(Module::address).collect();
        // NOTE(unwrap-free): max_btls is bounded far below 255 entries, so
        // emit_blob cannot fail; an empty blob would only mean "unreachable".
        modex::emit_blob(&addresses).unwrap_or_default()
    }

    /// Builds endpoints on every module for peers that published `blobs`
    /// (`None` for a peer that published nothing). Returns one result per
    /// module. A malformed blob makes that peer unreachable, not the call
    /// fail.
    ///
    /// # Errors
    /// A verbs failure creating an address handle.
    pub fn add_procs(&mut self, blobs: &[Option<&[u8]>]) -> Result<Vec<AddProcs>, BtlError> {
        let parsed: Vec<Option<Vec<modex::Address>>> = blobs
            .iter()
            .enumerate()
            .map(|(peer, blob)| {
                let blob = (*blob)?;
                match modex::parse_blob(blob) {
                    Ok(addresses) => Some(addresses),
                    Err(_) => {
                        tracing::warn!(
                            peer,
                            len = blob.len(),
                            "malformed address blob; peer unreachable"
                        );
                        None
                    }
                }
            })
            .collect();
        let views: Vec<Option<&[modex::Address]>> = parsed.iter().map(|p| p.as_deref()).collect();
        self.modules
            .iter_mut()
            .map(|m| m.add_procs(&views))
            .collect()
    }

    /// Progresses every module once; returns the completions handled.
    pub fn progress(&mut self) -> usize {
        self.modules.iter_mut().map(Module::progress).sum()
    }

    /// The earliest [`Module::next_deadline`] of the modules: when a
    /// progress call is next due even if nothing arrives, on the fabric's
    /// clock. A driver of a simulated fabric advances time to it.
    pub fn next_deadline(&mut self) -> Option<std::time::Duration> {
        self.modules
            .iter_mut()
            .filter_map(Module::next_deadline)
            .min()
    }

    /// Finalizes every module and returns their fabric contexts.
    ///
    /// # Errors
    /// The first module that found leaks; the others are still finalized.
    pub fn finalize(self) -> Result<Vec<P::Context>, BtlError> {
        let mut contexts = Vec::new();
        let mut first_error = None;
        for module in self.modules {
            match module.finalize() {
                Ok(ctx) => contexts.push(ctx),
                Err((ctx, err)) => {
                    contexts.push(ctx);
                    first_error.get_or_insert(err);
                }
            }
        }
        first_error.map_or(Ok(contexts), Err)
    }
}

/// The `udp` provider configuration the parameters ask for: `udp_if` (or
/// the devices of `if_include`) as interfaces, `udp_ipv6`, `udp_mtu`,
/// `udp_gso`, `udp_gro`, `udp_busy_poll`, `udp_sockbuf`.
pub fn udp_config(params: &Params) -> UdpConfig {
    let mut interfaces: Vec<String> = params
        .udp_if
        .as_deref()
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if interfaces.is_empty() {
        if let Some(include) = &params.if_include {
            interfaces = include.iter().map(|sel| sel.device.clone()).collect();
        }
    }
    UdpConfig {
        interfaces,
        ipv6: params.udp_ipv6,
        mtu: params.udp_mtu,
        gso: params.udp_gso,
        gro: params.udp_gro,
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

/// The component on UDP, or on UDP behind the fault injector when the
/// `UDBTL_FAULT_*` variables ask for losses (so that real multi-process runs
/// can be made lossy), or on RDMA devices when `provider` is `verbs` and
/// the build has the `verbs` feature. Two variants rather than a trait object: the BTL is
/// generic over its provider, and the plain path pays nothing for the
/// option. Run generic code on either with
/// [`with_udp_component!`](crate::with_udp_component).
#[derive(Debug)]
pub enum UdpComponent {
    /// Plain UDP.
    Plain(Component<UdpProvider>),
    /// UDP with injected faults.
    Faulty(Component<FaultyProvider<UdpProvider>>),
    /// RDMA devices through libibverbs (`provider=verbs`).
    #[cfg(feature = "verbs")]
    Verbs(Component<VerbsProvider>),
}

/// [`UdpComponent::init`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdpComponentError {
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
    /// The interfaces `udp_if` (or `if_include`) names are not on this host.
    #[error(
        "{setting} names {} this host does not have: {}; its interfaces are: {}",
        if .missing.len() == 1 { "an interface" } else { "interfaces" },
        .missing.join(", "),
        if .present.is_empty() { "none".to_owned() } else { .present.join(", ") }
    )]
    NoSuchInterface {
        /// The setting, e.g. `UDBTL_UDP_IF=eth9`.
        setting: String,
        /// The names or subnets no interface matches.
        missing: Vec<String>,
        /// The host's interfaces, with their addresses.
        present: Vec<String>,
    },
}

/// How an error names the setting of parameter `name`: `UDBTL_NAME=value`
/// when the environment set it, `parameter name=value` otherwise.
fn setting(params: &Params, name: &str, value: &str) -> String {
    match params.source(name) {
        Some(crate::params::Source::Environment) => {
            format!("{}={value}", crate::params::env_var(name))
        }
        _ => format!("parameter {name}={value}"),
    }
}

/// Checks what [`UdpComponent::init`] checks before it opens the `udp`
/// provider: that `provider` is not `sim`, and that the interfaces `udp_if`
/// or `if_include` name exist (listing those the host has when none does;
/// warning when only some are missing).
///
/// # Errors
/// [`UdpComponentError::SimulatedFabric`] or
/// [`UdpComponentError::NoSuchInterface`].
pub fn check_udp_settings(udp: &UdpProvider, params: &Params) -> Result<(), UdpComponentError> {
    if params.provider == sim::PROVIDER_NAME {
        return Err(UdpComponentError::SimulatedFabric {
            from: setting(params, "provider", &params.provider),
        });
    }
    if udp.config().interfaces.is_empty() {
        return Ok(());
    }
    let (missing, present) = match udp.unmatched_interfaces() {
        Ok(found) => found,
        // Component::init reports a listing failure itself.
        Err(_) => return Ok(()),
    };
    if missing.is_empty() {
        return Ok(());
    }
    let setting = match (&params.udp_if, &params.if_include) {
        (Some(udp_if), _) => setting(params, "udp_if", udp_if),
        (None, Some(include)) => {
            let list: Vec<String> = include.iter().map(ToString::to_string).collect();
            setting(params, "if_include", &list.join(","))
        }
        (None, None) => "the udp provider's configuration".to_owned(),
    };
    let err = UdpComponentError::NoSuchInterface {
        setting,
        missing,
        present,
    };
    if let UdpComponentError::NoSuchInterface { missing, .. } = &err {
        if missing.len() < udp.config().interfaces.len() {
            tracing::warn!("{err}; using the others");
            return Ok(());
        }
    }
    Err(err)
}

impl UdpComponent {
    /// Opens the UDP provider that `params` describe ([`udp_config`]),
    /// behind the fault injector if the environment asks for faults, and
    /// builds the modules ([`Component::init`]).
    ///
    /// # Errors
    /// A bad fault setting, or no module could be built.
    pub fn init(params: Params) -> Result<Self, UdpComponentError> {
        Self::init_in_job(params, None)
    }

    /// As [`init`](Self::init), for rank `rank` of a job: the warning that
    /// faults are injected, which every rank would give alike, is given by
    /// rank 0 only (at debug level by the others). `None` warns, as
    /// [`init`](Self::init) does.
    ///
    /// # Errors
    /// As [`init`](Self::init).
    pub fn init_in_job(params: Params, rank: Option<u32>) -> Result<Self, UdpComponentError> {
        if params.provider == "verbs" {
            #[cfg(feature = "verbs")]
            {
                let verbs = VerbsProvider::new(verbs_config(&params));
                return Ok(Self::Verbs(Component::init(verbs, params)?));
            }
            #[cfg(not(feature = "verbs"))]
            return Err(UdpComponentError::NotBuilt {
                provider: params.provider,
            });
        }
        let udp = UdpProvider::new(udp_config(&params));
        check_udp_settings(&udp, &params)?;
        let faulty = FaultyProvider::from_env(udp.clone())?;
        Ok(if faulty.config().is_active() {
            let faults = faulty.config();
            let what = format!(
                "fault injection is on: {}={} {}={} {}={} {}={}: datagrams are dropped, \
                 duplicated or reordered on purpose (for testing); unset UDBTL_FAULT_* for a \
                 normal run",
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
            Self::Faulty(Component::init(faulty, params)?)
        } else {
            Self::Plain(Component::init(udp, params)?)
        })
    }
}

/// Runs `$body` with `$component` bound to whichever [`Component`] a
/// [`UdpComponent`] holds.
#[cfg(not(feature = "verbs"))]
#[macro_export]
macro_rules! with_udp_component {
    ($udp:expr, $component:ident => $body:expr) => {
        match $udp {
            $crate::UdpComponent::Plain($component) => $body,
            $crate::UdpComponent::Faulty($component) => $body,
        }
    };
}

/// Runs `$body` with `$component` bound to whichever [`Component`] a
/// [`UdpComponent`] holds.
#[cfg(feature = "verbs")]
#[macro_export]
macro_rules! with_udp_component {
    ($udp:expr, $component:ident => $body:expr) => {
        match $udp {
            $crate::UdpComponent::Plain($component) => $body,
            $crate::UdpComponent::Faulty($component) => $body,
            $crate::UdpComponent::Verbs($component) => $body,
        }
    };
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
        let result = UdpComponent::init(params);
        if cfg!(feature = "verbs") {
            if std::env::var_os("UDBTL_TEST_VERBS_DEVICE").is_none() {
                assert!(
                    matches!(result, Err(UdpComponentError::Btl(_))),
                    "{result:?}"
                );
            }
        } else {
            assert!(
                matches!(result, Err(UdpComponentError::NotBuilt { ref provider }) if provider == "verbs"),
                "{result:?}"
            );
        }
    }
}
