//! `udstress`: moves checked data between the ranks of a job, to show
//! exactly-once, in-order, intact delivery through real losses.
//!
//! ```text
//! UDBTL_FAULT_DROP=0.05 udrun -n 2 udstress bulk --bytes 1G
//! UDBTL_FAULT_DROP=0.05 udrun -n 4 udstress alltoall --messages 1000
//! UDBTL_FAULT_DROP=0.02 udrun -n 4 udstress alltoall --seconds 300
//! ```
//!
//! * `bulk`: rank 0 streams `--bytes` to rank 1 in messages of `--size`
//!   bytes; rank 1 checks every message's sequence number and CRC-32 and the
//!   CRC of the whole stream, and reports the goodput.
//! * `alltoall`: every rank sends `--messages` messages to every other rank;
//!   each receiver checks, per sender, that they arrive in order, once, and
//!   intact. With `--seconds S` each rank sends rounds (one message to
//!   every other rank) for S seconds instead of a fixed count, then tells
//!   every receiver how many to expect.
//!
//! A peer the transport declares lost ends the run at once with an error
//! that names its rank (`udstress: messages were lost: rank 1: rank 3 lost
//! (...)`), whether the rank was sending or waiting.
//!
//! Exit status 0 means every check passed on every rank.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use udbtl::Tag;

#[path = "../size.rs"]
mod size;
use size::parse_size;

const DATA: Tag = Tag::new(10);
const DONE: Tag = Tag::new(11);

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Move checked data between ranks through the transport"
)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600, global = true)]
    timeout: u64,
    /// Say on stderr when this rank starts sending and when it has sent
    /// everything.
    #[arg(long, global = true)]
    verbose: bool,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Rank 0 streams to rank 1.
    Bulk {
        /// Bytes to move (suffixes k, M, G: powers of 1024).
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        bytes: u64,
        /// Bytes per message.
        #[arg(long, default_value = "256k", value_parser = parse_size)]
        size: u64,
    },
    /// Every rank sends to every other rank.
    Alltoall {
        /// Messages each rank sends to each other rank.
        #[arg(long, default_value_t = 1000)]
        messages: u32,
        /// Send for this many seconds instead of a fixed number of
        /// messages.
        #[arg(long, conflicts_with = "messages")]
        seconds: Option<u64>,
    },
}

/// The payload of message `seq` from `from`: a header naming it, then bytes
/// derived from both, so any corruption or misdelivery shows.
fn payload(from: u32, seq: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&from.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    let len = len.max(12);
    out.extend((12..len).map(|i| {
        (i as u64)
            .wrapping_mul(seq | 1)
            .wrapping_add(u64::from(from)) as u8
    }));
}

