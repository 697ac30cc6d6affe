//! The component's safe half: its parameters as Open MPI variables, the
//! transport under its modules, and the job's identity.

use std::collections::HashMap;
use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::OnceLock;

use udbtl_btl::params::{ParamError, Source, env_var};
use udbtl_btl::{
    BtlConfig, BtlError, DesFlags, Descriptor, EndpointId, HostEvent, LentBytes, Module,
    SendStatus, Tag, UdpComponent, with_udp_component,
};
use udbtl_fabric::Context;
use udbtl_wire::{hash, modex};

/// One parameter as Open MPI registers it: `btl_udbtl_<name>`.
#[derive(Debug)]
pub struct ParamEntry {
    /// The name after `btl_udbtl_`.
    pub name: CString,
    /// The default, rendered as it is written; `None` when unset.
    pub default: Option<CString>,
    /// What it does and what it accepts.
    pub help: CString,
    /// Whether the seed (`btl_ofud`) had it.
    pub from_seed: bool,
}

/// Every BTL parameter, in table order, for Open MPI to register.
pub fn param_table() -> &'static [ParamEntry] {
    static TABLE: OnceLock<Vec<ParamEntry>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let defaults = match udbtl_btl::Params::load_from(&BtlConfig::default(), |_| None) {
            Ok(params) => params,
            Err(err) => {
                tracing::error!(%err, "the parameter defaults do not load");
                return Vec::new();
            }
        };
        defaults
            .describe()
            .into_iter()
            .filter_map(|info| {
                Some(ParamEntry {
                    name: CString::new(info.name).ok()?,
                    default: (info.default != "unset")
                        .then(|| CString::new(info.default.clone()).ok())
                        .flatten(),
                    help: CString::new(format!(
                        "{} [{}; environment {}]",
                        info.help, info.syntax, info.env_var
                    ))
                    .ok()?,
                    from_seed: info.from_seed,
                })
            })
            .collect()
    })
}

/// The key every datagram of this job carries, from Open MPI's job id: the
/// same in every process of the job, different between jobs.
pub fn job_key(job_id: u32) -> u32 {
    let digest = hash::fnv1a(&job_id.to_le_bytes());
    // Fold the 64-bit digest: both halves depend on every input byte.
    (digest as u32) ^ ((digest >> 32) as u32)
}

/// What ob1 learns of a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleLimits {
    /// Largest `alloc`, headers included (ob1's eager limit).
    pub eager_limit: usize,
    /// Data in the first fragment of a rendezvous.
    pub rndv_eager_limit: usize,
    /// Largest fragment `prepare_src` returns.
    pub max_send_size: usize,
    /// Exclusivity: below vader's and self's, so that shared memory wins on a
    /// node.
    pub exclusivity: u32,
    /// Bandwidth in MB/s.
    pub bandwidth: u32,
}

/// The operations the Open MPI side needs of a module, whatever its fabric.
pub trait HostModule {
    /// See [`Module::poll`].
    fn poll(&mut self) -> usize;
    /// See [`Module::next_event`].
    fn next_event(&mut self) -> Option<HostEvent>;
    /// See [`Module::finish`]; `claimed` is `false` for a received message
    /// no host callback took ([`Module::finish_unclaimed`]).
    fn finish(&mut self, event: HostEvent, claimed: bool);
    /// A send fragment of `size` bytes and where its bytes are.
    fn alloc(&mut self, order: u8, size: usize) -> Option<(Descriptor, *mut u8)>;
    /// A descriptor that sends `lent` without a copy after `reserve` header
    /// bytes, and where the header goes; `None` when it cannot (the caller
    /// copies instead).
    fn prepare_lent(
        &mut self,
        lent: Box<dyn LentBytes>,
        order: u8,
        reserve: usize,
    ) -> Option<(Descriptor, *mut u8)>;
    /// See [`Module::free`].
    fn free(&mut self, des: Descriptor) -> Result<(), BtlError>;
    /// Sends the first `len` bytes of `des`'s segment; `context` comes back
    /// in its completion.
    fn send(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        len: usize,
        tag: Tag,
        owned: bool,
        context: u64,
    ) -> Result<SendStatus, BtlError>;
    /// Adds the peer that published `blob`; `None` when this module cannot
    /// reach it.
    fn add_proc(&mut self, blob: &[u8], context: u64) -> Result<Option<EndpointId>, BtlError>;
    /// See [`Module::endpoint_context`].
    fn endpoint_context(&self, endpoint: EndpointId) -> Option<u64>;
    /// Removes a peer.
    fn del_proc(&mut self, endpoint: EndpointId) -> Result<(), BtlError>;
    /// The module's state for humans.
    fn dump(&self) -> String;
    /// `key=value` counters for the `udbtl-stats:` line.
    fn stats_line(&self) -> String;
}

