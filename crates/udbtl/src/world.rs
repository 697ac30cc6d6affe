//! Job wire-up: PMI, the transport, and the address exchange (the modex).

use std::time::{Duration, Instant};

use udbtl_btl::params::Source;
use udbtl_btl::{
    BtlConfig, BtlError, Component, DesFlags, EndpointId, Module, NO_ORDER, Params, RecvEvent, Tag,
    udp_config,
};
use udbtl_fabric::udp::{UdpContext, UdpProvider};
use udbtl_pmi::{PmiClient, PmiError};

/// How peers' addresses are fetched after the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModexMode {
    /// Every rank fetches every address during [`init`]: O(N) gets per rank.
    Bulk,
    /// A rank fetches a peer's address the first time it needs that peer.
    Lazy,
}

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
    btl: Component<UdpProvider>,
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
        let btl = Component::init(UdpProvider::new(udp_config(&params)), params)?;
        pmi.put_long(&address_key(rank), &hex(&btl.modex()))?;
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
        let added = self.btl.add_procs(&views)?;
        for (rank, slot) in added[0].endpoints.iter().enumerate() {
            self.endpoints[rank] = Some(slot.ok_or_else(|| InitError::Unreachable {
                rank: rank as u32,
                reason: "no address on a shared network".into(),
            })?);
        }
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
        let added = self.btl.add_procs(&[Some(&blob)])?;
        let endpoint = added[0].endpoints[0].ok_or_else(|| InitError::Unreachable {
            rank,
            reason: "no address on a shared network".into(),
        })?;
        self.endpoints[rank as usize] = Some(endpoint);
        Ok(endpoint)
    }

    /// The BTL component, for the BTL contract itself.
    pub fn component(&mut self) -> &mut Component<UdpProvider> {
        &mut self.btl
    }

    /// The first (usually only) BTL module.
    pub fn btl(&mut self) -> &mut Module<UdpContext> {
        &mut self.btl.modules_mut()[0]
    }

    /// Installs a receive callback for `tag` on every module. The callback
    /// gets the sender's rank when the sender is connected.
    pub fn on_receive(
        &mut self,
        tag: Tag,
        callback: impl FnMut(Option<u32>, &[u8]) + Send + Clone + 'static,
    ) {
        let ranks = self.endpoints.clone();
        for module in self.btl.modules_mut() {
            let mut callback = callback.clone();
            let ranks = ranks.clone();
            module.register(
                tag,
                Box::new(move |ev: &RecvEvent<'_>| {
                    let rank = ev
                        .endpoint
                        .and_then(|ep| ranks.iter().position(|slot| *slot == Some(ep)));
                    callback(rank.map(|r| r as u32), ev.payload);
                }),
            );
        }
    }

    /// Sends `bytes` (at most the eager limit) to `rank` with `tag`, copying
    /// them into a send fragment the BTL frees once the datagram has left.
    /// Waits, progressing, while no fragment is free. Delivery is not
    /// guaranteed: this is the unreliable BTL.
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
        let deadline = Instant::now() + Duration::from_secs(1);
        let des = loop {
            if let Some(des) = self
                .btl()
                .alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP)
            {
                break des;
            }
            if bytes.len() > self.btl().limits().eager_limit {
                return Err(fail(format!(
                    "over the eager limit of {}",
                    self.btl().limits().eager_limit
                )));
            }
            if Instant::now() > deadline {
                return Err(fail("no send fragment became free".into()));
            }
            self.btl.progress();
        };
        let module = self.btl();
        module
            .segment_mut(des)
            .map_err(|e| fail(e.to_string()))?
            .copy_from_slice(bytes);
        module
            .send(endpoint, des, tag)
            .map_err(|e| fail(e.to_string()))?;
        Ok(())
    }

    /// Progresses the transport once; returns the completions handled.
    pub fn progress(&mut self) -> usize {
        self.btl.progress()
    }

    /// Waits until every rank has called `barrier` (through the launcher).
    ///
    /// # Errors
    /// The PMI exchange failed.
    pub fn barrier(&mut self) -> Result<(), InitError> {
        Ok(self.pmi.barrier()?)
    }

    /// Asks the launcher to end the whole job with `code`, then exits.
    pub fn abort(mut self, code: i32, message: &str) -> ! {
        if let Err(err) = self.pmi.abort(code, message) {
            tracing::error!(%err, "PMI abort failed");
        }
        std::process::exit(code)
    }

    /// Leaves the job: a last barrier so that no rank tears its transport
    /// down while others may still send to it, then the transport and PMI.
    ///
    /// # Errors
    /// A PMI failure or resources the transport found leaked.
    pub fn finalize(mut self) -> Result<(), InitError> {
        self.pmi.barrier()?;
        for _ in 0..16 {
            self.btl.progress();
        }
        self.btl.finalize()?;
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
