//! `udprobe`: scenarios where ranks misbehave, each checking, message by
//! message, that nothing is lost silently. A test driver, not a tool: the
//! tests beside it (`tests/probes.rs`) run it under `udrun`, and nothing
//! installs it. It is also handy for trying a failure by hand, once built
//! (`cargo build -p udbtl-testbins -p udbtl-tools`):
//!
//! ```text
//! UDBTL_MODEX=lazy target/debug/udrun -n 4 target/debug/udprobe lazy-barrier
//! UDBTL_PEER_TIMEOUT=500 target/debug/udrun -n 3 target/debug/udprobe lost-peer
//! ```
//!
//! * `lazy-barrier`: rank 0 sends to every other rank at once, before any
//!   rank has fetched its peers' addresses (with `UDBTL_MODEX=lazy`), while
//!   they all sit in a barrier (`--wait-in barrier`) or in finalize
//!   (`--wait-in finalize`). Every receiver checks it got every message, in
//!   order and intact.
//! * `lost-peer`: rank 2 stops dead (SIGSTOP) right after start-up. Rank 0
//!   sends to it until it is declared lost, then makes `--sends` more sends
//!   to it (each must fail at once), then sends to rank 1, which checks
//!   everything arrived. Rank 0's `finalize` must report the loss, naming
//!   rank 2, and no leak.
//!
//! * `busy`: rank 0 sends `--messages` to rank 1 and waits until all are
//!   acknowledged; rank 1 takes the first, then computes for `--busy-ms`
//!   without calling progress (with `--owe-ack`, rank 0 first sends a burst
//!   of 3, which rank 1 stops right after receiving, before acknowledging
//!   it). The progress helper must keep rank 1 alive; with
//!   `UDBTL_PROGRESS_THREAD=0` rank 0 declares it lost, and both report.
//! * `kill`: the last rank (or `--victim`) SIGKILLs itself after `--after`
//!   messages while rank 0 sends to every rank; rank 0 reports when its
//!   error names the victim, if udrun lets it live that long.
//! * `stop-one`: rank 1 SIGSTOPs itself for `--stop-ms` (a child process
//!   continues it) while rank 0 has data waiting for it: rank 0 declares it
//!   lost; rank 1, once continued, finds that rank 0 broke the stream.
//! * `stop-all`: rank 0 sends to rank 1, spread over `--pace-ms`, for the
//!   test to stop and continue the whole job meanwhile: nothing is lost.
//! * `finalize-busy`: rank 0 sends and finalizes at once while rank 1
//!   computes for `--busy-ms` from the start.
//! * `into-one`: every rank but 0 sends to rank 0, which checks every
//!   stream (a tiny pool, `UDBTL_RD_NUM=16`, makes credit tight).
//! * `stranger`: ranks 0 and 1 exchange checked messages until a stranger
//!   who forges datagrams to them makes `--dir/done`; each rank writes its
//!   process id to `--dir/pid.<rank>` and reports the datagrams it found
//!   unacceptable (`stranger.rs`).
//!
//! The ranks print what they measured (and, on an error, what they received
//! before it), with wall-clock times as `at <ms since the epoch>` for the
//! tests to compare across ranks. Every check that fails prints one line
//! naming it and exits non-zero.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod scenarios;
mod stranger;

use clap::{Parser, Subcommand};
use udbtl::{Tag, World};

