//! Job wire-up: PMI, the transport, and the address exchange (the modex).

use std::time::{Duration, Instant};

use udbtl_btl::params::Source;
use udbtl_btl::{
    BtlConfig, BtlError, Component, DesFlags, EndpointId, NO_ORDER, Params, RecvEvent, Tag,
    udp_config,
};
use udbtl_fabric::faulty::{FaultConfigError, FaultyProvider};
use udbtl_fabric::udp::UdpProvider;
use udbtl_pmi::{PmiClient, PmiError};

/// The transport under a world: UDP, or UDP behind the fault injector when
/// `UDBTL_FAULT_*` asks for losses (so that real multi-process runs can be
/// made lossy). Two variants rather than a trait object: the BTL is generic
/// over its provider, and the plain path pays nothing for the option.
enum Transport {
    Udp(Component<UdpProvider>),
    Faulty(Component<FaultyProvider<UdpProvider>>),
}

/// Runs `$body` with `$btl` bound to whichever component is in use.
macro_rules! with_btl {
    ($transport:expr, $btl:ident => $body:expr) => {
        match $transport {
            Transport::Udp($btl) => $body,
            Transport::Faulty($btl) => $body,
        }
    };
}

/// How peers' addresses are fetched after the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModexMode {
    /// Every rank fetches every address during [`init`]: O(N) gets per rank.
    Bulk,
    /// A rank fetches a peer's address the first time it needs that peer.
    Lazy,
}

/// Longest `finalize` waits for this rank's sends to be acknowledged.
const FINALIZE_DRAIN: Duration = Duration::from_secs(5);
/// How long `finalize` keeps acknowledging after the last barrier.
const FINALIZE_LINGER: Duration = Duration::from_millis(20);

/// Jobs larger than this fetch addresses lazily unless `UDBTL_MODEX` says
/// otherwise: most ranks of a large job talk to few peers.
const BULK_MODEX_MAX_SIZE: u32 = 256;

