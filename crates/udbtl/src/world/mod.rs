//! Job wire-up: PMI, the transport, and the address exchange (the modex).

mod barrier;
mod error;
mod failures;
mod inbox;
mod messaging;
mod startup;
mod tag;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use udbtl_btl::params::Source;
use udbtl_btl::{BtlConfig, ErrorEvent, Params, SendEvent, Tag as BtlTag, Transport};
use udbtl_pmi::PmiClient;

use barrier::parse_barrier_message;
pub use error::{InitError, Lost, RecvError, SendError};
use failures::{FailureLog, Route, peer_name};
use inbox::Inbox;
pub use inbox::Message;
pub use startup::log_to_stderr;
use startup::{address_key, datagram_secret, dump_requested, job_key_from, job_layout};
pub use tag::{Tag, TagError};

/// How peers' addresses are fetched after the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModexMode {
    /// Every rank fetches every address during [`init`]: O(N) gets per rank.
    Bulk,
    /// A rank fetches a peer's address the first time it needs that peer.
    Lazy,
}

/// How long `finalize` keeps acknowledging after the last barrier.
const FINALIZE_LINGER: Duration = Duration::from_millis(20);
/// The tag of udbtl's own messages (barriers): the last of the BTL range,
/// which no program [`Tag`] reaches.
const CONTROL: BtlTag = BtlTag(BtlTag::PML.0 - 1);

/// Jobs larger than this fetch addresses lazily unless `UDBTL_MODEX` says
/// otherwise: most ranks of a large job talk to few peers.
const BULK_MODEX_MAX_SIZE: u32 = 256;

