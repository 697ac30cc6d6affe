//! The handle's diagnostic calls: limits, counters and the rest a tool or a
//! test reads.

use udbtl_fabric::{Context, PortAttr};

use super::Module;
use crate::module::{Limits, ModuleStats};
use crate::rcache::RegCacheStats;

impl<C: Context> Module<C> {
    /// Sizes this module works with.
    ///
    /// They may shrink once, when a peer whose port takes smaller datagrams
    /// is added (see [`add_procs`](Self::add_procs)).
    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    /// The port this module drives.
    pub const fn port(&self) -> &PortAttr {
        &self.port
    }

    /// The device name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Counters.
    pub fn stats(&self) -> ModuleStats {
        self.lock().stats
    }

    /// The reliability layer's counters (retransmissions, peers lost, ...);
    /// `None` when the module is unreliable.
    pub fn reliability_stats(&self) -> Option<udbtl_reliability::Stats> {
        self.lock().path.reliable().map(|r| *r.core.stats())
    }

    /// How the module protects its datagrams, in one word: `fabric` (the
    /// fabric checks them end to end), `crc32`, `sealed` (`auth` on) or
    /// `encrypted`; `none` on an unreliable module.
    pub fn integrity(&self) -> &'static str {
        self.lock()
            .path
            .reliable()
            .map_or("none", |r| r.integrity.word())
    }

    /// Heap bytes this module keeps per peer nothing was sent to or
    /// received from: its endpoint and index entry, and the reliability
    /// state's share
    /// ([`Reliability::bytes_per_idle_peer`](udbtl_reliability::Reliability::bytes_per_idle_peer));
    /// the fabric's address handle aside. Vectors grown past their length
    /// add to it (`tests/peer_memory.rs` measures the whole).
    pub fn bytes_per_idle_peer(&self) -> usize {
        self.bytes_per_peer(udbtl_reliability::Reliability::<(), ()>::bytes_per_idle_peer())
    }

    /// Heap bytes this module keeps per peer that was sent to or received
    /// from, as [`bytes_per_idle_peer`](Self::bytes_per_idle_peer) counts
    /// them, with the reliability state's
    /// ([`Reliability::bytes_per_active_peer`](udbtl_reliability::Reliability::bytes_per_active_peer)).
    /// Datagrams in flight take more, per datagram.
    pub fn bytes_per_active_peer(&self) -> usize {
        self.bytes_per_peer(udbtl_reliability::Reliability::<(), ()>::bytes_per_active_peer())
    }

    /// The endpoint's bytes, and `reliability` on a reliable module.
    fn bytes_per_peer(&self, reliability: usize) -> usize {
        let reliability = if self.lock().path.is_reliable() {
            reliability
        } else {
            0
        };
        crate::module::endpoints::Endpoints::bytes_per_endpoint() + reliability
    }

    /// The credit this module shares among the peers that send to it: its
    /// receive buffers beyond the reserve, and the most the active peers
    /// get together; `None` on an unreliable module.
    pub fn credit_shares(&self) -> Option<(usize, usize)> {
        let engine = self.lock();
        let (free, _) = engine.recv.credit_room(0, true);
        engine
            .path
            .reliable()
            .map(|r| (free, r.core.active_credit_max()))
    }

    /// Registration cache counters.
    pub fn rcache_stats(&self) -> RegCacheStats {
        self.lock().rcache.stats()
    }

    /// Runs `f` on the fabric context, for its counters, under the module's
    /// lock.
    pub fn with_context<R>(&self, f: impl FnOnce(&C) -> R) -> R {
        f(&self.lock().ctx)
    }

    /// Descriptors waiting for a send credit.
    pub fn pending_len(&self) -> usize {
        self.lock().tx.sends.len()
    }

    /// Send credits free.
    pub fn send_credits(&self) -> u32 {
        self.lock().tx.sends.credits()
    }

    /// Checkpoint/restart notification. There is no checkpoint support, so
    /// every state is accepted and nothing happens, as in the seed.
    pub fn ft_event(&mut self, state: i32) {
        tracing::debug!(state, "ft_event ignored: no checkpoint/restart support");
    }
}
