//! Forwarding a rank's stdout and stderr to udrun's, whole lines at a time.
//!
//! One thread per pipe reads what the rank writes and copies every complete
//! line to udrun's stdout (or stderr) while holding that stream's lock, so
//! lines of different ranks never mix. A partial line waits for its end (or
//! the end of the pipe). A line longer than [`MAX_LINE`] is passed on in
//! pieces: unchanged without `--tag-output`, each piece ended by a newline
//! and tagged with it. Once udrun's stream fails (`udrun ... | head`
//! closed it), the forwarding stops and the pipe is closed, so the rank gets
//! SIGPIPE (or EPIPE) as if it had written to the closed pipe itself.
//!
//! # One line for the same error from many ranks
//!
//! Without `--tag-output`, the ranks' stderr lines go through [`Errors`]:
//! each waits [`DEDUP_WINDOW`] before it is written, and the same line from
//! other ranks within that time is written with it, once, prefixed with
//! the ranks that wrote it: `[ranks 0-3] error: no such file`. A line only
//! one rank wrote is written unchanged. Each rank's lines keep their order;
//! stdout is not delayed. Under `--tag-output` every line is written, with
//! its rank, at once.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::events::Event;

/// The longest line kept whole; longer ones are cut.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Which of udrun's streams a pipe goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
}

/// How long a rank's stderr line waits for the same line from other ranks
/// (without `--tag-output`).
pub(crate) const DEDUP_WINDOW: Duration = Duration::from_millis(250);
/// How many bytes of stderr may wait; beyond, they are written at once by
/// the rank's own thread (which holds the rank back, as a full pipe would).
const PENDING_LIMIT: usize = 1 << 20;

/// Starts a thread that copies `source` to `sink` line by line, each line
/// prefixed with `[rank] ` when `tag` is set (else, for stderr, through
/// `errors` when given), and sends [`Event::OutputClosed`] once `source`
/// ends.
pub(crate) fn forward<R>(
    source: R,
    sink: Sink,
    rank: u32,
    tag: bool,
    errors: Option<Arc<Errors>>,
    done: Sender<Event>,
) -> io::Result<()>
where
    R: Read + Send + 'static,
{
    let name = match sink {
        Sink::Stdout => format!("out-{rank}"),
        Sink::Stderr => format!("err-{rank}"),
    };
    thread::Builder::new()
        .name(name)
        .stack_size(128 * 1024)
        .spawn(move || {
            match errors.filter(|_| sink == Sink::Stderr && !tag) {
                Some(errors) => pump(source, &mut ToErrors { errors, rank }, None),
                None => {
                    let tag = tag.then(|| format!("[{rank}] ").into_bytes());
                    pump(source, &mut Writer::new(sink), tag.as_deref());
                }
            }
            let _ = done.send(Event::OutputClosed);
        })
        .map(drop)
}

/// The ranks' stderr lines waiting to be written: see the
/// [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Errors {
    pending: Mutex<Pending>,
    /// Signalled when a line is added or the flushing must end.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Pending {
    /// In the order of their first line; their due times increase.
    entries: VecDeque<Entry>,
    /// The sequence number of `entries[0]`.
    first: u64,
    /// For each line text, the sequence number of its newest entry.
    newest: HashMap<Vec<u8>, u64>,
    /// For each rank, the sequence number of its last entry.
    last: HashMap<u32, u64>,
    bytes: usize,
    /// udrun's stderr failed: nothing more is written.
    failed: bool,
    closed: bool,
}

#[derive(Debug)]
struct Entry {
    line: Vec<u8>,
    ranks: Vec<u32>,
    due: Instant,
}

impl Errors {
    /// Starts the thread that writes lines once they are due.
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

