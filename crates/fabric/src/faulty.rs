//! Loss, duplication and reordering injected on the send side of any
//! provider.
//!
//! [`FaultyProvider`] wraps a [`Provider`] and hands out [`FaultyContext`]s,
//! which pass every verb through to the wrapped context except
//! [`post_send`](Context::post_send), where each send request independently
//! meets one fate, drawn from a seeded generator:
//!
//! * **drop** (probability [`FaultConfig::drop`]): it is checked, completes
//!   successfully, and is never handed to the wrapped provider, as if the
//!   network had lost it;
//! * **duplicate** ([`FaultConfig::duplicate`]): it is posted twice, the copy
//!   unsignaled, so the receiver may see it twice but the sender sees one
//!   completion;
//! * **reorder** ([`FaultConfig::reorder`]): it is checked, its bytes are
//!   copied into a registration the wrapper owns, it completes, and the copy
//!   is posted after the next send that leaves on the same queue pair, or at
//!   the latest when the context is next polled;
//! * otherwise it is passed through untouched.
//!
//! The fates are exclusive, so the three rates must add up to at most 1.
//!
//! # What stays honest
//!
//! A dropped or held request never reaches the wrapped provider's
//! `post_send`, so the wrapper asks the provider's own
//! [`check_send`](Context::check_send) first, and adds the send queue room
//! its own completions take: a request the wrapped provider would refuse is
//! refused whatever its fate. Send
//! completions are returned in posting order per queue pair, including those
//! the wrapper produces. Registrations the wrapper makes for held requests are
//! not counted in [`resources`](Context::resources).
//!
//! One limit: completions produced by the wrapper are not counted against
//! the depth of the wrapped completion queue, so an overrun caused by them
//! is not reported.
//!
//! # Configuration from the environment
//!
//! [`FaultConfig::from_env`] reads [`ENV_DROP`], [`ENV_DUPLICATE`],
//! [`ENV_REORDER`] (fractions in `0.0..=1.0`) and [`ENV_SEED`] (an unsigned
//! integer). A variable that is unset or empty leaves its default (no fault,
//! seed 0); a value that does not parse or is out of range is an error naming
//! the variable.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::types::*;
use crate::{CompletionChannel, Context, FabricError, PostError, Provider, Result};

/// Environment variable with the drop rate.
pub const ENV_DROP: &str = "UDBTL_FAULT_DROP";
/// Environment variable with the duplication rate.
pub const ENV_DUPLICATE: &str = "UDBTL_FAULT_DUPLICATE";
/// Environment variable with the reordering rate.
pub const ENV_REORDER: &str = "UDBTL_FAULT_REORDER";
/// Environment variable with the seed of the fault generator.
pub const ENV_SEED: &str = "UDBTL_FAULT_SEED";

/// Rates of the faults a [`FaultyContext`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Fraction of sends dropped.
    pub drop: f64,
    /// Fraction of sends posted twice.
    pub duplicate: f64,
    /// Fraction of sends held back behind the next one.
    pub reorder: f64,
    /// Seed of the generator that draws the fates. Each context opened from
    /// one provider gets its own stream derived from it.
    pub seed: u64,
}

