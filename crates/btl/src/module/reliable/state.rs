//! The reliable part of a module: the sans-IO reliability state, how
//! datagrams are protected, the acknowledgement buffers, the senders not
//! known yet and the messages being reassembled.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use udbtl_fabric::{DeviceInfo, Mr, MrHandle, Sge};
use udbtl_reliability::{Config, ConfigError, Instant, Reliability};
use udbtl_wire::SeqNum;
use udbtl_wire::seal::TAG_LEN;

use super::super::delivery::Held;
use super::super::integrity::Integrity;
use super::super::limits::{FRAG_ALIGN, HEADER_MAX, round_up};
use super::super::messages::Reassembly;
use super::super::transmit::POST_BATCH;
use crate::frag::Descriptor;
use crate::params::Params;

/// Registered buffers for acknowledgement-only datagrams, used in turn.
const ACK_SLOTS: usize = 64;
/// Bytes of one acknowledgement buffer.
const ACK_LEN: usize = HEADER_MAX;

/// The ring of registered buffers a reliable module sends from besides its
/// fragments: acknowledgement-only datagrams; on a module that seals, the
/// data datagrams it cannot seal where they are (every one it encrypts,
/// into a seal buffer, since the fragment keeps its payload in clear for a
/// resend under a new packet number); and on a device that reads a send's
/// bytes after `post_send` returns, every resend (whose first post it may
/// not have read yet, so its fragment must not be written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::module) struct RingLayout {
    /// Seal buffers: none on a module that does not seal; else more than
    /// the signaled sends that can be outstanding (`sd_num`) and a batch,
    /// so that a buffer is written again only after its datagram left.
    seal_slots: usize,
    /// Bytes of one seal buffer: the longest datagram and a tag (the
    /// scratch of `seal::encrypt_into`).
    seal_len: usize,
    /// Whether resends go from a seal buffer: the device reads a send's
    /// bytes after `post_send` returns
    /// ([`DeviceInfo::sends_read_at_post`](udbtl_fabric::DeviceInfo::sends_read_at_post)).
    resends_copied: bool,
}

impl RingLayout {
    pub(in crate::module) fn new(
        params: &Params,
        max_datagram: usize,
        device: &DeviceInfo,
    ) -> Self {
        let resends_copied = !device.sends_read_at_post;
        let seal_slots = if params.protection().is_some() || resends_copied {
            params.sd_num as usize + POST_BATCH
        } else {
            0
        };
        Self {
            seal_slots,
            seal_len: round_up(max_datagram + TAG_LEN, FRAG_ALIGN),
            resends_copied,
        }
    }

    /// Bytes of the ring's registration.
    pub(in crate::module) const fn bytes(&self) -> usize {
        ACK_SLOTS * ACK_LEN + self.seal_slots * self.seal_len
    }
}

/// The reliable part of a module.
#[derive(Debug)]
pub(in crate::module) struct Reliable {
    pub(in crate::module) core: Reliability<Descriptor, Held>,
    /// How datagrams are protected.
    pub(in crate::module) integrity: Integrity,
    /// Registered buffers for acknowledgement-only datagrams, used in turn:
    /// such a datagram is unsignaled, so it needs no fragment and no credit.
    ack_ring: Mr,
    ack_next: usize,
    ring: RingLayout,
    seal_next: usize,
    /// Senders not known yet, by process id (see `take_unknown_peers`).
    pub(super) unknown_peers: Vec<u32>,
    /// Whether a known peer's datagram was refused for being sealed less
    /// than this module seals, and that was said (once).
    pub(super) warned_protection: bool,
    pub(in crate::module) reassembly: Reassembly,
    /// When the engine last ran (progress or helper), to notice that the
    /// process was stopped.
    pub(super) last_run: Option<Instant>,
    /// Published in the modex: with a peer's, where the streams between
    /// the two start (`modex::stream_start`), unless `rel_first_seq` sets
    /// one start for all (`core`'s `initial_seq`, and this is `true`).
    pub(in crate::module) stream_nonce: u32,
    /// Whether `rel_first_seq` fixes where every stream starts.
    pub(in crate::module) fixed_stream_start: bool,
}

