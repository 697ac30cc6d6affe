//! The component: finds ports and builds modules; [`Transport`] is the
//! component on the provider a job's settings choose.

mod open;

#[cfg(feature = "verbs")]
pub use open::verbs_config;
pub use open::{
    JobLayout, Transport, TransportError, TransportModule, check_udp_settings, udp_config,
    udp_config_in,
};

use udbtl_fabric::{Context, PortState, Provider};
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
