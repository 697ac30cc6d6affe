//! Forwarding a rank's stdout and stderr to udrun's, whole lines at a time.
//!
//! One thread per pipe reads what the rank writes and copies every complete
//! line to udrun's stdout (or stderr) while holding that stream's lock, so
//! lines of different ranks never mix. A partial line waits for its end (or
//! the end of the pipe). A line longer than [`MAX_LINE`] is passed on in
//! pieces: unchanged without `--tag-output`, each piece ended by a newline
//! and tagged with it. On stderr, where udrun's own lines go, a rank's
//! unfinished last line is ended with a newline, so that a verdict never
//! runs on from it.
//!
//! Without `--tag-output`, stderr goes through [`Errors`], which writes the
//! same message from several ranks once (see [`crate::merge`]). A message
//! there is a burst: what the rank wrote without a pause of
//! [`BURST_GAP`] (one `write` always, and the pieces a program writes a
//! message in, as clap and Rust's `eprintln!` do), up to [`MAX_LINE`]
//! bytes and [`BURST_MAX`]. Under `--tag-output` every line is written,
//! with its rank, at once; stdout is never delayed.
//!
//! # A closed output
//!
//! Once udrun's stream fails (`udrun ... | head` closed it), the forwarding
//! stops and the pipe is closed, so the rank gets SIGPIPE (or EPIPE) as if
//! it had written to the closed pipe itself. If the stream was closed by
//! its reader (EPIPE), the job is told first ([`Event::OutputGone`]), and
//! ends quietly.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use crate::events::Event;
use crate::merge::Errors;

/// The longest line kept whole; longer ones are cut.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Which of udrun's streams a pipe goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
}

/// The longest pause within one burst of a rank's stderr: see the
/// [module docs](self).
const BURST_GAP: Duration = Duration::from_millis(10);
/// The longest a burst is gathered, however steadily the rank writes.
const BURST_MAX: Duration = Duration::from_millis(100);

/// Starts a thread that copies `source` to `sink` line by line, each line
/// prefixed with `[rank] ` when `tag` is set (else, for stderr, through
/// `errors` when given), and sends [`Event::OutputClosed`] once `source`
/// ends, preceded by [`Event::OutputGone`] if udrun's stream was closed by
/// its reader.
pub(crate) fn forward(
    mut source: File,
    sink: Sink,
    rank: u32,
    tag: bool,
    errors: Option<Arc<Errors>>,
    done: Sender<Event>,
) -> io::Result<()> {
    let name = match sink {
        Sink::Stdout => format!("out-{rank}"),
        Sink::Stderr => format!("err-{rank}"),
    };
    thread::Builder::new()
        .name(name)
        .stack_size(128 * 1024)
        .spawn(move || {
            // udrun's own lines go to stderr: a rank's unfinished last line
            // there must not run into them.
            let end_last_line = sink == Sink::Stderr;
            let pumped = match errors.filter(|_| sink == Sink::Stderr && !tag) {
                Some(errors) => {
                    let framing = Framing {
                        tag: &[],
                        bursts: true,
                        end_last_line,
                    };
                    pump(&mut source, &mut ToErrors { errors, rank }, framing)
                }
                None => {
                    let tag = if tag {
                        format!("[{rank}] ").into_bytes()
                    } else {
                        Vec::new()
                    };
                    let framing = Framing {
                        tag: &tag,
                        bursts: false,
                        end_last_line,
                    };
                    pump(&mut source, &mut Writer::new(sink), framing)
                }
            };
            // Told before the pipe closes, hence before the rank can fail
            // writing to it: its end is then no failure of its own.
            if pumped.is_err_and(|e| e.kind() == io::ErrorKind::BrokenPipe) {
                let _ = done.send(Event::OutputGone);
            }
            drop(source);
            let _ = done.send(Event::OutputClosed { rank });
        })
        .map(drop)
}

/// Passes a rank's stderr bursts to [`Errors`], each one message.
struct ToErrors {
    errors: Arc<Errors>,
    rank: u32,
}

impl Lines for ToErrors {
    fn emit(&mut self, batch: &[u8]) -> io::Result<()> {
        self.errors.add(self.rank, batch)
    }
}

/// Where whole lines go: one of udrun's standard streams, or (in tests) a
/// buffer.
trait Lines {
    /// Writes `batch`, which holds whole lines only (or a piece of an
    /// overlong one), in one go.
    ///
    /// # Errors
    /// Nothing more can be written, for this reason.
    fn emit(&mut self, batch: &[u8]) -> io::Result<()>;
}

/// A rank's pipe, as [`pump`] reads it.
trait Source: Read {
    /// Whether more can be read (bytes, or the end) within `wait`.
    fn ready_within(&mut self, wait: Duration) -> bool;
}

impl Source for File {
    fn ready_within(&mut self, wait: Duration) -> bool {
        let Ok(timeout) = Timespec::try_from(wait) else {
            return false;
        };
        let mut fds = [PollFd::new(&*self, PollFlags::IN)];
        loop {
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(ready) => return ready > 0,
                Err(Errno::INTR) => {}
                Err(_) => return false,
            }
        }
    }
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
    fn emit(&mut self, batch: &[u8]) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        match self.sink {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(batch).and_then(|()| out.flush())
            }
            Sink::Stderr => io::stderr().lock().write_all(batch),
        }
    }
}