/// A started job, as one rank sees it.
pub struct World {
    pmi: PmiClient,
    btl: Transport,
    rank: u32,
    size: u32,
    /// The way to every rank (the first module that reaches it), filled in
    /// bulk or lazily.
    routes: Vec<Option<Route>>,
    modex: ModexMode,
    /// Whether the transport is reliable (`reliable`): a message of more
    /// than one datagram needs it.
    reliable: bool,
    /// `UDBTL_DUMP`: print the transport's state at finalize.
    dump: bool,
    started: Instant,
    /// Failures the transport reported (lost peers, failed sends).
    failures: Arc<FailureLog>,
    /// Barrier messages received, by (barrier number, round).
    arrivals: Arc<Mutex<HashSet<(u32, u8)>>>,
    /// Barriers this rank has entered.
    barriers: u32,
    /// Messages on tags without a callback, kept for `recv`.
    inbox: Arc<Inbox>,
    /// The tags with a program callback, one bit each.
    claimed: u128,
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

/// Starts the job: PMI when a launcher is present (a singleton otherwise),
/// the transport on the `udp` provider with the parameters from the
/// environment, the address exchange and one barrier.
///
/// It first sends log records to stderr, at `warn` unless `RUST_LOG` says
/// otherwise (a program that installed a global subscriber keeps its own),
/// so that the library's warnings reach the user. Rank 0 warns of each
/// `UDBTL_*` variable udbtl does not read, naming the closest real one, and
/// of active fault injection; `UDBTL_DUMP` is read as a boolean.
///
/// The job key comes from `UDBTL_JOB_KEY` (udrun sets it); under another
/// launcher it is derived from the job's KVS name, so datagrams of another
/// job, or of a stale run that reused the ports, are dropped.
///
/// # Errors
/// A PMI failure, a transport that cannot open (including `provider=sim`
/// and interfaces the host lacks), or a bad `UDBTL_MODEX`, `UDBTL_DUMP` or
/// (with `UDBTL_AUTH`) `UDBTL_PMI_SECRET`.
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
        log_to_stderr();
        let mut pmi = PmiClient::from_env()?;
        pmi.init()?;
        let (rank, size) = (pmi.rank(), pmi.size());
        if rank == 0 {
            // Every rank has the same environment: one warning per job.
            for unknown in udbtl_btl::params::env::unknown_env_vars() {
                tracing::warn!("{unknown}");
            }
        }
        let dump = dump_requested()?;
        let mut params = Params::load(&config).map_err(udbtl_btl::BtlError::from)?;
        if params.protection().is_some() {
            params.auth_secret = datagram_secret()?;
        }
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
        let reliable = params.reliable;
        let layout = job_layout(&mut pmi)?;
        let btl = Transport::open_in_job(params, Some(rank), layout)?;
        // A process is named by its rank: unique in the job, and the job key
        // tells jobs apart. A sender a rank does not know yet is then found
        // by the id its datagrams carry, with no lookup.
        btl.modules().iter().for_each(|m| m.set_process_id(rank));
        let blob = btl.modex();
        pmi.put_long(&address_key(rank), &hex::encode(&blob))?;
        pmi.barrier()?;
        let mut world = Self {
            pmi,
            btl,
            rank,
            size,
            routes: vec![None; size as usize],
            modex,
            reliable,
            dump,
            started,
            failures: Arc::default(),
            arrivals: Arc::default(),
            barriers: 0,
            inbox: Arc::default(),
            claimed: 0,
        };
        world.install_callbacks();
        world.keep_unclaimed();
        if modex == ModexMode::Bulk {
            world.connect_all()?;
        }
        tracing::debug!(rank, size, ?modex, ?layout, elapsed = ?world.started.elapsed(), "job started");
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
        hex::decode(&value).map_err(|_| unreachable("its address is not hex"))
    }

    /// Records what the transport reports lost, and counts barrier
    /// messages.
    fn install_callbacks(&mut self) {
        let failures = &self.failures;
        for (index, module) in self.btl.modules_mut().iter_mut().enumerate() {
            let log = failures.clone();
            module.set_send_callback(Box::new(move |event: &SendEvent| {
                log.record_send(index, event);
            }));
            let log = failures.clone();
            module.register_error(Box::new(move |event: &ErrorEvent| {
                log.record_error(index, event);
            }));
        }
        let arrivals = self.arrivals.clone();
        self.listen(CONTROL, move |_, payload| {
            if let Some((barrier, round)) = parse_barrier_message(payload) {
                arrivals
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert((barrier, round));
            }
        });
    }

    /// Fetches every address and connects to every rank in one `add_procs`.
    fn connect_all(&mut self) -> Result<(), InitError> {
        let blobs: Vec<Vec<u8>> = (0..self.size)
            .map(|r| self.fetch(r))
            .collect::<Result<_, _>>()?;
        let views: Vec<Option<&[u8]>> = blobs.iter().map(|b| Some(b.as_slice())).collect();
        let added = self.btl.add_procs(&views)?;
        for rank in 0..self.size {
            let route = first_route(&added, rank as usize)
                .ok_or_else(|| self.unreachable(rank, &blobs[rank as usize]))?;
            self.routes[rank as usize] = Some(route);
            self.record_rank(route, rank)?;
        }
        Ok(())
    }

    /// Says why `rank`, which published `blob`, is on no network of this
    /// process: both sides' addresses, and the setting to change.
    fn unreachable(&self, rank: u32, blob: &[u8]) -> InitError {
        let theirs = match udbtl_wire::modex::parse_blob(blob) {
            Ok(addresses) => addresses
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            Err(_) => "an address that does not parse".to_owned(),
        };
        let ours = self
            .btl
            .modules()
            .iter()
            .map(|m| format!("{} {}", m.device(), m.address()))
            .collect::<Vec<_>>()
            .join(", ");
        InitError::Unreachable {
            rank,
            reason: format!(
                "it published {theirs} and this process uses {ours}, with no network in \
                 common; choose interfaces both reach with UDBTL_IF_INCLUDE (names or subnets, \
                 e.g. 10.0.0.0/24)"
            ),
        }
    }

    /// Tags the route's endpoint with its rank, which receive callbacks get
    /// back.
    fn record_rank(&mut self, route: Route, rank: u32) -> Result<(), InitError> {
        self.btl.modules_mut()[route.module]
            .set_endpoint_context(route.endpoint, u64::from(rank))?;
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

    /// Connects to `rank` unless connected already: fetches its addresses
    /// (when they are fetched lazily) and adds it to the modules that reach
    /// it. Sends connect by themselves.
    ///
    /// # Errors
    /// A rank outside the job, or one that cannot be reached.
    pub fn connect(&mut self, rank: u32) -> Result<(), InitError> {
        self.route(rank).map(drop)
    }

    /// The way to `rank`, connecting on first use.
    fn route(&mut self, rank: u32) -> Result<Route, InitError> {
        let slot = self
            .routes
            .get(rank as usize)
            .copied()
            .ok_or(InitError::NoSuchRank {
                rank,
                size: self.size,
            })?;
        if let Some(route) = slot {
            return Ok(route);
        }
        let blob = self.fetch(rank)?;
        let added = self.btl.add_procs(&[Some(&blob)])?;
        let route = first_route(&added, 0).ok_or_else(|| self.unreachable(rank, &blob))?;
        self.routes[rank as usize] = Some(route);
        self.record_rank(route, rank)?;
        Ok(route)
    }

    /// Sends not yet acknowledged by their peers.
    pub fn unacknowledged(&self) -> usize {
        self.btl.modules().iter().map(|m| m.unacknowledged()).sum()
    }

    /// Every module's state, for humans (`btl_dump`).
    pub fn dump(&self) -> String {
        self.btl
            .modules()
            .iter()
            .map(|m| format!("{m}\n"))
            .collect()
    }

    /// Progresses the transport once; returns the completions handled.
    ///
    /// It reports no failure itself: a loop that waits for a peer's message
    /// calls [`check`](Self::check) too, or it would wait for ever on a peer
    /// the transport has declared lost.
    pub fn progress(&mut self) -> usize {
        let handled = self.btl.progress();
        if self.modex == ModexMode::Lazy {
            self.connect_unknown_senders();
        }
        handled
    }

    /// Connects to ranks that sent to this one before it fetched their
    /// address: their datagrams were dropped, and are accepted once
    /// retransmitted.
    fn connect_unknown_senders(&mut self) {
        let unknown: Vec<u32> = self
            .btl
            .modules_mut()
            .iter_mut()
            .flat_map(|m| m.take_unknown_peers())
            .collect();
        for rank in unknown {
            // The id a datagram carries is its sender's rank.
            if rank >= self.size {
                tracing::debug!(rank, "datagrams naming a rank outside this job");
                continue;
            }
            if let Err(err) = self.route(rank) {
                tracing::warn!(%err, rank, "connecting to a sender failed");
            }
        }
    }

    /// What the transport reported lost so far, if anything, naming the
    /// ranks concerned. Call it in every loop that waits for a peer: a
    /// progress call reports nothing itself, and a lost peer's messages never
    /// come. While nothing failed it costs one atomic load.
    ///
    /// # Errors
    /// [`Lost`] once any message was lost.
    pub fn check(&self) -> Result<(), Lost> {
        if !self.failures.any() {
            return Ok(());
        }
        let failures = self.failures.lock();
        if failures.is_empty() {
            return Ok(());
        }
        let rank_of = |route: Route| peer_name(&self.routes, route);
        let mut parts: Vec<String> = failures
            .lost
            .iter()
            .map(|(ep, message)| format!("{} lost ({message})", rank_of(*ep)))
            .collect();
        parts.extend(
            failures
                .failed_sends
                .iter()
                .map(|(ep, n)| format!("{n} sends to {} failed", rank_of(*ep))),
        );
        parts.extend(failures.other.iter().cloned());
        Err(Lost::new(format!(
            "rank {}: {}",
            self.rank,
            parts.join("; ")
        )))
    }

    /// Progresses until every send of this rank is acknowledged, or failed
    /// because its peer was declared lost: no fixed limit, the peer-failure
    /// rule decides.
    fn drain(&mut self) -> Result<(), InitError> {
        while self.unacknowledged() > 0 {
            if self.progress() == 0 {
                std::thread::yield_now();
            }
        }
        Ok(self.check()?)
    }

    /// Asks the launcher to end the whole job with `code`, then exits.
    pub fn abort(mut self, code: i32, message: &str) -> ! {
        if let Err(err) = self.pmi.abort(code, message) {
            tracing::error!(%err, "PMI abort failed");
        }
        std::process::exit(code)
    }

    /// Leaves the job:
    ///
    /// 1. waits, progressing, until this rank's sends are acknowledged (or
    ///    failed with a lost peer: the peer-failure rule bounds the wait);
    /// 2. meets every rank at a barrier over the transport, so that every
    ///    rank's sends are acknowledged before anyone goes on, then drains
    ///    the barrier's own messages;
    /// 3. meets every rank at the launcher's barrier, progressing while it
    ///    waits, so that nobody tears its transport down while others still
    ///    need its acknowledgements; lingers briefly for late
    ///    retransmissions, then closes the transport and PMI.
    ///
    /// # Errors
    /// [`InitError::Lost`] if any message this rank sent was not delivered
    /// (naming the peers and counts), a PMI failure, or resources the
    /// transport found leaked.
    pub fn finalize(mut self) -> Result<(), InitError> {
        let outcome = self.leave();
        if self.dump {
            // The transport's counters, for a job run with UDBTL_DUMP=1.
            eprintln!(
                "rank {} transport state at finalize:\n{}",
                self.rank,
                self.dump()
            );
        }
        // The transport is closed whatever happened, so that leaks are
        // still found; a loss is reported first.
        let closed = self.btl.finalize().map(drop);
        outcome?;
        closed?;
        self.pmi.finalize()?;
        Ok(())
    }

    /// The steps of `finalize` before the transport closes.
    fn leave(&mut self) -> Result<(), InitError> {
        self.drain()?;
        self.barrier()?;
        self.drain()?;
        self.pmi.barrier_start()?;
        while !self.pmi.barrier_poll()? {
            if self.progress() == 0 {
                std::thread::yield_now();
            }
        }
        let linger = Instant::now() + FINALIZE_LINGER;
        while Instant::now() < linger {
            self.progress();
        }
        self.warn_unread();
        Ok(self.check()?)
    }
}

/// The route of peer `index` of an `add_procs` call: its endpoint on the
/// first module that reaches it.
fn first_route(added: &[udbtl_btl::AddProcs], index: usize) -> Option<Route> {
    added.iter().enumerate().find_map(|(module, procs)| {
        let endpoint = (*procs.endpoints.get(index)?)?;
        Some(Route { module, endpoint })
    })
}
