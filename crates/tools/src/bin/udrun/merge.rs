//! One message for the same stderr message of many ranks (without
//! `--tag-output`).
//!
//! A rank's stderr reaches [`Errors`] as messages: what the rank wrote in
//! one burst (see [`crate::output`]), one or more whole lines. Each message
//! waits [`DEDUP_WINDOW`] before it is written; the same message from other
//! ranks within that time is written with it, once, every line prefixed
//! with the ranks that wrote it:
//!
//! ```text
//! [ranks 0-3] error: unrecognized subcommand 'osu_latency'
//! [ranks 0-3]
//! [ranks 0-3] Usage: udbench [OPTIONS] [COMMAND]
//! ```
//!
//! Messages are compared whole, never line by line: a multi-line message
//! stays together and in order, and is merged only with the same message.
//! A message only one rank wrote is written unchanged. Each rank's
//! messages keep their order, and udrun's own lines about the job
//! ([`Errors::say`]) come after the messages waiting when they are said.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// How long a rank's stderr message waits for the same message from other
/// ranks.
pub(crate) const DEDUP_WINDOW: Duration = Duration::from_millis(250);
/// How many bytes of stderr may wait; beyond, they are written at once by
/// the rank's own thread (which holds the rank back, as a full pipe would).
const PENDING_LIMIT: usize = 1 << 20;

/// The ranks' stderr messages waiting to be written: see the
/// [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Errors {
    pending: Mutex<Pending>,
    /// Signalled when a message is added or the flushing must end.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Pending {
    /// In the order they came; written in that order.
    entries: VecDeque<Entry>,
    /// The sequence number of `entries[0]`.
    first: u64,
    /// For each message, the sequence number of its newest entry.
    newest: HashMap<Vec<u8>, u64>,
    /// For each rank, the sequence number of its last entry.
    last: HashMap<u32, u64>,
    bytes: usize,
    /// Why udrun's stderr failed: nothing more is written.
    failed: Option<io::ErrorKind>,
    closed: bool,
}

#[derive(Debug)]
struct Entry {
    message: Vec<u8>,
    /// The ranks that wrote it; none for udrun's own line.
    ranks: Vec<u32>,
    due: Instant,
}