impl FaultConfig {
    /// Reads the configuration from the `UDBTL_FAULT_*` environment
    /// variables (see the [module documentation](self)).
    ///
    /// # Errors
    /// A value that does not parse, is out of range, or rates that add up to
    /// more than 1.
    pub fn from_env() -> Result<Self, FaultConfigError> {
        // A value that is not Unicode cannot be a number; lossy conversion
        // turns it into one that fails to parse and is reported by name.
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the configuration through `lookup`, which returns the value of
    /// a variable or `None` if it is unset. [`from_env`](Self::from_env) is
    /// this with the process environment; tests pass a map.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup<F>(mut lookup: F) -> Result<Self, FaultConfigError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        let mut value = |var: &'static str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .map(|v| (var, v))
        };
        let mut config = Self::default();
        for (var, field) in [
            (ENV_DROP, &mut config.drop),
            (ENV_DUPLICATE, &mut config.duplicate),
            (ENV_REORDER, &mut config.reorder),
        ] {
            if let Some((var, text)) = value(var) {
                *field = text.parse().map_err(|_| FaultConfigError::NotANumber {
                    var,
                    value: text.clone(),
                })?;
            }
        }
        if let Some((var, text)) = value(ENV_SEED) {
            config.seed = text
                .parse()
                .map_err(|_| FaultConfigError::NotANumber { var, value: text })?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks that each rate lies in `0.0..=1.0` and that they add up to at
    /// most 1.
    ///
    /// # Errors
    /// [`FaultConfigError::OutOfRange`] or
    /// [`FaultConfigError::RatesExceedOne`].
    pub fn validate(&self) -> Result<(), FaultConfigError> {
        for (var, value) in [
            (ENV_DROP, self.drop),
            (ENV_DUPLICATE, self.duplicate),
            (ENV_REORDER, self.reorder),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultConfigError::OutOfRange { var, value });
            }
        }
        let sum = self.drop + self.duplicate + self.reorder;
        if sum > 1.0 {
            return Err(FaultConfigError::RatesExceedOne { sum });
        }
        Ok(())
    }

    /// `true` if any fault has a nonzero rate.
    pub fn is_active(&self) -> bool {
        self.drop > 0.0 || self.duplicate > 0.0 || self.reorder > 0.0
    }
}

/// A fault configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultConfigError {
    /// A variable's value is not a number of the expected kind.
    #[error("{var}={value:?} is not a valid number")]
    NotANumber {
        /// The environment variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A rate is outside `0.0..=1.0`.
    #[error("{var}={value} is outside 0.0..=1.0")]
    OutOfRange {
        /// The environment variable setting the rate (also when the
        /// configuration was built in code).
        var: &'static str,
        /// The rate.
        value: f64,
    },
    /// The rates of the exclusive fates add up to more than 1.
    #[error("{ENV_DROP} + {ENV_DUPLICATE} + {ENV_REORDER} = {sum}, more than 1")]
    RatesExceedOne {
        /// The sum.
        sum: f64,
    },
}

/// What a [`FaultyContext`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultStats {
    /// Sends completed without being handed to the wrapped provider.
    pub dropped: u64,
    /// Extra copies posted.
    pub duplicated: u64,
    /// Sends held back and posted later.
    pub reordered: u64,
    /// Held sends the wrapped provider refused when they were finally posted
    /// (for instance because their address handle was destroyed meanwhile);
    /// to the peer they look lost.
    pub release_failures: u64,
}

/// A provider whose contexts inject send-side faults; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct FaultyProvider<P> {
    inner: P,
    config: FaultConfig,
    /// Contexts opened so far; each gets its own generator stream.
    opened: AtomicU64,
}

impl<P: Provider> FaultyProvider<P> {
    /// Wraps `inner`.
    ///
    /// # Errors
    /// An invalid configuration ([`FaultConfig::validate`]).
    pub fn new(inner: P, config: FaultConfig) -> Result<Self, FaultConfigError> {
        config.validate()?;
        Ok(Self {
            inner,
            config,
            opened: AtomicU64::new(0),
        })
    }

    /// Wraps `inner` with the configuration of the environment
    /// ([`FaultConfig::from_env`]).
    ///
    /// # Errors
    /// As [`FaultConfig::from_env`].
    pub fn from_env(inner: P) -> Result<Self, FaultConfigError> {
        Self::new(inner, FaultConfig::from_env()?)
    }

    /// The wrapped provider.
    pub const fn inner(&self) -> &P {
        &self.inner
    }

    /// The fault configuration.
    pub const fn config(&self) -> &FaultConfig {
        &self.config
    }
}

impl<P: Provider> Provider for FaultyProvider<P> {
    type Context = FaultyContext<P::Context>;