    /// Adds one line (ending in a newline, unless it is a rank's last
    /// words). False once udrun's stderr has failed.
    fn add(&self, rank: u32, line: &[u8]) -> bool {
        let mut p = self.lock();
        if p.failed {
            return false;
        }
        let last = p.last.get(&rank).copied();
        let merge = p
            .newest
            .get(line)
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
                let seq = p.first + p.entries.len() as u64;
                p.entries.push_back(Entry {
                    line: line.to_vec(),
                    ranks: vec![rank],
                    due: Instant::now() + DEDUP_WINDOW,
                });
                p.newest.insert(line.to_vec(), seq);
                p.bytes += line.len();
                seq
            }
        };
        p.last.insert(rank, seq);
        if p.bytes > PENDING_LIMIT || p.closed {
            Self::write_due(&mut p, None);
        } else {
            self.changed.notify_one();
        }
        !p.failed
    }

    /// Writes the entries due by `now` (all of them with `None`).
    fn write_due(p: &mut Pending, now: Option<Instant>) {
        let mut out = Vec::new();
        while let Some(entry) = p.entries.front() {
            if now.is_some_and(|now| entry.due > now) {
                break;
            }
            let Some(entry) = p.entries.pop_front() else {
                break;
            };
            let seq = p.first;
            p.first += 1;
            p.bytes -= entry.line.len();
            if p.newest.get(&entry.line) == Some(&seq) {
                p.newest.remove(&entry.line);
            }
            if entry.ranks.len() > 1 {
                out.extend_from_slice(format!("[ranks {}] ", rank_list(&entry.ranks)).as_bytes());
                out.extend_from_slice(&entry.line);
                if !entry.line.ends_with(b"\n") {
                    out.push(b'\n');
                }
            } else {
                out.extend_from_slice(&entry.line);
            }
        }
        if p.entries.is_empty() {
            p.last.clear();
        }
        if !out.is_empty() && !p.failed && !Writer::new(Sink::Stderr).emit(&out) {
            p.failed = true;
        }
    }

    fn run(&self) {
        let mut p = self.lock();
        loop {
            let now = Instant::now();
            Self::write_due(&mut p, Some(now));
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

    /// Writes every waiting line now and stops the writing thread (lines
    /// added later are written at once).
    pub(crate) fn flush(&self) {
        let mut p = self.lock();
        Self::write_due(&mut p, None);
        p.closed = true;
        self.changed.notify_all();
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

/// Passes a rank's stderr lines to [`Errors`].
struct ToErrors {
    errors: Arc<Errors>,
    rank: u32,
}

impl Lines for ToErrors {
    fn emit(&mut self, batch: &[u8]) -> bool {
        let mut ok = true;
        for line in batch.split_inclusive(|&b| b == b'\n') {
            ok &= self.errors.add(self.rank, line);
        }
        ok
    }
}

/// Where whole lines go: one of udrun's standard streams, or (in tests) a
/// buffer.
trait Lines {
    /// Writes `batch`, which holds whole lines only (or a piece of an
    /// overlong one), in one go. False when nothing more can be written.
    fn emit(&mut self, batch: &[u8]) -> bool;
}

/// Writes to udrun's stdout or stderr under its lock.
struct Writer {
    sink: Sink,
}

impl Writer {
    fn new(sink: Sink) -> Self {
        Self { sink }
    }
}

impl Lines for Writer {
    fn emit(&mut self, batch: &[u8]) -> bool {
        if batch.is_empty() {
            return true;
        }
        let written = match self.sink {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(batch).and_then(|()| out.flush())
            }
            Sink::Stderr => io::stderr().lock().write_all(batch),
        };
        written.is_ok()
    }
}

/// Copies `source` to `out` until either ends (or fails): see the
/// [module docs](self).
fn pump<R: Read, L: Lines>(mut source: R, out: &mut L, tag: Option<&[u8]>) {
    let tag = tag.unwrap_or_default();
    let mut chunk = vec![0; MAX_LINE];
    // The line being read, not yet ended.
    let mut line: Vec<u8> = Vec::new();
    // Whole lines to write at once.
    let mut batch: Vec<u8> = Vec::new();
    loop {
        let n = match source.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut rest = &chunk[..n];
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            batch.extend_from_slice(tag);
            batch.append(&mut line);
            batch.extend_from_slice(&rest[..=end]);
            rest = &rest[end + 1..];
        }
        line.extend_from_slice(rest);
        if line.len() >= MAX_LINE {
            batch.extend_from_slice(tag);
            batch.append(&mut line);
            if !tag.is_empty() {
                batch.push(b'\n');
            }
        }
        if !out.emit(&batch) {
            return;
        }
        batch.clear();
    }
    if !line.is_empty() {
        batch.extend_from_slice(tag);
        batch.append(&mut line);
        if !tag.is_empty() {
            batch.push(b'\n');
        }
        out.emit(&batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each batch.
    #[derive(Default)]
    struct Record(Vec<Vec<u8>>);

    impl Lines for Record {
        fn emit(&mut self, batch: &[u8]) -> bool {
            if !batch.is_empty() {
                self.0.push(batch.to_vec());
            }
            true
        }
    }

    /// Reads its pieces one `read` at a time.
    struct Pieces(Vec<&'static [u8]>);

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let piece = self.0.remove(0);
            buf[..piece.len()].copy_from_slice(piece);
            Ok(piece.len())
        }
    }

    fn run(pieces: Vec<&'static [u8]>, tag: Option<&[u8]>) -> Vec<String> {
        let mut out = Record::default();
        pump(Pieces(pieces), &mut out, tag);
        out.0
            .into_iter()
            .map(|b| String::from_utf8(b).unwrap())
            .collect()
    }

    #[test]
    fn batches_hold_whole_lines_only() {
        let got = run(vec![b"hel", b"lo\nwor", b"ld\n", b"tail"], Some(b"[3] "));
        assert_eq!(got, ["[3] hello\n", "[3] world\n", "[3] tail\n"]);
        let got = run(vec![b"a\nb\nc", b"\n"], None);
        assert_eq!(got, ["a\nb\n", "c\n"]);
        // Untagged output is passed on unchanged, even without a last newline.
        assert_eq!(run(vec![b"no newline"], None), ["no newline"]);
    }

    #[test]
    fn rank_lists() {
        assert_eq!(rank_list(&[3, 0, 1, 2, 5, 8, 7]), "0-3,5,7-8");
        assert_eq!(rank_list(&[4]), "4");
    }

    #[test]
    fn identical_lines_of_several_ranks_merge_in_order() {
        let errors = Errors::default();
        assert!(errors.add(0, b"same\n"));
        assert!(errors.add(0, b"mine\n"));
        assert!(errors.add(1, b"same\n"));
        assert!(errors.add(2, b"same\n"));
        // Rank 0 again: a new entry, after "mine".
        assert!(errors.add(0, b"same\n"));
        let p = errors.lock();
        let got: Vec<(&[u8], &[u32])> = p
            .entries
            .iter()
            .map(|e| (e.line.as_slice(), e.ranks.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                (&b"same\n"[..], &[0, 1, 2][..]),
                (b"mine\n", &[0]),
                (b"same\n", &[0])
            ]
        );
    }

    #[test]
    fn overlong_lines_are_cut() {
        let long: &'static [u8] = Box::leak(vec![b'x'; MAX_LINE + 10].into_boxed_slice());
        let (first, second) = long.split_at(MAX_LINE);
        let got = run(vec![first, second, b"\n"], Some(b"[0] "));
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), 4 + MAX_LINE + 1);
        assert_eq!(got[1], format!("[0] {}\n", "x".repeat(10)));
    }
}