impl Errors {
    /// Starts the thread that writes messages once they are due.
    pub(crate) fn start() -> io::Result<Arc<Self>> {
        let errors = Arc::new(Self::default());
        let flusher = Arc::clone(&errors);
        thread::Builder::new()
            .name("stderr".into())
            .stack_size(128 * 1024)
            .spawn(move || flusher.run())?;
        Ok(errors)
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds one message of `rank`: whole lines, each ending in a newline.
    ///
    /// # Errors
    /// udrun's stderr has failed (with this error's kind): nothing more
    /// can be written.
    pub(crate) fn add(&self, rank: u32, message: &[u8]) -> io::Result<()> {
        if message.is_empty() {
            return Ok(());
        }
        let mut p = self.lock();
        if let Some(kind) = p.failed {
            return Err(kind.into());
        }
        let last = p.last.get(&rank).copied();
        // Only into an entry after the rank's own last one, so that its
        // messages keep their order.
        let merge = p
            .newest
            .get(message)
            .copied()
            .filter(|&seq| seq >= p.first && last.is_none_or(|l| l < seq));
        let seq = match merge {
            Some(seq) => {
                let at = usize::try_from(seq - p.first).unwrap_or(usize::MAX);
                if let Some(entry) = p.entries.get_mut(at) {
                    entry.ranks.push(rank);
                }
                seq
            }
            None => {
                let seq = p.push(message.to_vec(), vec![rank], Instant::now() + DEDUP_WINDOW);
                p.newest.insert(message.to_vec(), seq);
                seq
            }
        };
        p.last.insert(rank, seq);
        self.written(&mut p);
        p.failed.map_or(Ok(()), |kind| Err(kind.into()))
    }

    /// Queues one of udrun's own lines (`udrun: ` is put before it): it is
    /// written right after the messages that wait now, and merged with
    /// nothing. A failure to write it is ignored: there is nowhere left to
    /// report it.
    pub(crate) fn say(&self, line: &str) {
        let mut p = self.lock();
        if p.failed.is_none() {
            p.push(
                format!("udrun: {line}\n").into_bytes(),
                Vec::new(),
                Instant::now(),
            );
            self.written(&mut p);
        }
    }

    /// Writes what is due at once when too much waits or the writing thread
    /// has stopped; else wakes that thread.
    fn written(&self, p: &mut Pending) {
        if p.bytes > PENDING_LIMIT || p.closed {
            p.write_due(None);
        } else {
            self.changed.notify_one();
        }
    }

    fn run(&self) {
        let mut p = self.lock();
        loop {
            let now = Instant::now();
            p.write_due(Some(now));
            if p.closed {
                return;
            }
            p = match p.entries.front().map(|e| e.due) {
                Some(due) => {
                    let wait = due.saturating_duration_since(now);
                    self.changed
                        .wait_timeout(p, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self.changed.wait(p).unwrap_or_else(PoisonError::into_inner),
            };
        }
    }

    /// Writes every waiting message now and stops the writing thread
    /// (messages added later are written at once).
    pub(crate) fn flush(&self) {
        let mut p = self.lock();
        p.write_due(None);
        p.closed = true;
        self.changed.notify_all();
    }
}

impl Pending {
    /// Appends an entry; returns its sequence number.
    fn push(&mut self, message: Vec<u8>, ranks: Vec<u32>, due: Instant) -> u64 {
        let seq = self.first + self.entries.len() as u64;
        self.bytes += message.len();
        self.entries.push_back(Entry {
            message,
            ranks,
            due,
        });
        seq
    }

    /// Writes the entries due by `now` (all of them with `None`), in order:
    /// an entry waits for those before it, even if it is due earlier.
    fn write_due(&mut self, now: Option<Instant>) {
        let mut out = Vec::new();
        while let Some(entry) = self.entries.front() {
            if now.is_some_and(|now| entry.due > now) {
                break;
            }
            let Some(entry) = self.entries.pop_front() else {
                break;
            };
            let seq = self.first;
            self.first += 1;
            self.bytes -= entry.message.len();
            if self.newest.get(&entry.message) == Some(&seq) {
                self.newest.remove(&entry.message);
            }
            entry.render(&mut out);
        }
        if self.entries.is_empty() {
            self.last.clear();
        }
        if out.is_empty() || self.failed.is_some() {
            return;
        }
        if let Err(err) = io::stderr().lock().write_all(&out) {
            self.failed = Some(err.kind());
        }
    }
}

impl Entry {
    /// Appends the entry as written: unchanged from one rank (or udrun),
    /// else every line prefixed with the ranks, each ending in a newline.
    fn render(&self, out: &mut Vec<u8>) {
        if self.ranks.len() < 2 {
            out.extend_from_slice(&self.message);
            return;
        }
        let prefix = format!("[ranks {}]", rank_list(&self.ranks));
        for line in self.message.split_inclusive(|&b| b == b'\n') {
            out.extend_from_slice(prefix.as_bytes());
            // No space at the end of an empty line.
            if line != b"\n" {
                out.push(b' ');
            }
            out.extend_from_slice(line);
            if !line.ends_with(b"\n") {
                out.push(b'\n');
            }
        }
    }
}

/// "0-3,5,7-8" for ranks 0, 1, 2, 3, 5, 7, 8 (in any order).
fn rank_list(ranks: &[u32]) -> String {
    let mut ranks = ranks.to_vec();
    ranks.sort_unstable();
    ranks.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end = ranks[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries waiting: each message with its ranks.
    fn waiting(errors: &Errors) -> Vec<(String, Vec<u32>)> {
        errors
            .lock()
            .entries
            .iter()
            .map(|e| (String::from_utf8_lossy(&e.message).into(), e.ranks.clone()))
            .collect()
    }

    fn rendered(errors: &Errors) -> String {
        let mut out = Vec::new();
        for entry in &errors.lock().entries {
            entry.render(&mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn rank_lists() {
        assert_eq!(rank_list(&[3, 0, 1, 2, 5, 8, 7]), "0-3,5,7-8");
        assert_eq!(rank_list(&[4]), "4");
    }

    #[test]
    fn identical_messages_of_several_ranks_merge_in_order() {
        let errors = Errors::default();
        errors.add(0, b"same\n").unwrap();
        errors.add(0, b"mine\n").unwrap();
        errors.add(1, b"same\n").unwrap();
        errors.add(2, b"same\n").unwrap();
        // Rank 0 again: a new entry, after "mine".
        errors.add(0, b"same\n").unwrap();
        let got = waiting(&errors);
        assert_eq!(
            got,
            [
                ("same\n".to_owned(), vec![0, 1, 2]),
                ("mine\n".to_owned(), vec![0]),
                ("same\n".to_owned(), vec![0]),
            ]
        );
        assert_eq!(rendered(&errors), "[ranks 0-2] same\nmine\nsame\n");
    }

    #[test]
    fn a_multi_line_message_merges_only_whole_and_stays_together() {
        let usage = b"error: no\n\n  tip: yes\n\nUsage: x\n";
        let errors = Errors::default();
        errors.add(0, usage).unwrap();
        errors.add(1, usage).unwrap();
        // A line of it alone is another message.
        errors.add(0, b"Usage: x\n").unwrap();
        assert_eq!(
            rendered(&errors),
            "[ranks 0-1] error: no\n[ranks 0-1]\n[ranks 0-1]   tip: yes\n\
             [ranks 0-1]\n[ranks 0-1] Usage: x\nUsage: x\n"
        );
    }

    #[test]
    fn udruns_lines_follow_what_waits_and_merge_with_nothing() {
        let errors = Errors::default();
        errors.add(0, b"bad value\n").unwrap();
        errors.say("rank 0 (pid 5) exited with code 1");
        errors.add(1, b"bad value\n").unwrap();
        errors
            .add(1, b"udrun: rank 0 (pid 5) exited with code 1\n")
            .unwrap();
        assert_eq!(
            rendered(&errors),
            "[ranks 0-1] bad value\nudrun: rank 0 (pid 5) exited with code 1\n\
             udrun: rank 0 (pid 5) exited with code 1\n"
        );
    }
}