    /// The wrapped provider's name: upper layers select devices by it, and
    /// a faulty run should select the same ones.
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        self.inner.devices()
    }

    fn open(&self, device: &str) -> Result<Self::Context> {
        let inner = self.inner.open(device)?;
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        // Distinct, reproducible streams per context (the golden-ratio
        // increment of splitmix64 spreads consecutive indices apart).
        let seed = self
            .config
            .seed
            .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        Ok(FaultyContext::new(inner, self.config, seed))
    }
}

/// What happens to one send request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pass,
    Drop,
    Duplicate,
    Reorder,
}

/// A send held back for reordering, with its bytes in a wrapper-owned
/// registration (none for an empty payload).
#[derive(Debug)]
struct Held {
    wr_id: u64,
    ah: AhHandle,
    remote_qpn: u32,
    remote_qkey: u32,
    imm: Option<u32>,
    solicited: bool,
    bounce: Option<Mr>,
}

/// One signaled send whose completion the caller has not polled, in
/// posting order.
#[derive(Debug)]
enum Pending {
    /// Will come from the wrapped completion queue.
    Inner,
    /// Produced by the wrapper (a dropped or held send).
    Local(WorkCompletion),
}

#[derive(Debug)]
struct QpRecord {
    handle: QpHandle,
    pd: PdHandle,
    send_cq: CqHandle,
    cap: QpCap,
    /// Set when the queue pair is bound to a port.
    max_msg_size: Option<usize>,
    held: Vec<Held>,
    pending: VecDeque<Pending>,
    /// Signaled sends not yet returned by `poll_cq`.
    outstanding: u32,
}

/// A context that injects send-side faults into the context it wraps; see
/// the [module documentation](self).
#[derive(Debug)]
pub struct FaultyContext<C> {
    inner: C,
    config: FaultConfig,
    rng: fastrand::Rng,
    stats: FaultStats,
    /// The caller's registrations by key, to read the bytes of a send the
    /// wrapper holds back.
    mrs: HashMap<LKey, MrHandle>,
    mr_keys: HashMap<MrHandle, LKey>,
    /// Queue pairs by number; ordered so that polling visits them in a
    /// reproducible order.
    qps: BTreeMap<u32, QpRecord>,
    qp_nums: HashMap<QpHandle, u32>,
    /// Completions taken from the wrapped queue (or produced here) and not
    /// yet returned, per completion queue.
    ready: HashMap<CqHandle, VecDeque<WorkCompletion>>,
    scratch_wc: Vec<WorkCompletion>,
    scratch_bytes: Vec<u8>,
}

impl<C: Context> FaultyContext<C> {
    /// Wraps an opened context; `seed` starts its fault generator.
    ///
    /// Only resources created through the wrapper are known to it, so wrap
    /// a context before creating anything on it.
    ///
    /// # Errors
    /// An invalid configuration ([`FaultConfig::validate`]).
    pub fn wrap(inner: C, config: FaultConfig, seed: u64) -> Result<Self, FaultConfigError> {
        config.validate()?;
        Ok(Self::new(inner, config, seed))
    }

    fn new(inner: C, config: FaultConfig, seed: u64) -> Self {
        Self {
            inner,
            config,
            rng: fastrand::Rng::with_seed(seed),
            stats: FaultStats::default(),
            mrs: HashMap::new(),
            mr_keys: HashMap::new(),
            qps: BTreeMap::new(),
            qp_nums: HashMap::new(),
            ready: HashMap::new(),
            scratch_wc: Vec::new(),
            scratch_bytes: Vec::new(),
        }
    }

    /// Counters of the faults injected so far.
    pub const fn fault_stats(&self) -> FaultStats {
        self.stats
    }

    /// The fault configuration.
    pub const fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// The wrapped context.
    pub const fn inner(&self) -> &C {
        &self.inner
    }

