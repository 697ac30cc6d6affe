//! udbtl's log records, through Open MPI's output.
//!
//! Under Open MPI nobody installs a `tracing` subscriber, so udbtl's
//! warnings (a socket buffer the kernel capped, a misspelled `UDBTL_*`
//! variable, a peer taking smaller datagrams) would go nowhere. The
//! component installs one that hands each record to a sink: the FFI layer's,
//! which prints through `opal_output`. `RUST_LOG` chooses what is recorded
//! (default: warnings and errors).
//!
//! Warnings given while the transport starts are the same in every process
//! of a node (they come from its configuration), so processes other than
//! the first on their node give them at a lower level ([`set_quiet`]), as
//! `btl_base_verbose` output.

use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{Level, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Where records go: their level and their text, one line or more.
pub type Sink = fn(Level, &str);

static SINK: OnceLock<Sink> = OnceLock::new();
static QUIET: AtomicBool = AtomicBool::new(false);

/// Installs the subscriber that sends records to `sink`, once per process.
/// A process that already has a global subscriber (a Rust MPI program that
/// set up its own logging) keeps it, and udbtl's records go there. Returns
/// whether this call installed it.
pub fn install(sink: Sink) -> bool {
    if SINK.set(sink).is_err() {
        return false;
    }
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env()
        .unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(MakeSinkWriter)
        .without_time()
        .with_target(false)
        .with_level(false)
        .with_ansi(false)
        .try_init()
        .is_ok()
}

/// While set, warnings are given at the level of informational records:
/// set around the transport's start in every process but the first of its
/// node, so that a configuration warning is given once per node.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// The level a record of `level` is given at now.
fn effective(level: Level) -> Level {
    if level == Level::WARN && QUIET.load(Ordering::Relaxed) {
        Level::INFO
    } else {
        level
    }
}

struct MakeSinkWriter;

impl<'a> MakeWriter<'a> for MakeSinkWriter {
    type Writer = SinkWriter;

    fn make_writer(&'a self) -> SinkWriter {
        SinkWriter::new(Level::INFO)
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> SinkWriter {
        SinkWriter::new(effective(*meta.level()))
    }
}

/// Collects one record's text and hands it to the sink when dropped (the
/// formatter makes one writer per record).
struct SinkWriter {
    level: Level,
    text: Vec<u8>,
}

impl SinkWriter {
    const fn new(level: Level) -> Self {
        Self {
            level,
            text: Vec::new(),
        }
    }
}

impl io::Write for SinkWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for SinkWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.text);
        let text = text.trim_end();
        if let (false, Some(sink)) = (text.is_empty(), SINK.get()) {
            sink(self.level, text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_lowers_warnings_only() {
        set_quiet(true);
        assert_eq!(effective(Level::WARN), Level::INFO);
        assert_eq!(effective(Level::ERROR), Level::ERROR);
        set_quiet(false);
        assert_eq!(effective(Level::WARN), Level::WARN);
    }
}
