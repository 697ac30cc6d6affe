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

use std::io::{self, Read, Write};
use std::sync::mpsc::Sender;
use std::thread;

use crate::job::Event;

/// The longest line kept whole; longer ones are cut.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Which of udrun's streams a pipe goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
}

/// Starts a thread that copies `source` to `sink` line by line, each line
/// prefixed with `[rank] ` when `tag` is set, and sends
/// [`Event::OutputClosed`] once `source` ends.
pub(crate) fn forward<R>(
    source: R,
    sink: Sink,
    rank: u32,
    tag: bool,
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
            let tag = tag.then(|| format!("[{rank}] ").into_bytes());
            pump(source, &mut Writer::new(sink), tag.as_deref());
            let _ = done.send(Event::OutputClosed);
        })
        .map(drop)
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
    fn overlong_lines_are_cut() {
        let long: &'static [u8] = Box::leak(vec![b'x'; MAX_LINE + 10].into_boxed_slice());
        let (first, second) = long.split_at(MAX_LINE);
        let got = run(vec![first, second, b"\n"], Some(b"[0] "));
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), 4 + MAX_LINE + 1);
        assert_eq!(got[1], format!("[0] {}\n", "x".repeat(10)));
    }
}
