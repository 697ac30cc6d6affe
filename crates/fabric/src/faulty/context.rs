//! [`FaultyContext`]: the state the [`faulty`](super) wrapper keeps per
//! context (the caller's registrations, its queue pairs with their held
//! sends and pending completions, completions ready per queue), the
//! [`Context`] implementation that passes verbs through and applies a fate
//! to each send, and the merging of the wrapper's own completions with the
//! wrapped queue's, in posting order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::mem;

use super::fate::Fate;
use super::held::{Held, without_signaled};
use super::{FaultConfig, FaultConfigError, FaultStats};
use crate::types::*;
use crate::{CompletionChannel, Context, FabricError, PostError, Result};

/// One signaled send whose completion the caller has not polled, in
/// posting order.
#[derive(Debug)]
pub(super) enum Pending {
    /// Will come from the wrapped completion queue.
    Inner,
    /// Produced by the wrapper (a dropped or held send).
    Local(WorkCompletion),
}

#[derive(Debug)]
pub(super) struct QpRecord {
    pub(super) handle: QpHandle,
    pub(super) pd: PdHandle,
    pub(super) send_cq: CqHandle,
    pub(super) cap: QpCap,
    /// Set when the queue pair is bound to a port.
    pub(super) max_msg_size: Option<usize>,
    pub(super) held: Vec<Held>,
    pub(super) pending: VecDeque<Pending>,
    /// Signaled sends not yet returned by `poll_cq`.
    pub(super) outstanding: u32,
}

/// A context that injects send-side faults into the context it wraps; see
/// the [module documentation](super).
#[derive(Debug)]
pub struct FaultyContext<C> {
    pub(super) inner: C,
    pub(super) config: FaultConfig,
    pub(super) rng: fastrand::Rng,
    pub(super) stats: FaultStats,
    /// The caller's registrations by key, to read the bytes of a send the
    /// wrapper holds back.
    pub(super) mrs: HashMap<LKey, MrHandle>,
    pub(super) mr_keys: HashMap<MrHandle, LKey>,
    /// Queue pairs by number; ordered so that polling visits them in a
    /// reproducible order.
    pub(super) qps: BTreeMap<u32, QpRecord>,
    pub(super) qp_nums: HashMap<QpHandle, u32>,
    /// Completions taken from the wrapped queue (or produced here) and not
    /// yet returned, per completion queue.
    pub(super) ready: HashMap<CqHandle, VecDeque<WorkCompletion>>,
    pub(super) scratch_wc: Vec<WorkCompletion>,
    pub(super) scratch_bytes: Vec<u8>,
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

    pub(super) fn new(inner: C, config: FaultConfig, seed: u64) -> Self {
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

    pub(super) fn record(&self, qp: QpHandle) -> Result<&QpRecord> {
        self.qp_nums
            .get(&qp)
            .and_then(|qpn| self.qps.get(qpn))
            .ok_or(FabricError::InvalidHandle { kind: "queue pair" })
    }

    pub(super) fn record_mut(&mut self, qp: QpHandle) -> Option<&mut QpRecord> {
        self.qp_nums.get(&qp).and_then(|qpn| self.qps.get_mut(qpn))
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

    fn mr_bytes_pair(&mut self, from: MrHandle, to: MrHandle) -> Result<(&[u8], &mut [u8])> {
        self.inner.mr_bytes_pair(from, to)
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
            match Fate::from_draw(&self.config, self.rng.f64()) {
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