/// How [`pump`] cuts and marks what a rank writes.
#[derive(Debug, Clone, Copy)]
struct Framing<'a> {
    /// Put before every line; each piece of an overlong line, and the
    /// rank's unfinished last line, then end with a newline too.
    tag: &'a [u8],
    /// Whether a batch is what the rank wrote in one burst (see the
    /// [module docs](self)) rather than what one read brings.
    bursts: bool,
    /// Whether the rank's unfinished last line is ended with a newline, so
    /// that what udrun writes next starts a line of its own.
    end_last_line: bool,
}

/// Copies `source` to `out` until either ends (or fails), in batches of
/// whole lines, cut and marked as `framing` says.
///
/// # Errors
/// `out` failed: the forwarding stops.
fn pump<S: Source, L: Lines>(source: &mut S, out: &mut L, framing: Framing<'_>) -> io::Result<()> {
    let Framing {
        tag,
        bursts,
        end_last_line,
    } = framing;
    let mut chunk = vec![0; MAX_LINE];
    // The line being read, not yet ended.
    let mut line: Vec<u8> = Vec::new();
    // Whole lines to write at once.
    let mut batch: Vec<u8> = Vec::new();
    // When the burst being gathered began.
    let mut began: Option<Instant> = None;
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
        let began_at = *began.get_or_insert_with(Instant::now);
        if bursts
            && batch.len() < MAX_LINE
            && began_at.elapsed() < BURST_MAX
            && source.ready_within(BURST_GAP)
        {
            continue;
        }
        out.emit(&batch)?;
        batch.clear();
        began = None;
    }
    if !line.is_empty() {
        batch.extend_from_slice(tag);
        batch.append(&mut line);
        if end_last_line || !tag.is_empty() {
            batch.push(b'\n');
        }
    }
    out.emit(&batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each batch.
    #[derive(Default)]
    struct Record(Vec<Vec<u8>>);

    impl Lines for Record {
        fn emit(&mut self, batch: &[u8]) -> io::Result<()> {
            if !batch.is_empty() {
                self.0.push(batch.to_vec());
            }
            Ok(())
        }
    }

    /// Reads its pieces one `read` at a time; `None` is a pause longer
    /// than a burst's gap.
    struct Pieces(Vec<Option<&'static [u8]>>);

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            while self.0.first() == Some(&None) {
                self.0.remove(0);
            }
            if self.0.is_empty() {
                return Ok(0);
            }
            let piece = self.0.remove(0).unwrap_or_default();
            buf[..piece.len()].copy_from_slice(piece);
            Ok(piece.len())
        }
    }

    impl Source for Pieces {
        fn ready_within(&mut self, _: Duration) -> bool {
            self.0.first().is_some_and(Option::is_some)
        }
    }

    fn pumped(pieces: Vec<Option<&'static [u8]>>, framing: Framing<'_>) -> Vec<String> {
        let mut out = Record::default();
        pump(&mut Pieces(pieces), &mut out, framing).unwrap();
        out.0
            .into_iter()
            .map(|b| String::from_utf8(b).unwrap())
            .collect()
    }

    /// Plain lines, one batch a read.
    const LINES: Framing<'static> = Framing {
        tag: &[],
        bursts: false,
        end_last_line: false,
    };

    /// Each piece read apart from the next.
    fn run(pieces: Vec<&'static [u8]>, tag: &[u8]) -> Vec<String> {
        let paused = pieces.into_iter().flat_map(|p| [Some(p), None]).collect();
        pumped(paused, Framing { tag, ..LINES })
    }

    #[test]
    fn batches_hold_whole_lines_only() {
        let got = run(vec![b"hel", b"lo\nwor", b"ld\n", b"tail"], b"[3] ");
        assert_eq!(got, ["[3] hello\n", "[3] world\n", "[3] tail\n"]);
        let got = run(vec![b"a\nb\nc", b"\n"], b"");
        assert_eq!(got, ["a\nb\n", "c\n"]);
        // Untagged output is passed on unchanged, even without a last newline.
        assert_eq!(run(vec![b"no newline"], b""), ["no newline"]);
    }

    #[test]
    fn an_unfinished_last_line_is_ended_when_asked() {
        let framing = Framing {
            end_last_line: true,
            ..LINES
        };
        let got = pumped(vec![Some(b"done\nsetsid: "), None], framing);
        assert_eq!(got, ["done\n", "setsid: \n"]);
        // A finished one gets no second newline.
        assert_eq!(pumped(vec![Some(b"done\n")], framing), ["done\n"]);
    }

    #[test]
    fn a_burst_is_one_batch_and_a_pause_ends_it() {
        let pieces = vec![
            Some(&b"error:"[..]),
            Some(b" no\n\n"),
            Some(b"Usage: x\n"),
            None,
            Some(b"later\n"),
        ];
        let bursts = Framing {
            bursts: true,
            ..LINES
        };
        let got = pumped(pieces.clone(), bursts);
        assert_eq!(got, ["error: no\n\nUsage: x\n", "later\n"]);
        // Without bursts, one batch a read.
        let got = pumped(pieces, LINES);
        assert_eq!(got, ["error: no\n\n", "Usage: x\n", "later\n"]);
    }

    #[test]
    fn overlong_lines_are_cut() {
        let long: &'static [u8] = Box::leak(vec![b'x'; MAX_LINE + 10].into_boxed_slice());
        let (first, second) = long.split_at(MAX_LINE);
        let got = run(vec![first, second, b"\n"], b"[0] ");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), 4 + MAX_LINE + 1);
        assert_eq!(got[1], format!("[0] {}\n", "x".repeat(10)));
    }
}