const DATA: Tag = Tag::new(30);

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Scenarios where ranks misbehave, checked message by message"
)]
struct Args {
    #[command(subcommand)]
    scenario: Scenario,
    /// Messages each sender sends.
    #[arg(long, default_value_t = 100, global = true)]
    messages: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60, global = true)]
    timeout: u64,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Rank 0 sends to every rank while they sit in a barrier or finalize.
    LazyBarrier {
        /// Where the ranks wait.
        #[arg(long, value_enum, default_value_t = WaitIn::Barrier)]
        wait_in: WaitIn,
    },
    /// Rank 2 vanishes; rank 0 keeps sending to it, then to rank 1.
    LostPeer {
        /// Sends to the lost rank after it was declared lost.
        #[arg(long, default_value_t = 10_000)]
        sends: u32,
    },
    /// Rank 1 computes without progress while rank 0 waits for
    /// acknowledgements.
    Busy {
        /// How long rank 1 computes, in milliseconds.
        #[arg(long, default_value_t = 6000)]
        busy_ms: u64,
        /// Rank 1 stops right after receiving a burst, before acknowledging.
        #[arg(long)]
        owe_ack: bool,
        /// On an error, how long rank 0 keeps progressing before it exits,
        /// so that rank 1 can report too.
        #[arg(long, default_value_t = 0)]
        linger_ms: u64,
    },
    /// A rank SIGKILLs itself while rank 0 sends to every rank.
    Kill {
        /// The rank that dies: the last one unless given.
        #[arg(long)]
        victim: Option<u32>,
        /// Messages the victim receives before it dies.
        #[arg(long, default_value_t = 100)]
        after: u32,
    },
    /// Rank 1 stops (SIGSTOP) for a while with data waiting for it.
    StopOne {
        /// How long rank 1 stays stopped, in milliseconds.
        #[arg(long, default_value_t = 5000)]
        stop_ms: u64,
        /// Messages rank 1 receives before it stops.
        #[arg(long, default_value_t = 50)]
        after: u32,
        /// How long rank 0 keeps progressing after its error.
        #[arg(long, default_value_t = 10_000)]
        linger_ms: u64,
    },
    /// Rank 0 sends to rank 1 slowly, while the test stops the whole job.
    StopAll {
        /// Rank 0 spreads its sends over this many milliseconds.
        #[arg(long, default_value_t = 4000)]
        pace_ms: u64,
    },
    /// Rank 0 sends and finalizes at once; rank 1 computes first.
    FinalizeBusy {
        /// How long rank 1 computes, from the start, in milliseconds.
        #[arg(long, default_value_t = 8000)]
        busy_ms: u64,
    },
    /// Every rank but 0 sends to rank 0.
    IntoOne,
    /// Ranks 0 and 1 exchange checked messages while a stranger forges
    /// datagrams to them.
    Stranger {
        /// Where the ranks write their process ids and the stranger says
        /// it is done.
        #[arg(long)]
        dir: std::path::PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WaitIn {
    Barrier,
    Finalize,
}

type Failure = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args = Args::parse();
    match scenarios::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("udprobe: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The payload of message `seq` from `from`.
fn payload(from: u32, seq: u32) -> Vec<u8> {
    let mut bytes = from.to_be_bytes().to_vec();
    bytes.extend_from_slice(&seq.to_be_bytes());
    bytes.extend((0..(seq % 200) as u8).map(|i| i ^ from as u8));
    bytes
}

/// Checks, per sender, that messages arrive in order, once and intact.
#[derive(Debug, Default)]
struct Inbox {
    next: Vec<u32>,
    errors: Vec<String>,
}

impl Inbox {
    fn install(world: &mut World) -> Arc<Mutex<Self>> {
        let inbox = Arc::new(Mutex::new(Self {
            next: vec![0; world.size() as usize],
            errors: Vec::new(),
        }));
        let sink = inbox.clone();
        world.on_receive(DATA, move |from, bytes| {
            let mut inbox = sink.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(from) = from.filter(|f| (*f as usize) < inbox.next.len()) else {
                inbox.errors.push("a message from no known rank".into());
                return;
            };
            let seq = inbox.next[from as usize];
            if bytes != payload(from, seq) {
                inbox.errors.push(format!(
                    "message {seq} from rank {from} is wrong or out of order"
                ));
            }
            inbox.next[from as usize] += 1;
        });
        inbox
    }
}

/// Progresses until rank `from`'s `count` messages are in, or the deadline.
fn await_messages(
    world: &mut World,
    inbox: &Mutex<Inbox>,
    from: u32,
    count: u32,
    deadline: Instant,
) -> Result<(), Failure> {
    loop {
        {
            let inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
            if !inbox.errors.is_empty() {
                return Err(inbox.errors.join("; ").into());
            }
            if inbox.next[from as usize] >= count {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for rank {from}'s messages").into());
        }
        world.check()?;
        if world.progress() == 0 {
            std::thread::yield_now();
        }
    }
}

/// Milliseconds since the epoch: a time the ranks' outputs can compare.
fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Computes for `duration` without calling progress.
fn compute(duration: Duration) -> u64 {
    let start = Instant::now();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    while start.elapsed() < duration {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.rotate_left(5) ^ x.wrapping_mul(31));
        }
    }
    x
}

/// Progresses until every send is acknowledged, or the transport reports a
/// loss, or the deadline; returns how long it took.
fn await_acknowledged(world: &mut World, deadline: Instant) -> Result<Duration, Failure> {
    let start = Instant::now();
    while world.unacknowledged() > 0 {
        world.check()?;
        if Instant::now() > deadline {
            return Err(format!(
                "timed out with {} sends unacknowledged",
                world.unacknowledged()
            )
            .into());
        }
        if world.progress() == 0 {
            std::thread::yield_now();
        }
    }
    world.check()?;
    Ok(start.elapsed())
}

/// Keeps progressing for `duration` (answering the peers, resets included),
/// so that the other side of a failure can report it before udrun ends the
/// job.
fn linger(world: &mut World, duration: Duration) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        if world.progress() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How many messages from `from` arrived (all checked in order and intact
/// unless the inbox says otherwise).
fn received(inbox: &Mutex<Inbox>, from: u32) -> String {
    let inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
    let got = inbox.next[from as usize];
    if inbox.errors.is_empty() {
        format!("{got} messages from rank {from}, in order and intact")
    } else {
        format!(
            "{got} messages from rank {from}, with errors: {}",
            inbox.errors.join("; ")
        )
    }
}

/// Finalizes, printing the outcome.
fn finalize(world: World) -> Result<(), Failure> {
    let rank = world.rank();
    match world.finalize() {
        Ok(()) => {
            println!("rank {rank}: finalize OK");
            Ok(())
        }
        Err(err) => {
            println!("rank {rank}: finalize: {err}");
            Err(err.into())
        }
    }
}

/// Stops this process dead with SIGSTOP.
fn stop_self() -> Result<(), Failure> {
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP)?;
    Ok(())
}
