//! The module's counters and its dump for humans (`btl_dump`).

use std::fmt;

use udbtl_fabric::{Context, QpAddr};

use super::Engine;
use super::transmit::BatchOutcome;

/// Counters of one module.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModuleStats {
    /// Messages (descriptors) the caller sent, however many datagrams
    /// carried them.
    pub messages_sent: u64,
    /// Sends posted to the fabric.
    pub sends_posted: u64,
    /// Send completions processed.
    pub sends_completed: u64,
    /// Sends that failed (post refused from the queue, an error completion,
    /// or a lost peer).
    pub send_errors: u64,
    /// Sends that had to wait for a send credit.
    pub sends_queued: u64,
    /// Datagrams delivered to a tag callback.
    pub recvs_delivered: u64,
    /// Receives dropped: BTL header malformed.
    pub recv_malformed: u64,
    /// Receives dropped: job key of another job.
    pub recv_bad_job_key: u64,
    /// Receives dropped: no callback for the tag.
    pub recv_no_callback: u64,
    /// Receive completions with an error status (buffer reposted).
    pub recv_errors: u64,
    /// Deepest the queue of sends waiting for a credit has been.
    pub pending_high_water: usize,
    /// Reliable receives dropped: checksum mismatch.
    pub recv_bad_checksum: u64,
    /// Reliable receives dropped by a module that seals: not sealed, or
    /// sealed less than it seals, or a tag that does not verify (a forgery,
    /// corruption, or a peer started without `auth`); by one that does
    /// not: a seal it cannot check.
    pub recv_unauthenticated: u64,
    /// Sealed receives dropped before their tag was checked: their packet
    /// number was taken before or fell behind the replay window (a replay,
    /// or a forgery that claims an old number).
    pub recv_replayed: u64,
    /// Reliable receives dropped: from no known endpoint, or from a process
    /// that reused a known endpoint's address.
    pub recv_unknown_peer: u64,
    /// Reliable sends the fabric refused; retransmitted like a loss.
    pub transmit_failures: u64,
    /// Messages reassembled from several datagrams.
    pub messages_reassembled: u64,
    /// Fragments from the caller's memory longer than one datagram, sent as
    /// a train of datagrams.
    pub trains_sent: u64,
    /// Datagrams of those trains after the first.
    pub train_cars_sent: u64,
    /// Pieces of multi-datagram messages dropped: no message was in progress
    /// (its sender gave up on it), or it grew past the largest message.
    pub recv_orphan_pieces: u64,
    /// Messages in progress dropped because their sender gave up on them.
    pub messages_aborted: u64,
    /// Small messages sent inside the datagram of an earlier message to the
    /// same peer (the `coalesce` parameter), instead of in their own.
    pub messages_coalesced: u64,
    /// Remote reads this module asked for.
    pub reads_started: u64,
    /// Read requests served with bytes of a registered region.
    pub reads_served: u64,
    /// Read requests refused: no registered region holds the range, or it
    /// is too long.
    pub reads_refused: u64,
    /// Read requests dropped: their peer had more waiting than a reader
    /// ever keeps out.
    pub read_requests_dropped: u64,
}

impl ModuleStats {
    /// Counts what became of a posted batch.
    pub(super) fn note_batch(&mut self, outcome: BatchOutcome) {
        self.sends_posted += outcome.posted_signaled as u64;
        self.transmit_failures += outcome.refused as u64;
    }
}

