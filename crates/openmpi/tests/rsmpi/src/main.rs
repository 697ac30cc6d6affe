//! Point-to-point and collectives through rsmpi, every result checked: the
//! component must serve a Rust program exactly as it serves C (the same
//! libmpi underneath, but other call patterns: vectors received by probe,
//! immediate sends in a scope). A wrong value panics, which ends the job
//! non-zero; success prints `RSMPI OK rank <r> of <n>`.

use mpi::collective::SystemOperation;
use mpi::point_to_point as p2p;
use mpi::traits::*;

/// The value of word `i` of the message from `from` to `to`.
fn word(from: i32, to: i32, i: usize) -> u64 {
    ((from as u64) << 48) ^ ((to as u64) << 32) ^ (i as u64).wrapping_mul(0x9e37_79b9)
}

fn main() {
    let universe = mpi::initialize().expect("MPI initialised once");
    let world = universe.world();
    let rank = world.rank();
    let size = world.size();
    assert!(size >= 2, "run with at least 2 ranks");
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;

    // Ring exchange at sizes from empty to past the eager limit (4 MiB).
    for words in [0usize, 1, 1000, 8192, 1 << 19] {
        let out: Vec<u64> = (0..words).map(|i| word(rank, next, i)).collect();
        let mut got = vec![0u64; words];
        p2p::send_receive_into(
            &out[..],
            &world.process_at_rank(next),
            &mut got[..],
            &world.process_at_rank(prev),
        );
        for (i, &w) in got.iter().enumerate() {
            assert_eq!(
                w,
                word(prev, rank, i),
                "rank {rank}: ring word {i} of {words}"
            );
        }
    }

    // Every rank sends to every other at once (immediate sends), and takes
    // messages of a length it does not know in advance (probe, then receive).
    let outs: Vec<(i32, Vec<u64>)> = (0..size)
        .filter(|&p| p != rank)
        .map(|p| {
            (
                p,
                (0..100 + p as usize * 37)
                    .map(|i| word(rank, p, i))
                    .collect(),
            )
        })
        .collect();
    mpi::request::scope(|scope| {
        let requests: Vec<_> = outs
            .iter()
            .map(|(p, out)| {
                world
                    .process_at_rank(*p)
                    .immediate_send_with_tag(scope, &out[..], 5)
            })
            .collect();
        for _ in 1..size {
            let (got, status) = world.any_process().receive_vec_with_tag::<u64>(5);
            let from = status.source_rank();
            assert_eq!(
                got.len(),
                100 + rank as usize * 37,
                "rank {rank}: length from {from}"
            );
            for (i, &w) in got.iter().enumerate() {
                assert_eq!(w, word(from, rank, i), "rank {rank}: word {i} from {from}");
            }
        }
        for request in requests {
            request.wait();
        }
    });

    // Broadcast 1 MiB from the last rank.
    let root = world.process_at_rank(size - 1);
    let mut data = vec![0u64; 1 << 17];
    if rank == size - 1 {
        data.iter_mut()
            .enumerate()
            .for_each(|(i, w)| *w = word(root.rank(), 0, i));
    }
    root.broadcast_into(&mut data[..]);
    for (i, &w) in data.iter().enumerate() {
        assert_eq!(w, word(size - 1, 0, i), "rank {rank}: broadcast word {i}");
    }

    // Allreduce: element i sums to size * i + size * (size - 1) / 2.
    let x: Vec<f64> = (0..50_000).map(|i| f64::from(i + rank)).collect();
    let mut sum = vec![0.0; x.len()];
    world.all_reduce_into(&x[..], &mut sum[..], SystemOperation::sum());
    for (i, &s) in sum.iter().enumerate() {
        let want = f64::from(size) * i as f64 + f64::from(size * (size - 1) / 2);
        assert_eq!(s, want, "rank {rank}: allreduce element {i}");
    }

    // Allgather of the ranks.
    let mut ranks = vec![-1i32; size as usize];
    world.all_gather_into(&rank, &mut ranks[..]);
    assert_eq!(
        ranks,
        (0..size).collect::<Vec<_>>(),
        "rank {rank}: allgather"
    );

    world.barrier();
    println!("RSMPI OK rank {rank} of {size}");
}