    /// Posts every held send now, on every queue pair.
    pub fn flush_held(&mut self) {
        let qpns: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, qp)| !qp.held.is_empty())
            .map(|(qpn, _)| *qpn)
            .collect();
        for qpn in qpns {
            self.release_held(qpn);
        }
    }

    fn fate(&mut self) -> Fate {
        let FaultConfig {
            drop,
            duplicate,
            reorder,
            ..
        } = self.config;
        let r = self.rng.f64();
        if r < drop {
            Fate::Drop
        } else if r < drop + duplicate {
            Fate::Duplicate
        } else if r < drop + duplicate + reorder {
            Fate::Reorder
        } else {
            Fate::Pass
        }
    }

    fn record(&self, qp: QpHandle) -> Result<&QpRecord> {
        self.qp_nums
            .get(&qp)
            .and_then(|qpn| self.qps.get(qpn))
            .ok_or(FabricError::InvalidHandle { kind: "queue pair" })
    }

    fn record_mut(&mut self, qp: QpHandle) -> Option<&mut QpRecord> {
        self.qp_nums.get(&qp).and_then(|qpn| self.qps.get_mut(qpn))
    }

    /// Checks a send the wrapped provider will not see: exactly what the
    /// provider would refuse, plus the send queue room that the wrapper's own
    /// completions take. Returns the payload length.
    fn check_faulty_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        let len = self.inner.check_send(qp, wr)?;
        let record = self.record(qp)?;
        if wr.flags.contains(SendFlags::SIGNALED) && record.outstanding >= record.cap.max_send_wr {
            return Err(FabricError::QueueFull {
                queue: "send queue",
                capacity: record.cap.max_send_wr as usize,
            });
        }
        Ok(len)
    }

    /// Copies the bytes of a checked send into `scratch_bytes`.
    fn gather_into_scratch(&mut self, wr: &SendWr<'_>) {
        let mut bytes = mem::take(&mut self.scratch_bytes);
        bytes.clear();
        for gather in wr.sg_list {
            match gather {
                Gather::Registered(sge) => {
                    // An inline send is not checked against its key, as in
                    // verbs; a key that names nothing contributes nothing.
                    let range = self
                        .mrs
                        .get(&sge.lkey)
                        .and_then(|handle| self.inner.mr_bytes(*handle).ok())
                        .and_then(|b| b.get(sge.offset..sge.offset.saturating_add(sge.len)));
                    bytes.extend_from_slice(range.unwrap_or_default());
                }
                Gather::User { data, .. } => bytes.extend_from_slice(data),
            }
        }
        self.scratch_bytes = bytes;
    }

    /// Copies a checked send into a wrapper-owned registration and holds
    /// it until the next send on the queue pair leaves.
    fn hold(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<()> {
        let pd = self.record(qp)?.pd;
        self.gather_into_scratch(wr);
        let bounce = if self.scratch_bytes.is_empty() {
            None
        } else {
            let mr = self.inner.reg_mr(pd, self.scratch_bytes.len())?;
            match self.inner.mr_bytes_mut(mr.handle) {
                Ok(dst) => dst.copy_from_slice(&self.scratch_bytes),
                Err(error) => {
                    // The copy is useless now; the original error says more
                    // than a failure to free it would.
                    let _ = self.inner.dereg_mr(mr.handle);
                    return Err(error);
                }
            }
            Some(mr)
        };
        let held = Held {
            wr_id: wr.wr_id,
            ah: wr.ah,
            remote_qpn: wr.remote_qpn,
            remote_qkey: wr.remote_qkey,
            imm: wr.imm,
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            bounce,
        };
        if let Some(record) = self.record_mut(qp) {
            record.held.push(held);
        }
        Ok(())
    }

    /// Posts the held sends of a queue pair, unsignaled (their completions
    /// were produced when they were held), and frees their copies.
    fn release_held(&mut self, qpn: u32) {
        let Some(record) = self.qps.get_mut(&qpn) else {
            return;
        };
        let qp = record.handle;
        for held in mem::take(&mut record.held) {
            let sge = held.bounce.map(|mr| Sge {
                lkey: mr.lkey,
                offset: 0,
                len: mr.len,
            });
            let sg = sge.map(Gather::Registered);
            let wr = SendWr {
                wr_id: held.wr_id,
                sg_list: sg.as_slice(),
                ah: held.ah,
                remote_qpn: held.remote_qpn,
                remote_qkey: held.remote_qkey,
                imm: held.imm,
                flags: if held.solicited {
                    SendFlags::SOLICITED
                } else {
                    SendFlags::NONE
                },
            };
            if let Err(error) = self.inner.post_send(qp, &[wr]) {
                tracing::debug!(qpn, %error, "faulty: a held send was refused when released");
                self.stats.release_failures += 1;
            }
            if let Some(mr) = held.bounce {
                // The wrapped provider has consumed the bytes once
                // post_send returns.
                if let Err(error) = self.inner.dereg_mr(mr.handle) {
                    tracing::debug!(%error, "faulty: could not free a held send's copy");
                }
            }
        }
    }

    /// Records the completion of a send the wrapper took over.
    fn complete_locally(&mut self, qp: QpHandle, wr: &SendWr<'_>, len: usize) {
        if !wr.flags.contains(SendFlags::SIGNALED) {
            return;
        }
        let Some(&qp_num) = self.qp_nums.get(&qp) else {
            return;
        };
        let Some(record) = self.qps.get_mut(&qp_num) else {
            return;
        };
        record.outstanding += 1;
        record.pending.push_back(Pending::Local(WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: len as u32,
            qp_num,
            src: None,
            imm: None,
        }));
    }

    /// Posts `wrs[start..end]` to the wrapped context as one batch, records
    /// the signaled ones it accepted, and then releases what was held
    /// before them.
    fn flush_run(
        &mut self,
        qp: QpHandle,
        wrs: &[SendWr<'_>],
        start: usize,
        end: usize,
    ) -> Result<(), PostError> {
        let Some(run) = wrs.get(start..end).filter(|run| !run.is_empty()) else {
            return Ok(());
        };
        let result = self.inner.post_send(qp, run);
        let accepted = match &result {
            Ok(()) => run.len(),
            Err(error) => error.posted,
        };
        if let Some(&qpn) = self.qp_nums.get(&qp) {
            if let Some(record) = self.qps.get_mut(&qpn) {
                for wr in &run[..accepted] {
                    if wr.flags.contains(SendFlags::SIGNALED) {
                        record.outstanding += 1;
                        record.pending.push_back(Pending::Inner);
                    }
                }
            }
            if accepted > 0 {
                self.release_held(qpn);
            }
        }
        result.map_err(|PostError { posted, error }| PostError {
            posted: start + posted,
            error,
        })
    }

    /// Moves a completion taken from the wrapped queue into `ready`,
    /// preceded by the wrapper's completions of sends posted before it.
    fn accept_inner(&mut self, cq: CqHandle, wc: WorkCompletion) {
        let Some(ready) = self.ready.get_mut(&cq) else {
            return;
        };
        if wc.opcode == WcOpcode::Send {
            if let Some(record) = self.qps.get_mut(&wc.qp_num) {
                while let Some(Pending::Local(local)) = record.pending.front() {
                    ready.push_back(*local);
                    record.pending.pop_front();
                }
                if matches!(record.pending.front(), Some(Pending::Inner)) {
                    record.pending.pop_front();
                }
            }
        }
        ready.push_back(wc);
    }

    /// Moves the wrapper's completions that no earlier send is waiting in
    /// front of into `ready`.
    fn promote_local(&mut self, cq: CqHandle) {
        let Some(ready) = self.ready.get_mut(&cq) else {
            return;
        };
        for record in self.qps.values_mut().filter(|r| r.send_cq == cq) {
            while let Some(Pending::Local(local)) = record.pending.front() {
                ready.push_back(*local);
                record.pending.pop_front();
            }
        }
    }
}

