//! What the PMI server's events do to the job: who reached PMI, who
//! finalized, aborted or broke the protocol, and the refused PMI_PORT
//! connections, named and counted.

use std::time::Instant;

use udbtl_pmi::{ServerEvent, ServerStats};

use super::{Job, PMI_WAIT, REFUSALS_SHOWN};
use crate::events::{Status, abort_exit_code};
use crate::say;

impl Job {
    /// Handles one of the PMI server's events.
    pub(super) fn pmi(&mut self, event: ServerEvent) {
        // A rank whose spawn failed was served too: its events do not count.
        let spawned = self.ranks.len();
        let rank_of = |rank: u32| ((rank as usize) < spawned).then_some(rank);
        match event {
            ServerEvent::Connected { rank } => {
                if let Some(r) = rank_of(rank) {
                    self.ranks[r as usize].connected = true;
                    self.joined_pmi(r);
                }
            }
            ServerEvent::Finalized { rank } => {
                if let Some(r) = rank_of(rank) {
                    self.joined_pmi(r);
                    self.ranks[r as usize].finalized = true;
                    self.pmi_closed(r);
                }
            }
            ServerEvent::Aborted {
                rank,
                code,
                message,
            } => {
                if let Some(r) = rank_of(rank) {
                    let what = if message.is_empty() {
                        format!("called abort with code {code}")
                    } else {
                        format!("called abort with code {code}: {message}")
                    };
                    // The message ends the line: no "; killing the job".
                    self.fail_rank_quietly(r, abort_exit_code(code), &what);
                    self.pmi_closed(r);
                }
            }
            ServerEvent::Disconnected { rank, .. } => {
                if let Some(r) = rank_of(rank) {
                    if self.ranks[r as usize].spoke() {
                        self.joined_pmi(r);
                    }
                    self.ranks[r as usize].disconnected = true;
                    self.pmi_closed(r);
                    let rank = &self.ranks[r as usize];
                    if rank.exit.is_none() && rank.spoke() {
                        self.waits.push_back((Instant::now() + PMI_WAIT, r));
                    }
                }
            }
            ServerEvent::ProtocolError {
                rank: Some(rank),
                detail,
            } => {
                if let Some(r) = rank_of(rank) {
                    let prefix = format!("rank {r}: ");
                    let detail = detail.strip_prefix(&prefix).unwrap_or(&detail);
                    self.fail_rank(r, 1, &format!("broke the PMI protocol ({detail})"));
                    self.pmi_closed(r);
                }
            }
            ServerEvent::ProtocolError { rank: None, detail } => {
                // Anyone who can reach the port can cause these: name a
                // few, count the rest (see finish).
                self.refused += 1;
                if self.refused <= REFUSALS_SHOWN {
                    say(format_args!("ignored a PMI_PORT connection: {detail}"));
                }
            }
            ServerEvent::BarrierReleased { epoch: 1 } => {
                if let Some(start) = self.startup {
                    self.reported = true;
                    say(format_args!(
                        "{} ranks, first barrier after {:.1} ms",
                        self.size,
                        start.elapsed().as_secs_f64() * 1e3
                    ));
                }
            }
            _ => {}
        }
    }

    /// Rank `r` is known to use PMI. The first time a rank is, the ranks
    /// that already ended with status 0 without finalize are judged again
    /// (at once, or once their PMI connection has ended).
    pub(super) fn joined_pmi(&mut self, r: u32) {
        if self.joined.is_some() {
            return;
        }
        self.joined = Some(r);
        let now = Instant::now();
        let mut again = Vec::new();
        for (i, rank) in (0..).zip(&mut self.ranks) {
            if rank.exit == Some(Status::Code(0)) && !rank.finalized && !rank.judging {
                rank.judging = true;
                self.judging += 1;
                if rank.pmi_open || rank.spoke.is_none() {
                    self.waits.push_back((now + PMI_WAIT, i));
                } else {
                    again.push(i);
                }
            }
        }
        for i in again {
            self.judge(i);
        }
    }

    /// Rank `r`'s PMI connection has ended: judge its exit if it waits.
    fn pmi_closed(&mut self, r: u32) {
        let rank = &mut self.ranks[r as usize];
        rank.pmi_open = false;
        if rank.judging {
            self.judge(r);
        }
    }
}

/// The summary of refused PMI_PORT connections, if there were any: the
/// server's counts, and how many of them `shown` named one by one.
pub(super) fn refusals_summary(stats: &ServerStats, seen: u64) -> Option<String> {
    let parts = [
        (stats.handshake_failures, "failed the handshake"),
        (stats.claims_refused, "claimed a rank already connected"),
        (
            stats.connections_refused_over_cap,
            "came over the cap of handshakes at once",
        ),
    ];
    let total: u64 = parts.iter().map(|p| p.0).sum();
    if total == 0 {
        return None;
    }
    let detail: Vec<String> = parts
        .iter()
        .filter(|p| p.0 > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
    let shown = seen.min(REFUSALS_SHOWN);
    let not_shown = if total > shown {
        format!("; {} not shown above", total - shown)
    } else {
        String::new()
    };
    Some(format!(
        "refused {total} PMI_PORT connection{}: {}{not_shown}",
        if total == 1 { "" } else { "s" },
        detail.join(", ")
    ))
}
