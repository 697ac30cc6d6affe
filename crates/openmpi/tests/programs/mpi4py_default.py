"""mpi4py at its defaults: `from mpi4py import MPI` initialises MPI with
MPI_THREAD_MULTIPLE. Point-to-point (objects and buffers) around a ring,
and collectives, each result checked. Prints "OK mpi4py rank R of N
thread=T" per rank."""

import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
provided = MPI.Query_thread()
if provided != MPI.THREAD_MULTIPLE:
    sys.exit(f"rank {rank}: thread level {provided}, not MPI_THREAD_MULTIPLE")

right, left = (rank + 1) % size, (rank - 1) % size
for n in (0, 1, 100, 5000, 100_000, 1_500_000):
    out = bytearray((rank * 7 + i) % 251 for i in range(n))
    got = comm.sendrecv({"from": rank, "data": bytes(out)}, dest=right, source=left)
    want = bytes((left * 7 + i) % 251 for i in range(n))
    assert got == {"from": left, "data": want}, f"object ring of {n} bytes"
    buf = bytearray(n)
    comm.Sendrecv(out, dest=right, recvbuf=buf, source=left)
    assert buf == want, f"buffer ring of {n} bytes"

assert comm.allreduce(rank) == size * (size - 1) // 2
assert comm.bcast("hello" if rank == 0 else None, root=0) == "hello"
assert comm.allgather(rank * rank) == [r * r for r in range(size)]
assert comm.alltoall([rank * 100 + r for r in range(size)]) == [
    r * 100 + rank for r in range(size)
]
comm.Barrier()
print(f"OK mpi4py rank {rank} of {size} thread={provided}", flush=True)
