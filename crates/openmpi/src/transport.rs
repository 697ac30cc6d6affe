//! The component's safe half: the transport under its modules, which peers
//! each module takes, the job's identity, and the counters Open MPI reads.

use udbtl_btl::params::{ParamError, Source};
use udbtl_btl::{BtlConfig, BtlError, EndpointId, JobLayout, Module, Transport};
use udbtl_fabric::AnyContext;
use udbtl_wire::{hash, modex};

use crate::host::{self, COUNTERS};
use crate::log;
use crate::params::explicit_settings;

/// The key every datagram of a job carries, from Open MPI's job id: the
/// same in every process of the job, different between jobs.
pub fn job_key(job_id: u32) -> u32 {
    let digest = hash::fnv1a(&job_id.to_le_bytes());
    // Fold the 64-bit digest: both halves depend on every input byte.
    (digest as u32) ^ ((digest >> 32) as u32)
}

/// Who this process is, as Open MPI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The job id of the process name.
    pub job_id: u32,
    /// The process's rank in its job (the vpid).
    pub vpid: u32,
    /// Its rank among its job's processes on this host.
    pub local_rank: u32,
    /// Where the job runs, as Open MPI tells it: which interfaces the
    /// modules open when `if_include` names none.
    pub layout: JobLayout,
}

/// The component's transport and its modules.
#[derive(Debug)]
pub struct OmpiTransport {
    transport: Transport,
    job_key: u32,
}

impl OmpiTransport {
    /// Loads the parameters (`explicit[i]` is the value Open MPI was given for
    /// parameter `i` of [`param_table`](crate::params::param_table), if any;
    /// the rest keep their defaults or their `UDBTL_*` environment
    /// variables), opens the modules on the interfaces `who`'s placement
    /// calls for, and names the process by its vpid.
    ///
    /// # Errors
    /// A bad parameter value, a bad fault setting, or no module could start,
    /// said for a person.
    pub fn init(explicit: &[Option<String>], who: Identity) -> Result<Self, String> {
        let set = explicit_settings(explicit);
        let lookup = |key: &str| {
            set.get(key)
                .cloned()
                .or_else(|| std::env::var_os(key).map(|v| v.to_string_lossy().into_owned()))
        };
        // Configuration warnings are the same in every process of a node:
        // the first process of each node gives them.
        log::set_quiet(who.local_rank != 0);
        let started = Self::open(&set, lookup, who);
        log::set_quiet(false);
        started
    }

    fn open(
        set: &std::collections::HashMap<String, String>,
        lookup: impl Fn(&str) -> Option<String>,
        who: Identity,
    ) -> Result<Self, String> {
        for unknown in udbtl_btl::params::env::unknown_env_vars() {
            tracing::warn!("{unknown}");
        }
        let mut params = udbtl_btl::Params::load_from(&BtlConfig::default(), lookup).map_err(
            |err| match &err {
                // Name the MCA variable the user set, not the environment
                // variable it stands in for.
                ParamError::Invalid {
                    name,
                    value,
                    reason,
                    ..
                } if set.contains_key(&udbtl_btl::params::env_var(name)) => {
                    format!("invalid value {value:?} for MCA parameter btl_udbtl_{name}: {reason}")
                }
                _ => format!("bad parameter: {err}"),
            },
        )?;
        if params.source("job_key") == Some(Source::Default) {
            params.job_key = job_key(who.job_id);
        }
        let job_key = params.job_key;
        let transport = Transport::open_in_job(params, Some(who.vpid), who.layout)
            .map_err(|err| err.to_string())?;
        transport
            .modules()
            .iter()
            .for_each(|m| m.set_process_id(who.vpid));
        Ok(Self { transport, job_key })
    }

    /// The key this job's datagrams carry.
    pub const fn job_key(&self) -> u32 {
        self.job_key
    }

    /// How many modules there are.
    pub fn module_count(&self) -> usize {
        self.transport.modules().len()
    }