#[derive(Default)]
struct Checker {
    /// Next sequence number expected from each rank.
    next: Vec<u64>,
    received_bytes: u64,
    stream_crc: crc32fast::Hasher,
    errors: Vec<String>,
    done_from: Vec<Option<(u64, u32)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("udstress: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut world = udbtl::init()?;
    let (rank, size) = (world.rank(), world.size());
    let checker = Arc::new(Mutex::new(Checker {
        next: vec![0; size as usize],
        done_from: vec![None; size as usize],
        ..Checker::default()
    }));
    let sink = checker.clone();
    let mut expected = Vec::new();
    world.on_receive(DATA, move |from, bytes| {
        let mut c = lock(&sink);
        let Some(from) = from.filter(|f| *f < size) else {
            c.errors.push("data from an unknown rank".into());
            return;
        };
        let seq = bytes
            .get(4..12)
            .and_then(|b| b.try_into().ok())
            .map_or(u64::MAX, u64::from_be_bytes);
        payload(from, seq, bytes.len(), &mut expected);
        if seq != c.next[from as usize] {
            let want = c.next[from as usize];
            c.errors.push(format!(
                "from rank {from}: message {seq} arrived when {want} was due"
            ));
        } else if bytes != expected.as_slice() {
            c.errors
                .push(format!("from rank {from}: message {seq} is corrupt"));
        }
        c.next[from as usize] = seq.wrapping_add(1);
        c.received_bytes += bytes.len() as u64;
        c.stream_crc.update(bytes);
    });
    let sink = checker.clone();
    world.on_receive(DONE, move |from, bytes| {
        let mut c = lock(&sink);
        let count = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes);
        let crc = bytes
            .get(8..12)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes);
        if let (Some(from), Some(count), Some(crc)) = (from, count, crc) {
            c.done_from[from as usize] = Some((count, crc));
        }
    });
    world.barrier()?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let start = Instant::now();
    let mut buf = Vec::new();
    let mut sent_crc = crc32fast::Hasher::new();
    // Who sends how much to whom.
    let plan: Vec<(u32, u64, usize)> = match args.mode {
        Mode::Bulk { bytes, size: chunk } => {
            if size < 2 {
                return Err("bulk needs at least 2 ranks".into());
            }
            if chunk > 1 << 30 {
                return Err(format!("--size {chunk} exceeds 1G per message").into());
            }
            let count = bytes.div_ceil(chunk);
            if rank == 0 {
                vec![(1, count, chunk as usize)]
            } else {
                Vec::new()
            }
        }
        Mode::Alltoall { messages, seconds } => {
            // A timed run sends rounds until its time is up: no fixed count.
            let count = if seconds.is_some() {
                u64::MAX
            } else {
                u64::from(messages)
            };
            (0..size)
                .filter(|peer| *peer != rank)
                .map(|peer| (peer, count, 0))
                .collect()
        }
    };
    let send_until = match args.mode {
        Mode::Alltoall {
            seconds: Some(seconds),
            ..
        } => Some(start + Duration::from_secs(seconds)),
        _ => None,
    };
    let longest = plan.iter().map(|(_, count, _)| *count).max().unwrap_or(0);
    if args.verbose {
        eprintln!("udstress: rank {rank}: sending");
    }
    let mut rounds = 0;
    for seq in 0..longest {
        if send_until.is_some_and(|until| Instant::now() >= until) {
            break;
        }
        rounds = seq + 1;
        world.check()?;
        for (peer, count, len) in &plan {
            if seq >= *count {
                continue;
            }
            let len = if *len == 0 {
                16 + (seq as usize * 97 + *peer as usize * 13) % 3000
            } else {
                *len
            };
            payload(rank, seq, len, &mut buf);
            sent_crc.update(&buf);
            world.send(*peer, DATA, &buf)?;
            // Keep the receive side moving: acknowledgements flow both ways.
            world.progress();
            if Instant::now() > deadline {
                return Err(format!("rank {rank}: timed out sending").into());
            }
        }
    }
    let sent_crc = sent_crc.finalize();
    if args.verbose {
        eprintln!("udstress: rank {rank}: sent {rounds} rounds");
    }
    for (peer, count, _) in &plan {
        let mut done = (*count).min(rounds).to_be_bytes().to_vec();
        // For bulk, the receiver also compares the CRC of the whole stream.
        done.extend_from_slice(&sent_crc.to_be_bytes());
        world.send(*peer, DONE, &done)?;
    }
    // Wait for every expected stream to end.
    let senders: Vec<u32> = match args.mode {
        Mode::Bulk { .. } => {
            if rank == 1 {
                vec![0]
            } else {
                Vec::new()
            }
        }
        Mode::Alltoall { .. } => (0..size).filter(|p| *p != rank).collect(),
    };
    loop {
        // A lost peer ends the wait at once, named by its rank.
        world.check()?;
        {
            let c = lock(&checker);
            if !c.errors.is_empty() {
                return Err(format!("rank {rank}: {}", c.errors.join("; ")).into());
            }
            let finished = senders.iter().all(|s| {
                c.done_from[*s as usize].is_some_and(|(count, _)| c.next[*s as usize] == count)
            });
            if finished {
                break;
            }
        }
        if Instant::now() > deadline {
            let c = lock(&checker);
            return Err(format!(
                "rank {rank}: timed out; received {:?}, done {:?}",
                c.next, c.done_from
            )
            .into());
        }
        world.progress();
    }
    let elapsed = start.elapsed();
    let c = lock(&checker);
    if let Mode::Bulk { .. } = args.mode {
        if rank == 1 {
            let (_, crc) = c.done_from[0].unwrap_or_default();
            let got = c.stream_crc.clone().finalize();
            if got != crc {
                return Err(
                    format!("stream CRC {got:08x} differs from the sender's {crc:08x}").into(),
                );
            }
            println!(
                "udstress bulk: {} bytes in {:.2} s ({:.0} MB/s), every message in order and intact, stream CRC {got:08x}",
                c.received_bytes,
                elapsed.as_secs_f64(),
                c.received_bytes as f64 / elapsed.as_secs_f64() / 1e6
            );
        }
    } else {
        let total: u64 = senders.iter().map(|s| c.next[*s as usize]).sum();
        println!(
            "udstress alltoall: rank {rank} received {total} messages from {} ranks in {:.2} s ({} bytes), in order and intact",
            senders.len(),
            elapsed.as_secs_f64(),
            c.received_bytes
        );
    }
    drop(c);
    world.finalize()?;
    Ok(())
}
