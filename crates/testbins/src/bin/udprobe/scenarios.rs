//! The scenarios, one function each (see the [crate docs](crate) for
//! what each checks).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use udbtl::World;

use crate::{
    Args, DATA, Failure, Inbox, Scenario, WaitIn, await_acknowledged, await_messages, compute,
    epoch_ms, finalize, linger, ms, payload, received, stop_self,
};

/// Starts the job and runs the scenario `args` names.
pub(crate) fn run(args: &Args) -> Result<(), Failure> {
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
        Scenario::Stranger { ref dir } => {
            crate::stranger::stranger(world, &inbox, dir, deadline)?;
        }
    }
    Ok(())
}

pub(crate) fn lost_peer(
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
pub(crate) fn report_and_linger(
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

pub(crate) fn busy(
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

pub(crate) fn kill(
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

pub(crate) fn stop_one(
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

pub(crate) fn stop_all(
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

pub(crate) fn finalize_busy(
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

pub(crate) fn into_one(
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
