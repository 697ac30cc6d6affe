//! `udprobe`: scenarios where ranks misbehave, each checking, message by
//! message, that nothing is lost silently. The tests run them under `udrun`;
//! they are also handy for trying a failure by hand.
//!
//! ```text
//! UDBTL_MODEX=lazy udrun -n 4 udprobe lazy-barrier
//! UDBTL_PEER_TIMEOUT=500 udrun -n 3 udprobe lost-peer
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
//!
//! The ranks print what they measured (and, on an error, what they received
//! before it), with wall-clock times as `at <ms since the epoch>` for the
//! tests to compare across ranks. Every check that fails prints one line
//! naming it and exits non-zero.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use udbtl::{Tag, World};

const DATA: Tag = Tag(Tag::USR.0 + 30);

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WaitIn {
    Barrier,
    Finalize,
}

type Failure = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
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

fn run(args: &Args) -> Result<(), Failure> {
    let mut world = udbtl::init()?;
    let inbox = Inbox::install(&mut world);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let rank = world.rank();
    match args.scenario {
        Scenario::LazyBarrier { wait_in } => {
            if rank == 0 {
                for to in 1..world.size() {
                    for seq in 0..args.messages {
                        world.send_bytes(to, DATA, &payload(0, seq))?;
                    }
                }
            }
            // Every rank waits in a barrier, or goes straight to finalize:
            // either way the receivers receive while they wait.
            if wait_in == WaitIn::Barrier {
                world.barrier()?;
                if rank != 0 {
                    await_messages(&mut world, &inbox, 0, args.messages, deadline)?;
                }
            }
            world.finalize()?;
            let inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
            if !inbox.errors.is_empty() {
                return Err(inbox.errors.join("; ").into());
            }
            let got = inbox.next[0];
            if rank != 0 && got != args.messages {
                return Err(format!(
                    "rank {rank}: {got} of {} messages from rank 0 arrived",
                    args.messages
                )
                .into());
            }
            if rank != 0 {
                let during = match wait_in {
                    WaitIn::Barrier => "barrier",
                    WaitIn::Finalize => "finalize",
                };
                println!(
                    "rank {rank}: {got} messages from rank 0, received during {during}, in order and intact"
                );
            }
        }
        Scenario::LostPeer { sends } => lost_peer(world, &inbox, args.messages, sends, deadline)?,
        Scenario::Busy {
            busy_ms,
            owe_ack,
            linger_ms,
        } => busy(
            world,
            &inbox,
            args.messages,
            Duration::from_millis(busy_ms),
            owe_ack,
            Duration::from_millis(linger_ms),
            deadline,
        )?,
        Scenario::Kill { victim, after } => {
            kill(world, &inbox, args.messages, victim, after, deadline)?;
        }
        Scenario::StopOne {
            stop_ms,
            after,
            linger_ms,
        } => stop_one(
            world,
            &inbox,
            args.messages,
            Duration::from_millis(stop_ms),
            after,
            Duration::from_millis(linger_ms),
            deadline,
        )?,
        Scenario::StopAll { pace_ms } => stop_all(
            world,
            &inbox,
            args.messages,
            Duration::from_millis(pace_ms),
            deadline,
        )?,
        Scenario::FinalizeBusy { busy_ms } => finalize_busy(
            world,
            &inbox,
            args.messages,
            Duration::from_millis(busy_ms),
            deadline,
        )?,
        Scenario::IntoOne => into_one(world, &inbox, args.messages, deadline)?,
    }
    Ok(())
}

