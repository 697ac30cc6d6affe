//! A ring: rank 0 sends a token to rank 1, each rank adds its own rank and
//! passes it on, and rank 0 checks the sum when the token comes back. Then
//! every rank sends 100 KiB to the next one, which checks every byte.
//!
//! ```sh
//! cargo build --release --example ring
//! ./target/release/udrun -n 4 ./target/release/examples/ring
//! ```
use udbtl::Tag;

// A program names its tags, 0 to Tag::MAX; udbtl's own are out of reach.
const TOKEN: Tag = Tag::new(1);
const BULK: Tag = Tag::new(2);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Finds the launcher (udrun, mpiexec.hydra, srun) and connects to every rank.
    let mut world = udbtl::init()?;
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;

    // The token. `recv` waits, progressing, for the next message on a tag:
    // a message sent before its receiver asked for it waits for it.
    if rank == 0 {
        world.send(next, TOKEN, &0u64.to_le_bytes())?;
    }
    let token = world.recv(TOKEN)?;
    assert_eq!(token.from, Some(prev));
    let sum = u64::from_le_bytes(token.data[..].try_into()?);
    if rank == 0 {
        let expected = u64::from(size) * u64::from(size - 1) / 2;
        println!("rank 0: the token came back with {sum} (expected {expected})");
        if sum != expected {
            return Err("the ring lost count".into());
        }
    } else {
        world.send(next, TOKEN, &(sum + u64::from(rank)).to_le_bytes())?;
    }

    // A message of any length: the transport cuts it into datagrams and
    // the receiver gets it whole, once.
    world.send(next, BULK, &vec![rank as u8; 100 * 1024])?;
    let bulk = world.recv(BULK)?;
    if bulk.data.len() != 100 * 1024 || bulk.data.iter().any(|&b| b != prev as u8) {
        return Err(format!("rank {rank}: the message from rank {prev} is wrong").into());
    }
    println!(
        "rank {rank}: {} bytes from rank {prev}, all checked",
        bulk.data.len()
    );

    // Waits until every message of this rank was acknowledged, meets every
    // rank, and fails, naming the ranks, if anything was lost.
    world.finalize()?;
    Ok(())
}