impl Reliable {
    /// The reliable part of a module whose datagrams carry up to `datagram`
    /// payload bytes.
    pub(in crate::module) fn new(
        params: &Params,
        datagram: usize,
        (ack_ring, ring): (Mr, RingLayout),
        integrity: Integrity,
        stream_nonce: u32,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            core: reliability_state(params, datagram)?,
            integrity,
            ack_ring,
            ack_next: 0,
            ring,
            seal_next: 0,
            unknown_peers: Vec::new(),
            warned_protection: false,
            reassembly: Reassembly::default(),
            last_run: None,
            stream_nonce,
            fixed_stream_start: params.rel_first_seq.is_some(),
        })
    }

    /// Peers with a multi-datagram message in progress.
    pub(in crate::module) fn messages_in_progress(&self) -> usize {
        self.reassembly.in_progress()
    }

    pub(in crate::module) const fn ack_ring_handle(&self) -> MrHandle {
        self.ack_ring.handle
    }

    /// The next acknowledgement buffer: its registration and where in it.
    pub(in crate::module) fn next_ack_slot(&mut self) -> (MrHandle, Sge) {
        let offset = (self.ack_next % ACK_SLOTS) * ACK_LEN;
        self.ack_next = self.ack_next.wrapping_add(1);
        let slot = Sge {
            lkey: self.ack_ring.lkey,
            offset,
            len: ACK_LEN,
        };
        (self.ack_ring.handle, slot)
    }

    /// Whether a resend goes from a seal buffer (see [`RingLayout`]).
    pub(in crate::module) const fn resends_copied(&self) -> bool {
        self.ring.resends_copied
    }

    /// The next seal buffer, `len` bytes long: its registration and where
    /// in it; `None` on a module that does not seal, or for a datagram
    /// longer than the longest.
    pub(in crate::module) fn next_seal_slot(&mut self, len: usize) -> Option<(MrHandle, Sge)> {
        if self.ring.seal_slots == 0 || len > self.ring.seal_len {
            return None;
        }
        let index = self.seal_next % self.ring.seal_slots;
        self.seal_next = self.seal_next.wrapping_add(1);
        let slot = Sge {
            lkey: self.ack_ring.lkey,
            offset: ACK_SLOTS * ACK_LEN + index * self.ring.seal_len,
            len,
        };
        Some((self.ack_ring.handle, slot))
    }
}

/// The reliability state the parameters ask for.
fn reliability_state(
    params: &Params,
    datagram: usize,
) -> Result<Reliability<Descriptor, Held>, ConfigError> {
    let window = match params.rel_window {
        0 => default_window(datagram),
        asked => u16::try_from(asked).unwrap_or(udbtl_reliability::MAX_WINDOW),
    };
    // A lost peer is reported within one RTO of the timeout; keep the RTO
    // well under it, as UCX does (a third).
    let rto_max = Duration::from_millis(u64::from(params.peer_timeout) / 3)
        .clamp(Duration::from_millis(3), Duration::from_secs(2));
    let config = Config {
        window,
        initial_cwnd: window.min(16),
        peer_timeout: Duration::from_millis(u64::from(params.peer_timeout)),
        rto_max,
        rto_min: Duration::from_micros(u64::from(params.rto_min)).min(rto_max),
        rto_initial: Config::default().rto_initial.min(rto_max),
        keepalive: params.keepalive,
        // Authenticated datagrams can still be replayed: only news may keep
        // a peer alive.
        strict_liveness: params.protection().is_some(),
        initial_seq: SeqNum(params.rel_first_seq.unwrap_or(0)),
        ..Config::default()
    };
    Reliability::new(config)
}

/// The window `rel_window = 0` picks: about 1 MiB of datagrams in flight,
/// so that a stream of MTU-sized datagrams is not held to 64 per round trip
/// while 64 KiB datagrams keep to the socket buffers' size.
fn default_window(datagram: usize) -> u16 {
    const IN_FLIGHT: usize = 1 << 20;
    let datagrams = IN_FLIGHT / datagram.max(1);
    datagrams.clamp(64, usize::from(udbtl_reliability::MAX_WINDOW)) as u16
}

/// A random id for this process, for modules whose caller does not name the
/// process (see `Module::set_process_id`): unique only with high
/// probability.
pub(in crate::module) fn random_process_id() -> u32 {
    // RandomState is seeded from the OS's randomness once per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish() as u32
}