/// Starting the job failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The PMI exchange with the launcher failed.
    #[error("PMI: {0}")]
    Pmi(#[from] PmiError),
    /// The transport could not be opened.
    #[error("transport: {0}")]
    Btl(#[from] BtlError),
    /// A peer published no address, or one this process cannot reach.
    #[error("rank {rank} is unreachable: {reason}")]
    Unreachable {
        /// The peer.
        rank: u32,
        /// Why.
        reason: String,
    },
    /// `UDBTL_MODEX` held something other than `bulk` or `lazy`.
    #[error("UDBTL_MODEX={0:?}: expected bulk or lazy")]
    BadModexMode(String),
    /// A peer's rank is outside the job.
    #[error("rank {rank} is outside a job of {size}")]
    NoSuchRank {
        /// The rank asked for.
        rank: u32,
        /// The job size.
        size: u32,
    },
    /// `UDBTL_FAULT_*` held an invalid rate.
    #[error("fault injection: {0}")]
    Faults(#[from] FaultConfigError),
    /// A message did not fit, or no fragment became free in time.
    #[error("cannot send {len} bytes to rank {rank}: {reason}")]
    Send {
        /// Destination.
        rank: u32,
        /// Message length.
        len: usize,
        /// Why.
        reason: String,
    },
}

/// A started job, as one rank sees it.
pub struct World {
    pmi: PmiClient,
    btl: Transport,
    rank: u32,
    size: u32,
    /// Module 0's endpoint for every rank, filled in bulk or lazily.
    endpoints: Vec<Option<EndpointId>>,
    modex: ModexMode,
    started: Instant,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("modex", &self.modex)
            .finish_non_exhaustive()
    }
}

/// The PMI key under which `rank` publishes its addresses.
fn address_key(rank: u32) -> String {
    format!("udbtl-addr-{rank}")
}

/// The PMI key under which a process publishes its rank, by the process id
/// its datagrams carry: a rank that fetches addresses lazily looks up a
/// sender it does not know yet.
fn process_key(proc_id: u32) -> String {
    format!("udbtl-proc-{proc_id:08x}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect()
}

/// FNV-1a, to derive a job key from a launcher's job name.
fn job_key_from(name: &str) -> u32 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    // Zero means "no key"; any other value is a key.
    ((hash >> 32) as u32 ^ hash as u32).max(1)
}

/// Starts the job: PMI when a launcher is present (a singleton otherwise),
/// the transport on the `udp` provider with the parameters from the
/// environment, the address exchange and one barrier.
///
/// The job key comes from `UDBTL_JOB_KEY` (udrun sets it); under another
/// launcher it is derived from the job's KVS name, so datagrams of another
/// job, or of a stale run that reused the ports, are dropped.
///
/// # Errors
/// A PMI failure, a transport that cannot open, or a bad `UDBTL_MODEX`.
pub fn init() -> Result<World, InitError> {
    World::init_with(BtlConfig::default())
}

impl World {
    /// [`init`] with parameters chosen by the program (the environment still
    /// overrides them).
    ///
    /// # Errors
    /// As [`init`].
    pub fn init_with(config: BtlConfig) -> Result<Self, InitError> {
        let started = Instant::now();
        let mut pmi = PmiClient::from_env()?;
        pmi.init()?;
        let (rank, size) = (pmi.rank(), pmi.size());
        let mut params = Params::load(&config).map_err(BtlError::from)?;
        if params.source("job_key") == Some(Source::Default) {
            if let Some(name) = pmi.kvsname() {
                params.job_key = job_key_from(name);
            }
        }
        let modex = match std::env::var("UDBTL_MODEX").ok().as_deref() {
            None | Some("") if size > BULK_MODEX_MAX_SIZE => ModexMode::Lazy,
            None | Some("") | Some("bulk") => ModexMode::Bulk,
            Some("lazy") => ModexMode::Lazy,
            Some(other) => return Err(InitError::BadModexMode(other.to_owned())),
        };
        let udp = UdpProvider::new(udp_config(&params));
        let faulty = FaultyProvider::from_env(udp.clone())?;
        let btl = if faulty.config().is_active() {
            tracing::warn!(faults = ?faulty.config(), "injecting faults into the transport");
            Transport::Faulty(Component::init(faulty, params)?)
        } else {
            Transport::Udp(Component::init(udp, params)?)
        };
        let blob = with_btl!(&btl, c => c.modex());
        pmi.put_long(&address_key(rank), &hex(&blob))?;
        let proc_id = with_btl!(&btl, c => c.modules()[0].process_id());
        pmi.put(&process_key(proc_id), &rank.to_string())?;
        pmi.barrier()?;
        let mut world = Self {
            pmi,
            btl,
            rank,
            size,
            endpoints: vec![None; size as usize],
            modex,
            started,
        };
        if modex == ModexMode::Bulk {
            world.connect_all()?;
        }
        tracing::debug!(rank, size, ?modex, elapsed = ?world.started.elapsed(), "job started");
        Ok(world)
    }

    fn fetch(&mut self, rank: u32) -> Result<Vec<u8>, InitError> {
        let unreachable = |reason: &str| InitError::Unreachable {
            rank,
            reason: reason.into(),
        };
        let value = self
            .pmi
            .get_long(&address_key(rank))?
            .ok_or_else(|| unreachable("it published no address"))?;
        unhex(&value).ok_or_else(|| unreachable("its address is not hex"))
    }

    /// Fetches every address and connects to every rank in one `add_procs`.
    fn connect_all(&mut self) -> Result<(), InitError> {
        let blobs: Vec<Vec<u8>> = (0..self.size)
            .map(|r| self.fetch(r))
            .collect::<Result<_, _>>()?;
        let views: Vec<Option<&[u8]>> = blobs.iter().map(|b| Some(b.as_slice())).collect();
        let added = with_btl!(&mut self.btl, c => c.add_procs(&views))?;
        for (rank, slot) in added[0].endpoints.iter().enumerate() {
            let endpoint = slot.ok_or_else(|| InitError::Unreachable {
                rank: rank as u32,
                reason: "no address on a shared network".into(),
            })?;
            self.endpoints[rank] = Some(endpoint);
            self.record_rank(endpoint, rank as u32)?;
        }
        Ok(())
    }

    /// Tags the endpoint with its rank, which receive callbacks get back.
    fn record_rank(&mut self, endpoint: EndpointId, rank: u32) -> Result<(), InitError> {
        with_btl!(&mut self.btl, c => c.modules_mut()[0].set_endpoint_context(endpoint, u64::from(rank)))?;
        Ok(())
    }

    /// This process's rank.
    pub const fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks in the job.
    pub const fn size(&self) -> u32 {
        self.size
    }

    /// How addresses are fetched.
    pub const fn modex_mode(&self) -> ModexMode {
        self.modex
    }

    /// Time since [`init`] began.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The endpoint of `rank` on the first module, connecting on first use
    /// when addresses are fetched lazily.
    ///
    /// # Errors
    /// A rank outside the job, or one that cannot be reached.
    pub fn endpoint(&mut self, rank: u32) -> Result<EndpointId, InitError> {
        let slot = self
            .endpoints
            .get(rank as usize)
            .copied()
            .ok_or(InitError::NoSuchRank {
                rank,
                size: self.size,
            })?;
        if let Some(endpoint) = slot {
            return Ok(endpoint);
        }
        let blob = self.fetch(rank)?;
        let added = with_btl!(&mut self.btl, c => c.add_procs(&[Some(&blob)]))?;
        let endpoint = added[0].endpoints[0].ok_or_else(|| InitError::Unreachable {
            rank,
            reason: "no address on a shared network".into(),
        })?;
        self.endpoints[rank as usize] = Some(endpoint);
        self.record_rank(endpoint, rank)?;
        Ok(endpoint)
    }

    /// Installs a receive callback for `tag` on every module. The callback
    /// gets the sender's rank when the sender is connected. Messages arrive
    /// exactly once and in order per sender.
    pub fn on_receive(
        &mut self,
        tag: Tag,
        callback: impl FnMut(Option<u32>, &[u8]) + Send + Clone + 'static,
    ) {
        with_btl!(&mut self.btl, c => {
            for module in c.modules_mut() {
                let mut callback = callback.clone();
                module.register(
                    tag,
                    Box::new(move |ev: &RecvEvent<'_>| {
                        let rank = ev.endpoint_context.and_then(|r| u32::try_from(r).ok());
                        callback(rank, ev.payload);
                    }),
                );
            }
        });
    }

    /// Sends `bytes` (at most the eager limit) to `rank` with `tag`, copying
    /// them into a send fragment the BTL frees once the peer acknowledged
    /// them. Waits, progressing, while no fragment is free.
    ///
    /// # Errors
    /// An unknown or unreachable rank, a message over the eager limit, or no
    /// fragment freed within a second.
    pub fn send_bytes(&mut self, rank: u32, tag: Tag, bytes: &[u8]) -> Result<(), InitError> {
        let endpoint = self.endpoint(rank)?;
        let fail = |reason: String| InitError::Send {
            rank,
            len: bytes.len(),
            reason,
        };
        with_btl!(&mut self.btl, c => {
            let eager = c.modules()[0].limits().eager_limit;
            if bytes.len() > eager {
                return Err(fail(format!("over the eager limit of {eager}")));
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            let des = loop {
                if let Some(des) = c.modules_mut()[0].alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP) {
                    break des;
                }
                if Instant::now() > deadline {
                    return Err(fail("no send fragment became free".into()));
                }
                c.progress();
            };
            let module = &mut c.modules_mut()[0];
            module.segment_mut(des).map_err(|e| fail(e.to_string()))?.copy_from_slice(bytes);
            module.send(endpoint, des, tag).map_err(|e| fail(e.to_string()))?;
        });
        Ok(())
    }

    /// Sends a message of any length to `rank`: the transport cuts it into
    /// datagrams and the receiver's callback gets it whole, once.
    ///
    /// # Errors
    /// An unknown, unreachable or lost rank.
    pub fn send_message(&mut self, rank: u32, tag: Tag, message: &[u8]) -> Result<(), InitError> {
        let endpoint = self.endpoint(rank)?;
        with_btl!(&mut self.btl, c => c.modules_mut()[0].send_message(endpoint, tag, message))
            .map_err(|e| InitError::Send {
                rank,
                len: message.len(),
                reason: e.to_string(),
            })
    }

    /// Sends not yet acknowledged by their peers.
    pub fn unacknowledged(&self) -> usize {
        with_btl!(&self.btl, c => c.modules().iter().map(|m| m.unacknowledged()).sum())
    }

    /// Every module's state, for humans (`btl_dump`).
    pub fn dump(&self) -> String {
        with_btl!(&self.btl, c => c.modules().iter().map(|m| format!("{m}\n")).collect())
    }

    /// Progresses the transport once; returns the completions handled.
    pub fn progress(&mut self) -> usize {
        let handled = with_btl!(&mut self.btl, c => c.progress());
        if self.modex == ModexMode::Lazy {
            self.connect_unknown_senders();
        }
        handled
    }

    /// Connects to ranks that sent to this one before it fetched their
    /// address: their datagrams were dropped, and are accepted once
    /// retransmitted.
    fn connect_unknown_senders(&mut self) {
        let unknown = with_btl!(&mut self.btl, c => c.modules_mut()[0].take_unknown_peers());
        for proc_id in unknown {
            let rank = match self.pmi.get(&process_key(proc_id)) {
                Ok(Some(text)) => text.parse::<u32>().ok(),
                Ok(None) => None,
                Err(err) => {
                    tracing::warn!(%err, proc_id, "looking up an unknown sender failed");
                    None
                }
            };
            match rank {
                Some(rank) => {
                    if let Err(err) = self.endpoint(rank) {
                        tracing::warn!(%err, rank, "connecting to a sender failed");
                    }
                }
                None => tracing::debug!(proc_id, "datagrams from a process outside this job"),
            }
        }
    }

    /// Waits until every rank has called `barrier` (through the launcher),
    /// progressing the transport meanwhile: peers may still need this rank's
    /// acknowledgements to finish their own sends.
    ///
    /// # Errors
    /// The PMI exchange failed.
    pub fn barrier(&mut self) -> Result<(), InitError> {
        let Self { pmi, btl, .. } = self;
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| pmi.barrier());
            while !waiter.is_finished() {
                if with_btl!(&mut *btl, c => c.progress()) == 0 {
                    std::thread::yield_now();
                }
            }
            match waiter.join() {
                Ok(result) => result.map_err(InitError::from),
                // The PMI client does not panic; if it ever did, report it.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Asks the launcher to end the whole job with `code`, then exits.
    pub fn abort(mut self, code: i32, message: &str) -> ! {
        if let Err(err) = self.pmi.abort(code, message) {
            tracing::error!(%err, "PMI abort failed");
        }
        std::process::exit(code)
    }

    /// Leaves the job: waits (progressing, up to a few seconds) until this
    /// rank's sends are acknowledged, meets every rank at a progressing
    /// barrier so that nobody tears its transport down while others still
    /// need its acknowledgements, lingers briefly for late retransmissions,
    /// then closes the transport and PMI.
    ///
    /// # Errors
    /// A PMI failure or resources the transport found leaked.
    pub fn finalize(mut self) -> Result<(), InitError> {
        let drained = with_btl!(&mut self.btl, c => c.modules_mut().iter_mut().all(|m| m.quiesce(FINALIZE_DRAIN)));
        if !drained {
            tracing::warn!(
                rank = self.rank,
                unacknowledged = self.unacknowledged(),
                "leaving with sends unacknowledged"
            );
        }
        self.barrier()?;
        if std::env::var_os("UDBTL_DUMP").is_some() {
            // The transport's counters, for a job run with UDBTL_DUMP=1.
            eprintln!(
                "rank {} transport state at finalize:\n{}",
                self.rank,
                self.dump()
            );
        }
        let linger = Instant::now() + FINALIZE_LINGER;
        while Instant::now() < linger {
            self.progress();
        }
        with_btl!(self.btl, c => c.finalize().map(drop))?;
        self.pmi.finalize()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects() {
        assert_eq!(
            unhex(&hex(&[0, 1, 0xab, 0xff])),
            Some(vec![0, 1, 0xab, 0xff])
        );
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn job_keys_from_names_differ_and_are_never_zero() {
        assert_ne!(job_key_from("kvs_1"), job_key_from("kvs_2"));
        assert_ne!(job_key_from(""), 0);
    }
}