fn lost_peer(
    mut world: World,
    inbox: &Mutex<Inbox>,
    messages: u32,
    sends: u32,
    deadline: Instant,
) -> Result<(), Failure> {
    const LOST: u32 = 2;
    if world.size() != 3 {
        return Err("lost-peer runs with 3 ranks".into());
    }
    match world.rank() {
        LOST => {
            // Vanish: stop dead, as a hung or partitioned node does, until
            // the launcher ends the job.
            rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::STOP,
            )?;
            Err("rank 2 was continued".into())
        }
        0 => {
            let started = Instant::now();
            let mut seq = 0;
            while world.send_bytes(LOST, DATA, &payload(0, seq)).is_ok() {
                seq += 1;
                world.progress();
                if Instant::now() > deadline {
                    return Err("rank 2 was never declared lost".into());
                }
            }
            let detected = started.elapsed();
            let refusals = Instant::now();
            let mut refused = 0;
            for seq in 0..sends {
                if world.send_bytes(LOST, DATA, &payload(0, seq)).is_err() {
                    refused += 1;
                }
            }
            let refusals = refusals.elapsed();
            for seq in 0..messages {
                world.send_bytes(1, DATA, &payload(0, seq))?;
            }
            println!(
                "rank 0: rank 2 declared lost after {:.0} ms; {refused} of {sends} later sends to it refused in {:.0} ms; {messages} sent to rank 1",
                detected.as_secs_f64() * 1e3,
                refusals.as_secs_f64() * 1e3
            );
            match world.finalize() {
                Ok(()) => Err("finalize succeeded although rank 2 was lost".into()),
                Err(err) => {
                    println!("rank 0: finalize: {err}");
                    Err(err.into())
                }
            }
        }
        _ => {
            await_messages(&mut world, inbox, 0, messages, deadline)?;
            println!("rank 1: {messages} messages from rank 0 in order and intact");
            // Rank 0 ends the job; wait for it without finalizing (a barrier
            // with rank 2 can never complete).
            loop {
                world.progress();
                if Instant::now() > deadline {
                    return Err("rank 0 never ended the job".into());
                }
            }
        }
    }
}

/// Rank 0's side of a failure: print it, keep answering for `linger` so
/// that the peer can hear of it, then fail.
fn report_and_linger(
    world: &mut World,
    started: Instant,
    err: &Failure,
    linger_for: Duration,
) -> Failure {
    println!(
        "rank {}: error after {:.0} ms (at {} ms): {err}",
        world.rank(),
        ms(started.elapsed()),
        epoch_ms()
    );
    linger(world, linger_for);
    err.to_string().into()
}

fn busy(
    mut world: World,
    inbox: &Mutex<Inbox>,
    messages: u32,
    busy_for: Duration,
    owe_ack: bool,
    linger_for: Duration,
    deadline: Instant,
) -> Result<(), Failure> {
    if world.size() != 2 {
        return Err("busy runs with 2 ranks".into());
    }
    if world.rank() == 0 {
        let started = Instant::now();
        let burst = if owe_ack { messages.min(3) } else { messages };
        let sent = (|| -> Result<Duration, Failure> {
            for seq in 0..burst {
                world.send_bytes(1, DATA, &payload(0, seq))?;
            }
            if owe_ack {
                let acked = await_acknowledged(&mut world, deadline)?;
                println!(
                    "rank 0: a burst of {burst} acknowledged after {:.1} ms, while rank 1 computes",
                    ms(acked)
                );
            }
            for seq in burst..messages {
                world.send_bytes(1, DATA, &payload(0, seq))?;
            }
            await_acknowledged(&mut world, deadline)
        })();
        match sent {
            Ok(_) => println!(
                "rank 0: all {messages} messages acknowledged after {:.0} ms (rank 1 computed {:.0} ms)",
                ms(started.elapsed()),
                ms(busy_for)
            ),
            Err(err) => return Err(report_and_linger(&mut world, started, &err, linger_for)),
        }
        return finalize(world);
    }
    await_messages(&mut world, inbox, 0, 1, deadline)?;
    // Stop progressing at once: what rank 0 sent with the first message
    // (and its acknowledgement) is the helper's to handle.
    let before = received(inbox, 0);
    compute(busy_for);
    println!(
        "rank 1: received {before}, then computed {:.0} ms without progress",
        ms(busy_for)
    );
    if let Err(err) = await_messages(&mut world, inbox, 0, messages, deadline) {
        println!(
            "rank 1: error (at {} ms): {err}; received {}",
            epoch_ms(),
            received(inbox, 0)
        );
        return Err(err);
    }
    println!("rank 1: all {}", received(inbox, 0));
    finalize(world)
}

