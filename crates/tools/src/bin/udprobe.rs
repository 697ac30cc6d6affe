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
//! Every check that fails prints one line naming it and exits non-zero.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
        world.progress();
    }
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
