//! `udhello`: every rank exchanges a checked greeting with every rank of the
//! job, through the real transport, and reports. It is the smallest complete
//! udbtl program, and the one launcher tests run.
//!
//! ```text
//! udrun -n 4 udhello
//! mpiexec.hydra -n 4 udhello
//! ```
//!
//! Exit status 0 means every rank heard from, and was acknowledged by, every
//! rank (itself included) with intact payloads. The transport is reliable, so
//! each greeting and acknowledgement is sent once; `--timeout` bounds the
//! wait.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use udbtl::Tag;

const HELLO: Tag = Tag::new(1);
const ACK: Tag = Tag::new(2);
/// Greeting payload length: enough bytes for a corruption to show.
const PAYLOAD: usize = 256;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Exchange a checked greeting between every pair of ranks"
)]
struct Args {
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
    /// After the exchange, make rank RANK exit with CODE (launcher tests).
    #[arg(long, value_name = "RANK:CODE", value_parser = parse_pair)]
    exit: Option<(u32, i32)>,
    /// After the exchange, sleep forever (launcher tests).
    #[arg(long)]
    hang: bool,
}

fn parse_pair(text: &str) -> Result<(u32, i32), String> {
    let (rank, code) = text.split_once(':').ok_or("expected RANK:CODE")?;
    Ok((
        rank.parse().map_err(|e| format!("rank: {e}"))?,
        code.parse().map_err(|e| format!("code: {e}"))?,
    ))
}

/// The greeting `from` sends `to`: a header and bytes derived from both, so
/// the receiver can check every byte.
fn greeting(from: u32, to: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + PAYLOAD);
    bytes.extend_from_slice(&from.to_be_bytes());
    bytes.extend_from_slice(&to.to_be_bytes());
    bytes
        .extend((0..PAYLOAD).map(|i| (i as u32).wrapping_mul(from + 1).wrapping_add(to * 7) as u8));
    bytes
}

#[derive(Default)]
struct Progress {
    heard: BTreeSet<u32>,
    acked: BTreeSet<u32>,
    /// Peers whose greeting must be acknowledged.
    to_ack: Vec<u32>,
    corrupt: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("udhello: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut world = udbtl::init()?;
    let (rank, size) = (world.rank(), world.size());
    let init_time = world.uptime();
    let state = Arc::new(Mutex::new(Progress::default()));
    let me = rank;
    let sink = state.clone();
    world.on_receive(HELLO, move |_, bytes| {
        let mut state = sink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let from = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes);
        match from {
            Some(from) if bytes == greeting(from, me).as_slice() => {
                state.heard.insert(from);
                state.to_ack.push(from);
            }
            _ => state.corrupt.push(format!(
                "{} bytes that are no greeting to rank {me}",
                bytes.len()
            )),
        }
    });
    let sink = state.clone();
    world.on_receive(ACK, move |_, bytes| {
        if let Some(peer) = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
        {
            sink.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .acked
                .insert(peer);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    for peer in 0..size {
        world.send_bytes(peer, HELLO, &greeting(rank, peer))?;
    }
    loop {
        let (done, to_ack, missing_acks) = {
            let mut state = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !state.corrupt.is_empty() {
                return Err(format!(
                    "rank {rank} received corrupt data: {}",
                    state.corrupt.join("; ")
                )
                .into());
            }
            let missing: Vec<u32> = (0..size).filter(|p| !state.acked.contains(p)).collect();
            let done = missing.is_empty() && state.heard.len() == size as usize;
            (done, std::mem::take(&mut state.to_ack), missing)
        };
        for peer in to_ack {
            world.send_bytes(peer, ACK, &rank.to_be_bytes())?;
        }
        if done {
            break;
        }
        if Instant::now() >= deadline {
            let heard = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .heard
                .len();
            return Err(format!("rank {rank}: timed out; heard {heard} of {size}, unacknowledged by {missing_acks:?}").into());
        }
        world.progress();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    println!(
        "udhello: rank {rank} of {size} on {}: greeted and acknowledged by all {size} ranks (init {:.1} ms, modex {})",
        host.trim(),
        init_time.as_secs_f64() * 1e3,
        // As UDBTL_MODEX spells it.
        match world.modex_mode() {
            udbtl::ModexMode::Bulk => "bulk",
            udbtl::ModexMode::Lazy => "lazy",
        }
    );
    if args.hang {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    if let Some((who, code)) = args.exit {
        if who == rank {
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
    }
    world.finalize()?;
    Ok(ExitCode::SUCCESS)
}