fn kill(
    mut world: World,
    inbox: &Mutex<Inbox>,
    messages: u32,
    victim: Option<u32>,
    after: u32,
    deadline: Instant,
) -> Result<(), Failure> {
    let size = world.size();
    let victim = victim.unwrap_or(size - 1);
    if size < 3 || victim == 0 || victim >= size {
        return Err("kill runs with 3 ranks or more, the victim not rank 0".into());
    }
    let rank = world.rank();
    if rank == victim {
        await_messages(&mut world, inbox, 0, after, deadline)?;
        println!(
            "rank {rank}: received {}; SIGKILL at {} ms",
            received(inbox, 0),
            epoch_ms()
        );
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)?;
        return Err("SIGKILL did not kill".into());
    }
    if rank != 0 {
        if let Err(err) = await_messages(&mut world, inbox, 0, messages, deadline) {
            println!("rank {rank}: error: {err}; received {}", received(inbox, 0));
            return Err(err);
        }
        println!("rank {rank}: all {}", received(inbox, 0));
        return finalize(world);
    }
    let started = Instant::now();
    let sent = (|| -> Result<(), Failure> {
        for seq in 0..messages {
            for to in 1..size {
                world.send_bytes(to, DATA, &payload(0, seq))?;
            }
            world.check()?;
            world.progress();
        }
        await_acknowledged(&mut world, deadline).map(drop)
    })();
    match sent {
        Ok(()) => Err("every send was acknowledged although a rank died".into()),
        Err(err) => {
            let named = err.to_string().contains(&format!("rank {victim}"));
            println!(
                "rank 0: error after {:.0} ms (at {} ms), naming rank {victim}: {named}: {err}",
                ms(started.elapsed()),
                epoch_ms()
            );
            Err(err)
        }
    }
}

fn stop_one(
    mut world: World,
    inbox: &Mutex<Inbox>,
    messages: u32,
    stop_for: Duration,
    after: u32,
    linger_for: Duration,
    deadline: Instant,
) -> Result<(), Failure> {
    if world.size() != 2 {
        return Err("stop-one runs with 2 ranks".into());
    }
    if world.rank() == 0 {
        let started = Instant::now();
        // Messages the transport took: the send fragments bound how far
        // ahead of a stopped receiver the sender gets.
        let mut handed = 0;
        let sent = (|| -> Result<(), Failure> {
            for seq in 0..messages {
                world.send_bytes(1, DATA, &payload(0, seq))?;
                handed += 1;
                world.check()?;
                world.progress();
            }
            await_acknowledged(&mut world, deadline).map(drop)
        })();
        return match sent {
            Ok(()) => {
                println!("rank 0: all {messages} messages acknowledged");
                finalize(world)
            }
            Err(err) => {
                println!("rank 0: the transport took {handed} of {messages} messages");
                Err(report_and_linger(&mut world, started, &err, linger_for))
            }
        };
    }
    await_messages(&mut world, inbox, 0, after, deadline)?;
    // A stopped process cannot continue itself: a child does it.
    let pid = std::process::id();
    let waker = std::process::Command::new("sh")
        .args([
            "-c",
            &format!("sleep {:.3}; kill -CONT {pid}", stop_for.as_secs_f64()),
        ])
        .spawn()?;
    println!(
        "rank 1: received {}; stopping at {} ms for {:.0} ms",
        received(inbox, 0),
        epoch_ms(),
        ms(stop_for)
    );
    let stopped = Instant::now();
    stop_self()?;
    println!(
        "rank 1: continued at {} ms, after {:.0} ms",
        epoch_ms(),
        ms(stopped.elapsed())
    );
    drop(waker);
    match await_messages(&mut world, inbox, 0, messages, deadline) {
        Err(err) => {
            println!(
                "rank 1: error (at {} ms): {err}; received {}",
                epoch_ms(),
                received(inbox, 0)
            );
            Err(err)
        }
        Ok(()) => {
            println!("rank 1: all {}", received(inbox, 0));
            finalize(world)
        }
    }
}

