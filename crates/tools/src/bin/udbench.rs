//! `udbench`: OSU-style latency and bandwidth between ranks 0 and 1.
//!
//! ```text
//! udrun -n 2 --bind-to core udbench
//! ```
//!
//! * Latency: a ping-pong, reported as half the round trip in microseconds
//!   (`# Size  Latency (us)`), 10 000 iterations after 1 000 of warm-up up
//!   to 8 KiB, 1 000 after 100 above, as the OSU micro-benchmarks do.
//! * Bandwidth: rank 0 sends a window of 64 messages, rank 1 answers with a
//!   4-byte acknowledgement; MB/s with MB = 10⁶ bytes (`# Size  Bandwidth
//!   (MB/s)`), 100 windows after 10 up to 8 KiB, 20 after 2 above.
//!
//! Both ranks busy-poll, as MPI does. Delivery is reliable and in order.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use udbtl::{Tag, World};

const PING: Tag = Tag(Tag::USR.0 + 20);
const ACK: Tag = Tag(Tag::USR.0 + 21);
/// Sizes above this are "large" (fewer iterations), as in OSU.
const LARGE: usize = 8192;
const WINDOW: u64 = 64;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "OSU-style latency and bandwidth between ranks 0 and 1"
)]
struct Args {
    /// Largest message size in bytes.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(1..=1 << 30))]
    max_size: u32,
    /// Iterations per size (small sizes; large sizes use a tenth).
    #[arg(long, default_value_t = 10_000)]
    iterations: u64,
    /// Skip the bandwidth test.
    #[arg(long)]
    no_bandwidth: bool,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("udbench: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Counts messages arriving on a tag.
fn counter(world: &mut World, tag: Tag) -> Arc<AtomicU64> {
    let count = Arc::new(AtomicU64::new(0));
    let sink = count.clone();
    world.on_receive(tag, move |_, _| {
        sink.fetch_add(1, Ordering::Relaxed);
    });
    count
}

/// Busy-polls until `count` reaches `target`.
fn wait(world: &mut World, count: &AtomicU64, target: u64) {
    while count.load(Ordering::Relaxed) < target {
        world.progress();
    }
}

fn sizes(max: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(1usize), |s| s.checked_mul(2)).take_while(move |s| *s <= max)
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut world = udbtl::init()?;
    let (rank, size) = (world.rank(), world.size());
    if size < 2 {
        return Err("run with at least 2 ranks, e.g. udrun -n 2 udbench".into());
    }
    let pings = counter(&mut world, PING);
    let acks = counter(&mut world, ACK);
    let max_size = args.max_size as usize;
    let buf = vec![0x5au8; max_size];
    if rank == 0 {
        println!(
            "# udbench: latency and bandwidth between ranks 0 and 1 over udbtl (reliable UD over UDP)"
        );
        println!("# Size          Latency (us)");
    }
    world.barrier()?;
    for len in sizes(max_size) {
        let (iters, warmup) = if len > LARGE {
            (args.iterations / 10, 100)
        } else {
            (args.iterations, 1000)
        };
        let total = iters + warmup;
        let base = pings.load(Ordering::Relaxed);
        let mut start = Instant::now();
        for i in 0..total {
            if i == warmup {
                start = Instant::now();
            }
            match rank {
                0 => {
                    world.send_message(1, PING, &buf[..len])?;
                    wait(&mut world, &pings, base + i + 1);
                }
                1 => {
                    wait(&mut world, &pings, base + i + 1);
                    world.send_message(0, PING, &buf[..len])?;
                }
                _ => {}
            }
        }
        if rank == 0 {
            let us = start.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64;
            println!("{len:<15} {us:.2}");
        }
    }
    if !args.no_bandwidth {
        if rank == 0 {
            println!("# Size          Bandwidth (MB/s)");
        }
        world.barrier()?;
        for len in sizes(max_size) {
            let (iters, warmup) = if len > LARGE { (20, 2) } else { (100, 10) };
            // Targets are absolute: a send may progress, and count pings of
            // the next window, before a target relative to the count now
            // would be taken (which hung the benchmark).
            let pings_before = pings.load(Ordering::Relaxed);
            let mut start = Instant::now();
            for i in 0..iters + warmup {
                if i == warmup {
                    start = Instant::now();
                }
                match rank {
                    0 => {
                        let base = acks.load(Ordering::Relaxed);
                        for _ in 0..WINDOW {
                            world.send_message(1, PING, &buf[..len])?;
                        }
                        wait(&mut world, &acks, base + 1);
                    }
                    1 => {
                        wait(&mut world, &pings, pings_before + (i + 1) * WINDOW);
                        world.send_message(0, ACK, &[0u8; 4])?;
                    }
                    _ => {}
                }
            }
            if rank == 0 {
                let bytes = (len as u64 * WINDOW * iters) as f64;
                println!(
                    "{len:<15} {:.2}",
                    bytes / start.elapsed().as_secs_f64() / 1e6
                );
            }
        }
    }
    world.finalize()?;
    Ok(())
}
