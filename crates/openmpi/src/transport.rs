//! The component's safe half: the transport under its modules, which peers
//! each module takes, the job's identity, and the counters Open MPI reads.

use std::fmt::Write as _;

use udbtl_btl::params::{ParamError, Source};
use udbtl_btl::{
    BtlConfig, BtlError, DesFlags, Descriptor, EndpointId, HostEvent, JobLayout, LentBytes, Limits,
    Module, Polled, SendArgs, SendStatus, UdpComponent, with_udp_component,
};
use udbtl_fabric::Context;
use udbtl_wire::{hash, modex};

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

/// The operations the Open MPI side needs of a module, whatever its fabric.
/// Every method takes `&self`: modules lock themselves, and the component
/// calls them from any thread (`MPI_THREAD_MULTIPLE`).
pub trait HostModule: Send + Sync {
    /// See [`Module::poll`].
    fn poll(&self) -> Polled;
    /// See [`Module::next_event`].
    fn next_event(&self) -> Option<HostEvent>;
    /// See [`Module::finish`]; `claimed` is `false` for a received message
    /// no host callback took ([`Module::finish_unclaimed`]).
    fn finish(&self, event: HostEvent, claimed: bool);
    /// A send fragment of `size` bytes and where its bytes are.
    fn alloc(&self, order: u8, size: usize) -> Option<(Descriptor, *mut u8)>;
    /// A descriptor that sends `lent` without a copy after `reserve` header
    /// bytes, and where the header goes; `None` when it cannot (the caller
    /// copies instead).
    fn prepare_lent(
        &self,
        lent: Box<dyn LentBytes>,
        order: u8,
        reserve: usize,
    ) -> Option<(Descriptor, *mut u8)>;
    /// See [`Module::free`].
    fn free(&self, des: Descriptor) -> Result<(), BtlError>;
    /// See [`Module::send_with`].
    fn send(
        &self,
        endpoint: EndpointId,
        des: Descriptor,
        args: SendArgs,
    ) -> Result<SendStatus, BtlError>;
    /// Whether one of `addresses` is on this module's network.
    fn reaches(&self, addresses: &[modex::Address]) -> bool;
    /// Whether this module's interface is loopback.
    fn is_loopback(&self) -> bool;
    /// The module's device and published address, for messages.
    fn describe_address(&self) -> String;
    /// See [`Module::add_peer`].
    fn add_peer(
        &self,
        addresses: &[modex::Address],
        job_key: u32,
        context: u64,
    ) -> Result<Option<(EndpointId, u64)>, BtlError>;
    /// See [`Module::endpoint_context`].
    fn endpoint_context(&self, endpoint: EndpointId) -> Option<u64>;
    /// Removes a peer.
    fn del_proc(&self, endpoint: EndpointId) -> Result<(), BtlError>;
    /// See [`Module::take_unknown_peers`].
    fn take_unknown_peers(&self) -> Vec<u32>;
    /// See [`Module::limits`].
    fn limits(&self) -> Limits;
    /// The module's state for humans.
    fn dump(&self) -> String;
    /// `key=value` counters for the `udbtl-stats:` line.
    fn stats_line(&self) -> String;
    /// Adds this module's counters to `totals`, indexed as [`COUNTERS`].
    fn add_counters(&self, totals: &mut [u64; COUNTERS.len()]);
}

/// The counters Open MPI tools read (MPI_T performance variables
/// `btl_udbtl_<name>`), summed over the modules: name and description.
pub const COUNTERS: [(&str, &str); 14] = [
    (
        "sent",
        "Sends posted to the fabric (datagrams, retransmissions not counted)",
    ),
    ("received", "Messages delivered to Open MPI"),
    ("send_errors", "Sends that failed (their peer was lost)"),
    ("retransmitted", "Datagrams sent again"),
    (
        "fast_retransmits",
        "Datagrams sent again because later ones were acknowledged",
    ),
    ("timeouts", "Retransmission timeouts"),
    ("duplicates", "Datagrams received twice and dropped"),
    ("lost_peers", "Peers declared lost"),
    (
        "dropped_bad_checksum",
        "Datagrams dropped: the checksum did not match",
    ),
    (
        "dropped_unauthenticated",
        "Datagrams dropped: no valid authentication tag",
    ),
    (
        "dropped_malformed",
        "Datagrams dropped: headers that did not parse",
    ),
    (
        "dropped_other_job",
        "Datagrams dropped: from a job this process does not know",
    ),
    (
        "dropped_unknown_peer",
        "Datagrams dropped: from a process not added yet",
    ),
    (
        "dropped_socket_full",
        "Datagrams the kernel dropped at a full socket buffer",
    ),
];