impl<C: Context> fmt::Display for Engine<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        let rc = self.rcache.stats();
        let fabric = self.ctx.stats();
        writeln!(
            f,
            "module {}:{} ({})",
            self.device, self.port.port_num, self.port.link_layer
        )?;
        writeln!(
            f,
            "  address            {}",
            QpAddr {
                node: self.port.addr,
                qpn: self.qps[0].qp_num
            }
        )?;
        writeln!(
            f,
            "  limits             eager {} max_send {} alloc {} frag {} rndv_eager {} inline {}",
            self.limits.eager_limit,
            self.limits.max_send_size,
            self.limits.alloc_limit,
            self.limits.frag_limit,
            self.limits.rndv_eager_limit,
            self.limits.inline_max
        )?;
        writeln!(
            f,
            "  send credits       {} free, {} waiting (high water {})",
            self.tx.sends.credits(),
            self.tx.sends.len(),
            self.tx.sends.high_water
        )?;
        for (name, pool) in [
            ("send frags", &self.frags.send),
            ("user frags", &self.frags.user),
        ] {
            writeln!(
                f,
                "  {name:<18} {} in use of {} (max {}, high water {})",
                pool.in_use(),
                pool.len(),
                pool.max(),
                pool.high_water
            )?;
        }
        let (made, max) = self.frags.bounce.made();
        if max > 0 {
            writeln!(
                f,
                "  bounce buffers     {} in use of {made} (max {max}) x {} bytes",
                self.frags.bounce.in_use(),
                self.frags.bounce.size()
            )?;
        }
        writeln!(
            f,
            "  receive buffers    {} x {} bytes",
            self.recv.count, self.recv.stride
        )?;
        writeln!(f, "  endpoints          {}", self.endpoints.len())?;
        writeln!(
            f,
            "  sends              posted {} completed {} queued {} errors {}",
            s.sends_posted, s.sends_completed, s.sends_queued, s.send_errors
        )?;
        writeln!(
            f,
            "  receives           delivered {} malformed {} bad job key {} no callback {} errors {}",
            s.recvs_delivered,
            s.recv_malformed,
            s.recv_bad_job_key,
            s.recv_no_callback,
            s.recv_errors
        )?;
        writeln!(
            f,
            "  registration cache {} entries, {} bytes, hits {} misses {} evictions {}",
            rc.entries, rc.bytes, rc.hits, rc.misses, rc.evictions
        )?;
        if let Some(reliable) = self.path.reliable() {
            let r = reliable.core.stats();
            writeln!(
                f,
                "  reliability        sent {} retransmitted {} (lost {}, tail probes {}, timeouts {}; spurious {}) acks sent {}",
                r.sent,
                r.retransmitted,
                r.fast_retransmits,
                r.tail_probes,
                r.timeouts,
                r.spurious_retransmits,
                r.acks_sent
            )?;
            writeln!(
                f,
                "                     received {} duplicates dropped {} out-of-order buffered {} \
                 out-of-window {} peers lost {}",
                r.received, r.duplicates, r.out_of_order, r.out_of_window, r.peers_lost
            )?;
            writeln!(
                f,
                "                     unacceptable acknowledgements {} resets {} \
                 (challenged {})",
                r.unacceptable_acks, r.unacceptable_resets, r.challenge_acks
            )?;
            writeln!(
                f,
                "                     integrity {} bad checksum {} unauthenticated {} \
                 replayed {} unknown peer {} unacknowledged {}",
                reliable.integrity.name(),
                s.recv_bad_checksum,
                s.recv_unauthenticated,
                s.recv_replayed,
                s.recv_unknown_peer,
                self.unacknowledged()
            )?;
            writeln!(
                f,
                "                     trains sent {} ({} more datagrams) messages reassembled {} \
                 aborted {} orphan pieces {} in progress {}",
                s.trains_sent,
                s.train_cars_sent,
                s.messages_reassembled,
                s.messages_aborted,
                s.recv_orphan_pieces,
                reliable.messages_in_progress()
            )?;
            writeln!(
                f,
                "                     messages coalesced {} (coalesce {})",
                s.messages_coalesced,
                if self.coalescer.enabled() {
                    "on"
                } else {
                    "off"
                }
            )?;
            writeln!(
                f,
                "                     reads started {} served {} refused {} requests dropped {}",
                s.reads_started, s.reads_served, s.reads_refused, s.read_requests_dropped
            )?;
            let rtos: Vec<std::time::Duration> = self
                .endpoints
                .ids()
                .filter_map(|id| reliable.core.rto(udbtl_reliability::PeerId(id.0)))
                .collect();
            if let (Some(min), Some(max)) = (rtos.iter().min(), rtos.iter().max()) {
                writeln!(
                    f,
                    "                     rto {min:?} to {max:?} over {} peers",
                    rtos.len()
                )?;
            }
        }
        write!(
            f,
            "  fabric             tx {} ({} GSO trains, {} in pieces; refused by the kernel {}) rx {} ({} GRO trains, {} in place) dropped: socket full {} no buffer {} bad qkey {} malformed {} too long {} missing a piece {}",
            fabric.tx_datagrams,
            fabric.tx_gso_trains,
            fabric.tx_segmented,
            fabric.tx_kernel_drops,
            fabric.rx_datagrams,
            fabric.rx_gro_trains,
            fabric.rx_in_place,
            fabric.rx_kernel_drops,
            fabric.rx_no_buffer,
            fabric.rx_bad_qkey,
            fabric.rx_malformed,
            fabric.rx_too_long,
            fabric.rx_incomplete,
        )
    }
}