    /// Module `index`. Every method the C side calls on it takes `&self`:
    /// modules lock themselves, and the component calls them from any
    /// thread (`MPI_THREAD_MULTIPLE`).
    pub fn module(&self, index: usize) -> Option<&Module<AnyContext>> {
        self.transport.modules().get(index)
    }

    /// Adds the peer `peer` (a name for messages) that published `blob` to
    /// module `index`, if that module is the one to carry its traffic: a
    /// loopback module takes the peers on this host (its network is this
    /// host's), and another module takes a peer on its network unless a
    /// loopback module of this process reaches it. `job_key` is the key of
    /// the peer's job, `context` C's endpoint. Returns the endpoint and the
    /// context in force (see [`Module::add_peer`]); `None` when the module
    /// does not take the peer or the blob does not parse. When no module of
    /// this process reaches the peer, says why, naming both sides'
    /// addresses (for the first few such peers).
    ///
    /// # Errors
    /// The module could not create the endpoint.
    pub fn add_proc(
        &self,
        index: usize,
        peer: &str,
        blob: &[u8],
        job_key: u32,
        context: u64,
    ) -> Result<Option<(EndpointId, u64)>, BtlError> {
        let Some(module) = self.module(index) else {
            return Ok(None);
        };
        let Ok(addresses) = modex::parse_blob(blob) else {
            tracing::warn!(
                len = blob.len(),
                "{peer}: malformed address blob; peer unreachable"
            );
            return Ok(None);
        };
        let modules = || self.transport.modules().iter();
        let local = modules().any(|m| host::is_loopback(m) && m.reaches(&addresses));
        if local && !host::is_loopback(module) {
            return Ok(None);
        }
        if index == 0 && !modules().any(|m| m.reaches(&addresses)) {
            self.say_unreachable(peer, &addresses);
        }
        module.add_peer(&addresses, job_key, context)
    }

    /// Warns that no module reaches `peer`, with both sides' addresses and
    /// the setting to change; the first few times only.
    fn say_unreachable(&self, peer: &str, theirs: &[modex::Address]) {
        static TOLD: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        const TELL_AT_MOST: u32 = 4;
        let told = TOLD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if told >= TELL_AT_MOST {
            return;
        }
        let ours: Vec<String> = self
            .transport
            .modules()
            .iter()
            .map(host::describe_address)
            .collect();
        let theirs: Vec<String> = theirs.iter().map(ToString::to_string).collect();
        tracing::warn!(
            "{peer} is unreachable over udbtl: it published {} and this process uses {}, with \
             no network in common; choose interfaces both reach with btl_udbtl_if_include \
             (names or subnets, e.g. 10.0.0.0/24){}",
            theirs.join(", "),
            ours.join(", "),
            if told + 1 == TELL_AT_MOST {
                " (further unreachable peers are not reported)"
            } else {
                ""
            }
        );
    }

    /// This process's addresses, for the modex.
    pub fn modex(&self) -> Vec<u8> {
        self.transport.modex()
    }

    /// The counters of [`COUNTERS`], summed over the modules.
    pub fn counters(&self) -> [u64; COUNTERS.len()] {
        let mut totals = [0; COUNTERS.len()];
        for module in self.transport.modules() {
            host::add_counters(module, &mut totals);
        }
        totals
    }

    /// Releases the modules.
    ///
    /// # Errors
    /// Leaks or fabric refusals found on the way, said for a person.
    pub fn finalize(self) -> Result<(), String> {
        self.transport
            .finalize()
            .map(drop)
            .map_err(|err| err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::param_table;

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
            .position(|p| p.name.as_c_str() == c"sd_num")
            .expect("sd_num");
        explicit[sd_num] = Some("many".to_owned());
        let who = Identity {
            job_id: 1,
            vpid: 0,
            local_rank: 0,
            layout: JobLayout::OneHost,
        };
        let err = OmpiTransport::init(&explicit, who).expect_err("sd_num=many must be refused");
        assert!(
            err.contains("MCA parameter btl_udbtl_sd_num") && err.contains("\"many\""),
            "{err}"
        );
    }
}