impl<C: Context + Send + 'static> HostModule for Module<C> {
    fn poll(&self) -> Polled {
        Self::poll(self)
    }

    fn next_event(&self) -> Option<HostEvent> {
        Self::next_event(self)
    }

    fn finish(&self, event: HostEvent, claimed: bool) {
        if claimed {
            Self::finish(self, event);
        } else {
            self.finish_unclaimed(event);
        }
    }

    fn alloc(&self, order: u8, size: usize) -> Option<(Descriptor, *mut u8)> {
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
        &self,
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

    fn free(&self, des: Descriptor) -> Result<(), BtlError> {
        Self::free(self, des)
    }

    fn send(
        &self,
        endpoint: EndpointId,
        des: Descriptor,
        args: SendArgs,
    ) -> Result<SendStatus, BtlError> {
        self.send_with(endpoint, des, args)
    }

    fn reaches(&self, addresses: &[modex::Address]) -> bool {
        Self::reaches(self, addresses)
    }

    fn is_loopback(&self) -> bool {
        match self.address().location {
            modex::Location::Ipv4(ip) => std::net::Ipv4Addr::from(ip).is_loopback(),
            modex::Location::Ipv6(ip) => std::net::Ipv6Addr::from(ip).is_loopback(),
            _ => false,
        }
    }

    fn add_peer(
        &self,
        addresses: &[modex::Address],
        job_key: u32,
        context: u64,
    ) -> Result<Option<(EndpointId, u64)>, BtlError> {
        Self::add_peer(self, addresses, job_key, context)
    }

    fn describe_address(&self) -> String {
        format!("{} {}", self.device(), self.address())
    }

    fn endpoint_context(&self, endpoint: EndpointId) -> Option<u64> {
        Self::endpoint_context(self, endpoint)
    }

    fn del_proc(&self, endpoint: EndpointId) -> Result<(), BtlError> {
        self.del_procs_host(&[endpoint])
    }

    fn take_unknown_peers(&self) -> Vec<u32> {
        Self::take_unknown_peers(self)
    }

    fn limits(&self) -> Limits {
        Self::limits(self)
    }

    fn dump(&self) -> String {
        self.to_string()
    }

    fn stats_line(&self) -> String {
        let s = self.stats();
        let limits = self.limits();
        let mut line = format!(
            "device={} sent={} received={} send_errors={} eager_limit={} rndv_eager_limit={} \
             max_send_size={}",
            self.device(),
            s.messages_sent,
            s.recvs_delivered,
            s.send_errors,
            limits.eager_limit,
            limits.rndv_eager_limit,
            limits.max_send_size,
        );
        if let Some(r) = self.reliability_stats() {
            let _ = write!(
                line,
                " retransmitted={} fast_retransmits={} timeouts={} duplicates={} keepalives={} \
                 lost_peers={} bad_checksum={} unauthenticated={} coalesced={}",
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

    fn add_counters(&self, totals: &mut [u64; COUNTERS.len()]) {
        let s = self.stats();
        let r = self.reliability_stats().unwrap_or_default();
        let socket_full = self.with_context(|ctx| ctx.stats().rx_kernel_drops);
        let values = [
            s.messages_sent,
            s.recvs_delivered,
            s.send_errors,
            r.retransmitted,
            r.fast_retransmits,
            r.timeouts,
            r.duplicates,
            r.peers_lost,
            s.recv_bad_checksum,
            s.recv_unauthenticated,
            s.recv_malformed,
            s.recv_bad_job_key,
            s.recv_unknown_peer,
            socket_full,
        ];
        for (total, value) in totals.iter_mut().zip(values) {
            *total += value;
        }
    }
}

/// The component's transport and its modules.
#[derive(Debug)]
pub struct OmpiTransport {
    transport: UdpComponent,
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
        let transport = UdpComponent::init_in_job(params, Some(who.vpid), who.layout)
            .map_err(|err| err.to_string())?;
        with_udp_component!(&transport, c => {
            c.modules().iter().for_each(|m| m.set_process_id(who.vpid));
        });
        Ok(Self { transport, job_key })
    }

    /// The key this job's datagrams carry.
    pub const fn job_key(&self) -> u32 {
        self.job_key
    }

    /// How many modules there are.
    pub fn module_count(&self) -> usize {
        with_udp_component!(&self.transport, c => c.modules().len())
    }

    /// Module `index`.
    pub fn module(&self, index: usize) -> Option<&dyn HostModule> {
        with_udp_component!(&self.transport, c => c
            .modules()
            .get(index)
            .map(|m| m as &dyn HostModule))
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
        let modules = || (0..self.module_count()).filter_map(|i| self.module(i));
        let local = modules().any(|m| m.is_loopback() && m.reaches(&addresses));
        if local && !module.is_loopback() {
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
        let ours: Vec<String> = (0..self.module_count())
            .filter_map(|i| self.module(i))
            .map(HostModule::describe_address)
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
        with_udp_component!(&self.transport, c => c.modex())
    }

    /// The counters of [`COUNTERS`], summed over the modules.
    pub fn counters(&self) -> [u64; COUNTERS.len()] {
        let mut totals = [0; COUNTERS.len()];
        for i in 0..self.module_count() {
            if let Some(module) = self.module(i) {
                module.add_counters(&mut totals);
            }
        }
        totals
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