fn stop_all(
    mut world: World,
    inbox: &Mutex<Inbox>,
    messages: u32,
    pace: Duration,
    deadline: Instant,
) -> Result<(), Failure> {
    if world.size() != 2 {
        return Err("stop-all runs with 2 ranks".into());
    }
    // The longest time between two passes of this rank's loop: the stop.
    let mut gap = Duration::ZERO;
    let mut last = Instant::now();
    let mut note = |gap: &mut Duration| {
        let now = Instant::now();
        *gap = (*gap).max(now - last);
        last = now;
    };
    let started = Instant::now();
    if world.rank() == 0 {
        for seq in 0..messages {
            let due = started + pace.mul_f64(f64::from(seq) / f64::from(messages.max(1)));
            while Instant::now() < due {
                note(&mut gap);
                world.check()?;
                if world.progress() == 0 {
                    std::thread::yield_now();
                }
            }
            note(&mut gap);
            world.send_bytes(1, DATA, &payload(0, seq))?;
        }
        while world.unacknowledged() > 0 {
            note(&mut gap);
            world.check()?;
            if Instant::now() > deadline {
                return Err("timed out waiting for acknowledgements".into());
            }
            if world.progress() == 0 {
                std::thread::yield_now();
            }
        }
        println!(
            "rank 0: all {messages} messages acknowledged after {:.0} ms; longest gap {:.0} ms",
            ms(started.elapsed()),
            ms(gap)
        );
    } else {
        loop {
            note(&mut gap);
            {
                let inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
                if !inbox.errors.is_empty() || inbox.next[0] >= messages {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(format!("timed out; received {}", received(inbox, 0)).into());
            }
            if let Err(err) = world.check() {
                println!("rank 1: error: {err}; received {}", received(inbox, 0));
                return Err(err.into());
            }
            if world.progress() == 0 {
                std::thread::yield_now();
            }
        }
        let inbox_errors = !inbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .errors
            .is_empty();
        println!(
            "rank 1: all {} after {:.0} ms; longest gap {:.0} ms",
            received(inbox, 0),
            ms(started.elapsed()),
            ms(gap)
        );
        if inbox_errors {
            return Err(received(inbox, 0).into());
        }
    }
    finalize(world)
}

fn finalize_busy(
    mut world: World,
    inbox: &Mutex<Inbox>,
    messages: u32,
    busy_for: Duration,
    deadline: Instant,
) -> Result<(), Failure> {
    if world.size() != 2 {
        return Err("finalize-busy runs with 2 ranks".into());
    }
    let started = Instant::now();
    if world.rank() == 0 {
        for seq in 0..messages {
            world.send_bytes(1, DATA, &payload(0, seq))?;
        }
        let rank = world.rank();
        let outcome = finalize(world);
        println!(
            "rank {rank}: sent {messages} and finalized in {:.0} ms",
            ms(started.elapsed())
        );
        return outcome;
    }
    compute(busy_for);
    if let Err(err) = await_messages(&mut world, inbox, 0, messages, deadline) {
        println!("rank 1: error: {err}; received {}", received(inbox, 0));
        return Err(err);
    }
    println!(
        "rank 1: computed {:.0} ms, then all {} after {:.0} ms",
        ms(busy_for),
        received(inbox, 0),
        ms(started.elapsed())
    );
    finalize(world)
}

fn into_one(
    mut world: World,
    inbox: &Mutex<Inbox>,
    messages: u32,
    deadline: Instant,
) -> Result<(), Failure> {
    let rank = world.rank();
    let started = Instant::now();
    if rank != 0 {
        for seq in 0..messages {
            world.send_bytes(0, DATA, &payload(rank, seq))?;
            if world.progress() == 0 {
                std::thread::yield_now();
            }
        }
        world.check()?;
        return finalize(world);
    }
    for from in 1..world.size() {
        if let Err(err) = await_messages(&mut world, inbox, from, messages, deadline) {
            let counts: Vec<String> = (1..world.size()).map(|r| received(inbox, r)).collect();
            println!("rank 0: error: {err}; received {}", counts.join(", "));
            return Err(err);
        }
    }
    println!(
        "rank 0: {messages} messages from each of {} ranks, in order and intact, in {:.0} ms",
        world.size() - 1,
        ms(started.elapsed())
    );
    finalize(world)
}
