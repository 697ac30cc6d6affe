//! `udbench`: OSU-style point-to-point benchmarks over udbtl.
//!
//! ```text
//! udrun -n 2 --bind-to core udbench                 # latency, then bw
//! udrun -n 2 udbench latency --max-size 64k
//! udrun -n 2 udbench bw --window 32
//! udrun -n 2 udbench bibw
//! udrun -n 4 udbench mbw_mr --pairs 2
//! udrun -n 4 udbench multi_lat --json
//! ```
//!
//! The methodology is that of the OSU micro-benchmarks, so the numbers can be
//! set beside published OMB tables:
//!
//! * `latency`: ranks 0 and 1 ping-pong; the main column is half the round
//!   trip in microseconds averaged over the timed loop (`# Size
//!   Latency (us)`), followed by the median, 99th percentile and maximum
//!   of the per-iteration half round trips. 10 000 timed iterations after 100 of
//!   warm-up up to 8 KiB, 1 000 after 10 above.
//! * `bw`: rank 0 sends a window of messages (64 by default) to rank 1,
//!   which answers each complete window with a 4-byte acknowledgement;
//!   MB/s with MB = 10⁶ bytes (`# Size      Bandwidth (MB/s)`). 100 timed
//!   windows after 10 up to 8 KiB, 20 after 2 above.
//! * `bibw`: ranks 0 and 1 each send a window to the other and wait for
//!   the other's window; the aggregate of both directions, loops as `bw`.
//! * `mbw_mr`: `--pairs P` pairs run the `bw` pattern at once, rank i
//!   sending to rank i + P (so the job needs 2P ranks); aggregate MB/s and
//!   messages per second, from the senders' average time. Loops as `bw`.
//! * `multi_lat`: rank i ping-pongs with rank i + N/2 for every i < N/2 at
//!   once (N even); the average over the pairs of each pair's latency.
//!   Loops as `latency`.
//!
//! Without a subcommand, `latency` then `bw` (`--no-bandwidth`: latency
//! only). Sizes run from `--min-size` (1 B) doubling up to `--max-size`
//! (4 MiB). `--iterations N` sets the timed loop for sizes up to 8 KiB;
//! larger sizes take OSU's proportion of it (a tenth for latency, a fifth
//! for bandwidth) and the warm-up is OSU's proportion of the timed loop
//! (1 % for latency, 10 % for bandwidth, at least one) unless `--warmup`
//! sets it. `--json` prints one JSON object per size and benchmark instead
//! of the table. A row too noisy to trust (a mean far above the median, or
//! batches of windows far apart) is followed by a warning; a closed stdout
//! ends rank 0 quietly, by SIGPIPE (see [`report`]).
//!
//! Every rank busy-polls the transport, as MPI does. Delivery is reliable
//! and in order, so counting arrivals per tag is enough to pace the loops.
//! Every wait also asks the transport whether a peer was lost, and gives up
//! after `--stall-timeout` seconds (60) with the transport's state: a run
//! fails loudly, never hangs silently.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};

mod bench;
mod report;
#[path = "../../size.rs"]
mod size;

/// The largest message: every rank holds one buffer of this size.
const MAX_SIZE: u64 = 1 << 30;

#[derive(Debug, Parser)]
#[command(
    name = "udbench",
    version,
    about = "OSU-style latency, bandwidth and message rate over udbtl",
    after_help = "Without a subcommand: latency, then bw."
)]
struct Cli {
    #[command(subcommand)]
    bench: Option<Bench>,
    #[command(flatten)]
    common: Common,
    /// Without a subcommand, skip the bandwidth test.
    #[arg(long)]
    no_bandwidth: bool,
}

/// Options every benchmark takes.
#[derive(Debug, Clone, Args)]
struct Common {
    /// Smallest message size (suffixes k, M, G or KiB, MiB, GiB).
    #[arg(long, default_value = "1", value_parser = parse_message_size, global = true)]
    min_size: u64,
    /// Largest message size (suffixes as --min-size).
    #[arg(long, default_value = "4M", value_parser = parse_message_size, global = true)]
    max_size: u64,
    /// Timed iterations for sizes up to 8 KiB (larger sizes use OSU's
    /// proportion of it) [default: OSU's, 10000 latency, 100 bandwidth].
    #[arg(long, value_parser = parse_positive::<u64>, global = true)]
    iterations: Option<u64>,
    /// Untimed warm-up iterations before each size [default: OSU's
    /// proportion of the timed iterations].
    #[arg(long, global = true)]
    warmup: Option<u64>,
    /// Print one JSON object per line instead of the table.
    #[arg(long, global = true)]
    json: bool,
    /// Report progress on stderr (the default when stderr is a terminal).
    #[arg(long, global = true)]
    progress: bool,
    /// Seconds a rank waits for one message or window before it reports the
    /// run stuck, with the transport's state, and fails; 0 waits for ever.
    /// A lost peer is reported sooner, by the transport (peer_timeout).
    #[arg(long, default_value_t = 60, global = true)]
    stall_timeout: u64,
    /// Send with `World::send`, which copies each message, instead of
    /// `World::send_shared`, which sends from the benchmark's buffer.
    #[arg(long, global = true)]
    copy_sends: bool,
}

/// Options of the windowed benchmarks.
#[derive(Debug, Clone, Copy, Args)]
struct Window {
    /// Messages in flight before each acknowledgement.
    #[arg(long, default_value_t = 64, value_parser = parse_positive::<u64>)]
    window: u64,
}

