//! The `stranger` scenario: ranks 0 and 1 exchange checked messages while
//! a stranger sends them forged datagrams, until it says it is done (the
//! file `DIR/done`), and one round more, so that everything it sent has
//! been read. Each rank writes its process id to `DIR/pid.<rank>` for the
//! stranger to find its sockets.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use udbtl::{Tag, World};

use crate::{DATA, Failure, Inbox, await_messages, payload};

/// Rank 0's last word: how many messages it sent.
const STOP: Tag = Tag::new(DATA.get() + 1);

pub(crate) fn stranger(
    mut world: World,
    inbox: &Mutex<Inbox>,
    dir: &Path,
    deadline: Instant,
) -> Result<(), Failure> {
    if world.size() != 2 {
        return Err("stranger runs with 2 ranks".into());
    }
    let rank = world.rank();
    let stop = Arc::new(AtomicU32::new(u32::MAX));
    let said = stop.clone();
    world.on_receive(STOP, move |_, bytes| {
        if let Ok(count) = <[u8; 4]>::try_from(bytes) {
            said.store(u32::from_be_bytes(count), Ordering::Relaxed);
        }
    });
    std::fs::write(
        dir.join(format!("pid.{rank}")),
        format!("{}\n", std::process::id()),
    )?;
    let done = dir.join("done");
    let mut exchanged = 0;
    if rank == 0 {
        loop {
            let last = done.exists();
            world.send_bytes(1, DATA, &payload(0, exchanged))?;
            exchanged += 1;
            await_messages(&mut world, inbox, 1, exchanged, deadline)?;
            if last {
                break;
            }
        }
        world.send_bytes(1, STOP, &exchanged.to_be_bytes())?;
    } else {
        // Echoes each message; rank 0's count comes after its last one.
        while stop.load(Ordering::Relaxed) != exchanged {
            let arrived = inbox.lock().unwrap_or_else(PoisonError::into_inner).next[0];
            while exchanged < arrived {
                world.send_bytes(0, DATA, &payload(1, exchanged))?;
                exchanged += 1;
            }
            if Instant::now() > deadline {
                return Err(format!("rank 1: timed out after {exchanged} messages").into());
            }
            world.check()?;
            world.progress();
        }
    }
    let dump = world.dump();
    world.finalize()?;
    let inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
    if !inbox.errors.is_empty() {
        return Err(inbox.errors.join("; ").into());
    }
    let from = 1 - rank;
    if inbox.next[from as usize] != exchanged {
        return Err(format!(
            "rank {rank}: {} of {exchanged} messages from rank {from} arrived",
            inbox.next[from as usize]
        )
        .into());
    }
    let counters = |prefix: &str| {
        dump.lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .map_or("(no such counters)", str::trim)
            .to_owned()
    };
    println!(
        "rank {rank}: {exchanged} messages each way, in order and intact; unacceptable {}; \
         integrity {}; fabric {}",
        counters("unacceptable "),
        counters("integrity "),
        counters("fabric ")
    );
    Ok(())
}