impl<C: Context> Context for FaultyContext<C> {
    fn check_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        self.check_faulty_send(qp, wr)
    }

    fn device(&self) -> &DeviceInfo {
        self.inner.device()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.inner.query_port(port)
    }

    fn alloc_pd(&mut self) -> Result<PdHandle> {
        self.inner.alloc_pd()
    }

    fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()> {
        self.inner.dealloc_pd(pd)
    }

    fn reg_mr(&mut self, pd: PdHandle, len: usize) -> Result<Mr> {
        let mr = self.inner.reg_mr(pd, len)?;
        self.mrs.insert(mr.lkey, mr.handle);
        self.mr_keys.insert(mr.handle, mr.lkey);
        Ok(mr)
    }

    fn reg_user_mr(&mut self, pd: PdHandle, region: &[u8]) -> Result<Mr> {
        let mr = self.inner.reg_user_mr(pd, region)?;
        self.mrs.insert(mr.lkey, mr.handle);
        self.mr_keys.insert(mr.handle, mr.lkey);
        Ok(mr)
    }

    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()> {
        self.inner.dereg_mr(mr)?;
        if let Some(lkey) = self.mr_keys.remove(&mr) {
            self.mrs.remove(&lkey);
        }
        Ok(())
    }

    fn mr_bytes(&self, mr: MrHandle) -> Result<&[u8]> {
        self.inner.mr_bytes(mr)
    }

    fn mr_bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8]> {
        self.inner.mr_bytes_mut(mr)
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqHandle> {
        let cq = self.inner.create_cq(depth)?;
        self.ready.insert(cq, VecDeque::new());
        Ok(cq)
    }

    fn destroy_cq(&mut self, cq: CqHandle) -> Result<()> {
        self.inner.destroy_cq(cq)?;
        self.ready.remove(&cq);
        Ok(())
    }

    fn create_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo> {
        let info = self.inner.create_qp(pd, attr)?;
        self.qps.insert(
            info.qp_num,
            QpRecord {
                handle: info.handle,
                pd,
                send_cq: attr.send_cq,
                cap: info.cap,
                max_msg_size: None,
                held: Vec::new(),
                pending: VecDeque::new(),
                outstanding: 0,
            },
        );
        self.qp_nums.insert(info.handle, info.qp_num);
        Ok(info)
    }

    fn modify_qp(&mut self, qp: QpHandle, transition: &QpTransition) -> Result<()> {
        self.inner.modify_qp(qp, transition)?;
        if let QpTransition::Init { port, .. } = transition {
            let max = self.inner.query_port(*port).ok().map(|p| p.max_msg_size);
            if let Some(record) = self.record_mut(qp) {
                record.max_msg_size = max;
            }
        }
        Ok(())
    }

    fn qp_state(&self, qp: QpHandle) -> Result<QpState> {
        self.inner.qp_state(qp)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        // Held sends have completed already, so they leave before the queue
        // pair goes, as sends already posted to an HCA would.
        if let Some(&qpn) = self.qp_nums.get(&qp) {
            self.release_held(qpn);
        }
        self.inner.destroy_qp(qp)?;
        if let Some(qpn) = self.qp_nums.remove(&qp) {
            self.qps.remove(&qpn);
            // As the wrapped provider does with its own queues, drop the
            // completions of the destroyed queue pair.
            for ready in self.ready.values_mut() {
                ready.retain(|wc| wc.qp_num != qpn);
            }
        }
        Ok(())
    }

    fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        self.inner.create_ah(pd, attr)
    }

    fn destroy_ah(&mut self, ah: AhHandle) -> Result<()> {
        self.inner.destroy_ah(ah)
    }

    fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.inner.post_recv(qp, wrs)
    }

    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        if !self.config.is_active() {
            return self.inner.post_send(qp, wrs);
        }
        // Requests that pass through are batched into runs, so the wrapped
        // provider still sees batches; a run ends at each request the
        // wrapper takes over.
        let mut run_start = 0;
        let mut run_signaled = 0;
        for (i, wr) in wrs.iter().enumerate() {
            let signaled = wr.flags.contains(SendFlags::SIGNALED);
            match self.fate() {
                fate @ (Fate::Pass | Fate::Duplicate) => {
                    // The wrapped queue does not see the sends the wrapper
                    // completed, so the room they take is checked here.
                    if signaled {
                        if let Ok(record) = self.record(qp) {
                            if record.outstanding + run_signaled >= record.cap.max_send_wr {
                                let capacity = record.cap.max_send_wr as usize;
                                self.flush_run(qp, wrs, run_start, i)?;
                                return Err(PostError {
                                    posted: i,
                                    error: FabricError::QueueFull {
                                        queue: "send queue",
                                        capacity,
                                    },
                                });
                            }
                        }
                        run_signaled += 1;
                    }
                    if fate == Fate::Duplicate {
                        self.flush_run(qp, wrs, run_start, i + 1)?;
                        (run_start, run_signaled) = (i + 1, 0);
                        let copy = SendWr {
                            flags: without_signaled(wr.flags),
                            ..*wr
                        };
                        match self.inner.post_send(qp, &[copy]) {
                            Ok(()) => self.stats.duplicated += 1,
                            Err(error) => {
                                tracing::debug!(%error, "faulty: duplicate refused");
                            }
                        }
                    }
                }
                fate @ (Fate::Drop | Fate::Reorder) => {
                    self.flush_run(qp, wrs, run_start, i)?;
                    (run_start, run_signaled) = (i + 1, 0);
                    let len = self
                        .check_faulty_send(qp, wr)
                        .map_err(|error| PostError { posted: i, error })?;
                    if fate == Fate::Drop {
                        self.stats.dropped += 1;
                    } else {
                        self.hold(qp, wr)
                            .map_err(|error| PostError { posted: i, error })?;
                        self.stats.reordered += 1;
                    }
                    self.complete_locally(qp, wr, len);
                }
            }
        }
        self.flush_run(qp, wrs, run_start, wrs.len())
    }

    fn poll_cq(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        // Without faults nothing is ever held or completed here.
        if !self.config.is_active() {
            return self.inner.poll_cq(cq, out);
        }
        self.flush_held();
        if !self.ready.contains_key(&cq) {
            return self.inner.poll_cq(cq, out);
        }
        self.promote_local(cq);
        let queued = self.ready.get(&cq).map_or(0, VecDeque::len);
        let want = out.len().saturating_sub(queued);
        if want > 0 {
            let mut buf = mem::take(&mut self.scratch_wc);
            buf.clear();
            buf.resize(want, WorkCompletion::EMPTY);
            let polled = self.inner.poll_cq(cq, &mut buf);
            if let Ok(n) = polled {
                for wc in &buf[..n] {
                    self.accept_inner(cq, *wc);
                }
            }
            self.scratch_wc = buf;
            polled?;
        }
        let Some(ready) = self.ready.get_mut(&cq) else {
            return Ok(0);
        };
        let mut written = 0;
        for slot in out.iter_mut() {
            let Some(wc) = ready.pop_front() else { break };
            if wc.opcode == WcOpcode::Send {
                if let Some(record) = self.qps.get_mut(&wc.qp_num) {
                    record.outstanding = record.outstanding.saturating_sub(1);
                }
            }
            *slot = wc;
            written += 1;
        }
        Ok(written)
    }

    /// The wrapped provider's channel. Completions this wrapper makes itself
    /// (dropped and held sends) do not make it ready.
    fn completion_channel(&mut self, cq: CqHandle) -> Result<Option<CompletionChannel>> {
        self.inner.completion_channel(cq)
    }

    fn now(&self) -> std::time::Duration {
        self.inner.now()
    }

    fn stats(&self) -> FabricStats {
        self.inner.stats()
    }

    fn resources(&self) -> ResourceCounts {
        let mut counts = self.inner.resources();
        let copies = self
            .qps
            .values()
            .flat_map(|qp| &qp.held)
            .filter(|held| held.bounce.is_some())
            .count();
        counts.mrs = counts.mrs.saturating_sub(copies);
        counts
    }
}

/// `flags` without [`SendFlags::SIGNALED`].
fn without_signaled(flags: SendFlags) -> SendFlags {
    [SendFlags::INLINE, SendFlags::SOLICITED]
        .into_iter()
        .filter(|f| flags.contains(*f))
        .fold(SendFlags::NONE, |acc, f| acc | f)
}