impl<C: Context + 'static> HostModule for Module<C> {
    fn poll(&mut self) -> usize {
        Self::poll(self)
    }

    fn next_event(&mut self) -> Option<HostEvent> {
        Self::next_event(self)
    }

    fn finish(&mut self, event: HostEvent, claimed: bool) {
        if claimed {
            Self::finish(self, event);
        } else {
            self.finish_unclaimed(event);
        }
    }

    fn alloc(&mut self, order: u8, size: usize) -> Option<(Descriptor, *mut u8)> {
        let des = Self::alloc(self, order, size, DesFlags::NONE)?;
        match self.segment_ptr(des) {
            Ok((data, _)) => Some((des, data)),
            Err(_) => {
                let _ = Self::free(self, des);
                None
            }
        }
    }

    fn prepare_lent(
        &mut self,
        lent: Box<dyn LentBytes>,
        order: u8,
        reserve: usize,
    ) -> Option<(Descriptor, *mut u8)> {
        let des = Self::prepare_lent(self, lent, order, reserve, DesFlags::NONE).ok()?;
        match self.segment_ptr(des) {
            Ok((header, _)) => Some((des, header)),
            Err(_) => {
                let _ = Self::free(self, des);
                None
            }
        }
    }

    fn free(&mut self, des: Descriptor) -> Result<(), BtlError> {
        Self::free(self, des)
    }

    fn send(
        &mut self,
        endpoint: EndpointId,
        des: Descriptor,
        len: usize,
        tag: Tag,
        owned: bool,
        context: u64,
    ) -> Result<SendStatus, BtlError> {
        self.set_segment_len(des, len)?;
        self.set_context(des, context)?;
        self.set_flags(
            des,
            if owned {
                DesFlags::BTL_OWNERSHIP
            } else {
                DesFlags::NONE
            },
        )?;
        Self::send(self, endpoint, des, tag)
    }

    fn add_proc(&mut self, blob: &[u8], context: u64) -> Result<Option<EndpointId>, BtlError> {
        let Ok(addresses) = modex::parse_blob(blob) else {
            tracing::warn!(len = blob.len(), "malformed address blob; peer unreachable");
            return Ok(None);
        };
        let added = self.add_procs(&[Some(&addresses)])?;
        let endpoint = added.endpoints.first().copied().flatten();
        if let Some(endpoint) = endpoint {
            self.set_endpoint_context(endpoint, context)?;
        }
        Ok(endpoint)
    }

    fn endpoint_context(&self, endpoint: EndpointId) -> Option<u64> {
        Self::endpoint_context(self, endpoint)
    }

    fn del_proc(&mut self, endpoint: EndpointId) -> Result<(), BtlError> {
        self.del_procs(&[endpoint])
    }

    fn dump(&self) -> String {
        self.to_string()
    }

    fn stats_line(&self) -> String {
        let s = self.stats();
        let limits = self.limits();
        let mut line = format!(
            "sent={} received={} send_errors={} eager_limit={} rndv_eager_limit={} \
             max_send_size={}",
            s.sends_posted,
            s.recvs_delivered,
            s.send_errors,
            limits.eager_limit,
            limits.rndv_eager_limit,
            limits.eager_limit,
        );
        if let Some(r) = self.reliability_stats() {
            let _ = write!(
                line,
                " retransmitted={} fast_retransmits={} timeouts={} duplicates={} keepalives={} lost_peers={} \
                 bad_checksum={} unauthenticated={} coalesced={}",
                r.retransmitted,
                r.fast_retransmits,
                r.timeouts,
                r.duplicates,
                r.keepalives,
                r.peers_lost,
                s.recv_bad_checksum,
                s.recv_unauthenticated,
                s.messages_coalesced
            );
        }
        line
    }
}

/// The component's transport and its modules.
#[derive(Debug)]
pub struct OmpiTransport {
    transport: UdpComponent,
}

