"""CommFuse from Python under tools/ncclx-run (2 and 3 ranks in CTest), on the communicator of
the default torch.distributed group (ncclx.torch.comm_of):

1. all_gather_matmul equals cat(all_gather(x)) @ w and matmul_reduce_scatter equals the rows of
   this rank of reduce_scatter(a @ b), for every schedule, to 1e-4 relative (float32);
2. the pieces reach the callbacks whole rows at a time (unit), each block exactly once;
3. an exception in a callback is raised on its rank, and every other rank gets ncclx.Error
   naming the callback (in that call, or in its next when its part was already done); a bad
   argument raises ncclx.Error with a sentence.

Exit 0 when every check passed, 1 otherwise, 77 when torch is not installed."""
import sys

from testlib import check, dist, failures, torch

import ncclx
import ncclx.torch
from ncclx.fuse import Schedule, all_gather_compute, all_gather_matmul, matmul_reduce_scatter

SCHEDULES = [Schedule("sequential"), Schedule("sliced", 3), Schedule("ring_p2p"), Schedule("ring_p2p", 4),
             Schedule("direct_p2p"), Schedule("auto")]


def close(a, b):
    return torch.allclose(a, b, rtol=1e-4, atol=1e-4)


def matmuls(comm, rank, n):
    g = torch.Generator().manual_seed(1234)
    m, k, f = 24, 40, 56
    shards = [torch.randn(m, k, generator=g) for _ in range(n)]
    w = torch.randn(k, f, generator=g)
    want = torch.cat(shards) @ w  # every rank knows every shard: the analytic answer
    for s in SCHEDULES:
        y = all_gather_matmul(comm, shards[rank], w, s)
        check(close(y, want), "all_gather_matmul %s(%d)" % (s.algo, s.slices))
    a = [torch.randn(n * m, k, generator=g) for _ in range(n)]  # rank r's a
    b = [torch.randn(k, f, generator=g) for _ in range(n)]
    full = sum(a[r] @ b[r] for r in range(n))
    for s in SCHEDULES:
        z = matmul_reduce_scatter(comm, a[rank], b[rank], schedule=s)
        check(close(z, full[rank * m:(rank + 1) * m]), "matmul_reduce_scatter %s(%d)" % (s.algo, s.slices))


def pieces(comm, rank, n):
    m, k = 32, 8
    x = torch.full((m, k), float(rank))
    out = torch.empty(n * m, k)
    seen = torch.zeros(n * m * k, dtype=torch.int32)

    def consume(src, off, piece):
        check(off % k == 0 and piece.numel() % k == 0, "pieces are whole rows (%d, %d)" % (off, piece.numel()))
        check(torch.all(piece == src).item(), "piece of rank %d holds its data" % src)
        seen[src * m * k + off: src * m * k + off + piece.numel()] += 1

    all_gather_compute(comm, x, out, consume, Schedule("ring_p2p", 4), unit=k)
    check(torch.all(seen == 1).item(), "every element consumed exactly once")


def failing(comm, rank, n):
    x, w = torch.ones(4, 4), torch.ones(4, 4)
    raised = None
    try:
        def consume(src, off, piece):
            if rank == 1:
                raise KeyError("rank 1's callback fails on purpose")
        all_gather_compute(comm, x, torch.empty(n * 4, 4), consume, Schedule("sequential"))
    except KeyError as e:
        raised = e
    except ncclx.Error as e:
        raised = e
    if rank == 1:
        check(isinstance(raised, KeyError), "the callback's own exception is raised on its rank: %r" % raised)
        return
    if raised is None:  # SEQUENTIAL: this rank's part was done before rank 1's callback ran
        try:
            comm.barrier()
        except ncclx.Error as e:
            raised = e
    check(isinstance(raised, ncclx.Error) and "callback" in str(raised),
          "the other ranks get ncclx.Error naming the callback, in the call or the next: %r" % raised)
    del w


def bad_argument(comm):
    try:
        all_gather_compute(comm, torch.ones(3), torch.empty(3 * comm.nranks), lambda *a: None, Schedule("sliced", 2),
                           unit=2)
        check(False, "count 3 with unit 2 must be refused")
    except ncclx.Error as e:
        check("multiple of the schedule's unit" in str(e), "the error says what is wrong: %s" % e)


def main():
    dist.init_process_group("ncclx")
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = ncclx.torch.comm_of()
    check(comm.nranks == n and comm.rank == rank, "comm_of gives the group's communicator")
    matmuls(comm, rank, n)
    pieces(comm, rank, n)
    bad_argument(comm)
    if n >= 2:
        failing(comm, rank, n)  # last: it fails the communicator on every rank
    print("rank %d: %s (%d failures)" % (rank, "PASS" if not failures else "FAIL", len(failures)), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