#[derive(Debug, Clone, Copy, Subcommand)]
enum Bench {
    /// Ping-pong between ranks 0 and 1: half the round trip (avg, P50, P99).
    Latency,
    /// Rank 0 streams windows to rank 1: MB/s.
    Bw(Window),
    /// Ranks 0 and 1 stream windows to each other: aggregate MB/s.
    Bibw(Window),
    /// P sender/receiver pairs stream at once: MB/s and messages/s.
    #[command(name = "mbw_mr", alias = "mbw-mr")]
    MbwMr {
        /// Sender/receiver pairs: ranks 0..P-1 send to ranks P..2P-1.
        #[arg(long, default_value_t = 1, value_parser = parse_positive::<u32>)]
        pairs: u32,
        #[command(flatten)]
        window: Window,
    },
    /// Every rank i < N/2 ping-pongs with rank i + N/2 at once: average
    /// latency.
    #[command(name = "multi_lat", alias = "multi-lat")]
    MultiLat,
}

/// A count of at least 1 (clap's ranges would name the type's maximum).
fn parse_positive<T: std::str::FromStr + From<u8> + PartialOrd>(text: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let n: T = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if n < T::from(1) {
        return Err("must be at least 1".to_owned());
    }
    Ok(n)
}

fn parse_message_size(text: &str) -> Result<u64, String> {
    let n = size::parse_size(text)?;
    if n > MAX_SIZE {
        return Err(format!("{text:?} is over the 1 GiB limit"));
    }
    Ok(n)
}

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|err| usage(&err));
    // Checked before the job starts, so every rank stops with the same
    // usage error instead of some of them waiting in a barrier.
    if cli.common.min_size > cli.common.max_size {
        usage(&Cli::command().error(
            ErrorKind::ValueValidation,
            format!(
                "--min-size {} is larger than --max-size {}",
                cli.common.min_size, cli.common.max_size
            ),
        ));
    }
    if cli.no_bandwidth && cli.bench.is_some() {
        usage(&Cli::command().error(
            ErrorKind::ArgumentConflict,
            "--no-bandwidth applies only without a subcommand",
        ));
    }
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Nowhere left to report a stderr that fails.
            let _ = writeln!(io::stderr(), "udbench: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Prints clap's message (a usage error, or the help or version) and exits
/// with clap's status (2, or 0). The message goes out in one write: clap
/// writes it in pieces, and udrun, which prints the same message from
/// several ranks once, must see each rank's message whole to merge it
/// (a message under 4 KiB reaches a pipe in one piece).
fn usage(err: &clap::Error) -> ! {
    let text = err.render();
    let written = if err.use_stderr() {
        let text = if io::stderr().is_terminal() {
            text.ansi().to_string()
        } else {
            text.to_string()
        };
        io::stderr().lock().write_all(text.as_bytes())
    } else {
        let text = if io::stdout().is_terminal() {
            text.ansi().to_string()
        } else {
            text.to_string()
        };
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes()).and_then(|()| out.flush())
    };
    if written.is_err_and(|e| e.kind() == io::ErrorKind::BrokenPipe) && !err.use_stderr() {
        closed_pipe();
    }
    std::process::exit(err.exit_code())
}

/// Ends the process as the default action of SIGPIPE does, which Rust
/// programs ignore so that a write to a closed pipe fails instead: what a C
/// program, such as OSU's, does when its reader goes away (`| head`). The
/// shell's status is 141, and it prints nothing about it.
pub(crate) fn closed_pipe() -> ! {
    // Falls through only if the signal could not be raised.
    let _ = signal_hook::low_level::emulate_default_handler(signal_hook::consts::SIGPIPE);
    std::process::exit(128 + signal_hook::consts::SIGPIPE)
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let common = &cli.common;
    refuse_unreliable()?;
    let world = udbtl::init()?;
    let out = report::Out {
        rank0: world.rank() == 0,
        json: common.json,
        progress: common.progress || io::stderr().is_terminal(),
    };
    let plan = bench::Plan {
        sizes: sizes(common.min_size, common.max_size),
        iterations: common.iterations,
        warmup: common.warmup,
        stall: (common.stall_timeout > 0).then(|| Duration::from_secs(common.stall_timeout)),
        copy_sends: common.copy_sends,
    };
    let mut cx = bench::Cx::new(world, common.max_size, plan)?;
    match cli.bench {
        None => {
            cx.latency(&out)?;
            if !cli.no_bandwidth {
                cx.bw(&out, 64)?;
            }
        }
        Some(Bench::Latency) => cx.latency(&out)?,
        Some(Bench::Bw(w)) => cx.bw(&out, w.window)?,
        Some(Bench::Bibw(w)) => cx.bibw(&out, w.window)?,
        Some(Bench::MbwMr { pairs, window }) => cx.mbw_mr(&out, pairs, window.window)?,
        Some(Bench::MultiLat) => cx.multi_lat(&out)?,
    }
    cx.finalize()
}

/// Refuses `UDBTL_RELIABLE=0` before the job starts: the benchmarks count
/// arrivals to pace their loops, so one lost datagram would hang them, and
/// messages over one datagram need the reliable transport. (An invalid
/// parameter is left for `udbtl::init` to report.)
fn refuse_unreliable() -> Result<(), String> {
    match udbtl::btl::Params::load(&udbtl::btl::BtlConfig::default()) {
        Ok(params) if !params.reliable => Err(
            "needs reliable delivery, which UDBTL_RELIABLE=0 turns off: its loops \
             count arrivals, so one lost datagram would hang them, and messages over one \
             datagram cannot be sent; unset UDBTL_RELIABLE"
                .to_owned(),
        ),
        _ => Ok(()),
    }
}

/// OSU's sweep: from `min` doubling while at most `max`.
fn sizes(min: u64, max: u64) -> Vec<usize> {
    std::iter::successors(Some(min), |s| s.checked_mul(2))
        .take_while(|s| *s <= max)
        .filter_map(|s| usize::try_from(s).ok())
        .collect()
}