impl OmpiTransport {
    /// Loads the parameters (`explicit[i]` is the value Open MPI was given for
    /// parameter `i` of [`param_table`], if any; the rest keep their defaults
    /// or their `UDBTL_*` environment variables), opens the modules, and
    /// names this process `rank` of job `job_id`.
    ///
    /// # Errors
    /// A bad parameter value, a bad fault setting, or no module could start,
    /// said for a person.
    pub fn init(explicit: &[Option<String>], job_id: u32, rank: u32) -> Result<Self, String> {
        let table = param_table();
        let mut set: HashMap<String, String> = HashMap::new();
        for (entry, value) in table.iter().zip(explicit) {
            if let Some(value) = value {
                let name = entry.name.to_string_lossy().into_owned();
                set.insert(env_var(&name), value.clone());
            }
        }
        let lookup = |key: &str| {
            set.get(key)
                .cloned()
                .or_else(|| std::env::var_os(key).map(|v| v.to_string_lossy().into_owned()))
        };
        let mut params = udbtl_btl::Params::load_from(&BtlConfig::default(), lookup).map_err(
            |err| match &err {
                // Name the MCA variable the user set, not the environment
                // variable it stands in for.
                ParamError::Invalid {
                    name,
                    value,
                    reason,
                    ..
                } if set.contains_key(&env_var(name)) => {
                    format!("invalid value {value:?} for MCA parameter btl_udbtl_{name}: {reason}")
                }
                _ => format!("bad parameter: {err}"),
            },
        )?;
        if params.source("job_key") == Some(Source::Default) {
            params.job_key = job_key(job_id);
        }
        let mut transport = UdpComponent::init(params).map_err(|err| err.to_string())?;
        with_udp_component!(&mut transport, c => {
            c.modules_mut().iter_mut().for_each(|m| m.set_process_id(rank));
        });
        Ok(Self { transport })
    }

    /// How many modules there are.
    pub fn module_count(&self) -> usize {
        with_udp_component!(&self.transport, c => c.modules().len())
    }

    /// Module `index`.
    pub fn module(&mut self, index: usize) -> Option<&mut dyn HostModule> {
        with_udp_component!(&mut self.transport, c => c
            .modules_mut()
            .get_mut(index)
            .map(|m| m as &mut dyn HostModule))
    }

    /// What ob1 learns of module `index`.
    pub fn limits(&self, index: usize) -> Option<ModuleLimits> {
        let (limits, params) = with_udp_component!(&self.transport, c =>
            (*c.modules().get(index)?.limits(), c.params()));
        Some(ModuleLimits {
            eager_limit: limits.eager_limit,
            rndv_eager_limit: limits.rndv_eager_limit.min(limits.eager_limit),
            max_send_size: limits.eager_limit,
            exclusivity: limits.exclusivity,
            bandwidth: params.bandwidth,
        })
    }

    /// This process's addresses, for the modex.
    pub fn modex(&self) -> Vec<u8> {
        with_udp_component!(&self.transport, c => c.modex())
    }

    /// Releases the modules.
    ///
    /// # Errors
    /// Leaks or fabric refusals found on the way, said for a person.
    pub fn finalize(self) -> Result<(), String> {
        let result = with_udp_component!(self.transport, c => c.finalize().map(drop));
        result.map_err(|err| err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_is_offered_with_its_default_and_help() {
        let table = param_table();
        let names: Vec<String> = table
            .iter()
            .map(|p| p.name.to_string_lossy().into_owned())
            .collect();
        for seed in ["sd_num", "rd_num", "max_send_size", "ib_qkey", "if_include"] {
            assert!(names.iter().any(|n| n == seed), "{seed} missing: {names:?}");
        }
        let sd_num = table
            .iter()
            .find(|p| p.name.as_bytes() == b"sd_num")
            .expect("sd_num");
        assert_eq!(sd_num.default.as_deref(), Some(c"128"));
        assert!(sd_num.from_seed);
        let udp_if = table
            .iter()
            .find(|p| p.name.as_bytes() == b"udp_if")
            .expect("udp_if");
        assert_eq!(udp_if.default, None, "an unset parameter has no default");
        assert!(udp_if.help.to_string_lossy().contains("UDBTL_UDP_IF"));
    }

    #[test]
    fn jobs_get_different_keys_and_a_job_one_key() {
        assert_eq!(job_key(7), job_key(7));
        assert_ne!(job_key(7), job_key(8));
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_parameter() {
        let table = param_table();
        let mut explicit = vec![None; table.len()];
        let sd_num = table
            .iter()
            .position(|p| p.name.as_bytes() == b"sd_num")
            .expect("sd_num");
        explicit[sd_num] = Some("many".to_owned());
        let err = OmpiTransport::init(&explicit, 1, 0).expect_err("sd_num=many must be refused");
        assert!(
            err.contains("MCA parameter btl_udbtl_sd_num") && err.contains("\"many\""),
            "{err}"
        );
    }
}
