"""The torch.distributed backend "ncclx" under tools/ncclx-run (2 and 3 ranks in CTest):

1. every op torch.distributed has for a backend, on CPU tensors, against analytic results;
   every ReduceOp ncclx has, and a clear error for one it lacks (BAND);
2. DDP training of a small model, the same steps on a gloo group and on the ncclx default
   group: the parameters must agree to 1e-4 relative;
3. a subgroup through new_group.

Exit 0 when every check passed, 1 otherwise, 77 (CTest's skip) when torch is not installed."""
import os
import sys

from testlib import check, dist, failures, torch

import ncclx.torch  # noqa: F401  registers the backend



def collectives(rank, n):
    tri = n * (n + 1) / 2  # sum of rank + 1 over ranks
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16):
        x = torch.full((37,), rank + 1, dtype=dt)
        dist.all_reduce(x)
        check(torch.all(x == tri).item(), "all_reduce sum %s" % dt)
    for op, want in ((dist.ReduceOp.PRODUCT, float(torch.arange(1, n + 1).prod())), (dist.ReduceOp.MIN, 1.0),
                     (dist.ReduceOp.MAX, float(n)), (dist.ReduceOp.AVG, tri / n)):
        x = torch.full((5,), float(rank + 1))
        dist.all_reduce(x, op=op)
        check(torch.allclose(x, torch.full((5,), want)), "all_reduce %s" % op)
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)
        check(False, "BAND must raise")
    except Exception as e:  # the backend's ValueError, as torch passes it on
        check("BAND" in str(e), "BAND's error names the op: %s" % e)
    w = dist.all_reduce(torch.ones(3), async_op=True)
    # (Work.exception() of torch 1.13 cannot be called from Python for any backend: its binding
    # returns a std::exception_ptr pybind11 cannot convert.)
    check(w.wait() and w.is_completed(), "async work")
    b = torch.arange(10, dtype=torch.float32) if rank == n - 1 else torch.zeros(10)
    dist.broadcast(b, src=n - 1)
    check(torch.equal(b, torch.arange(10, dtype=torch.float32)), "broadcast")
    r = torch.full((4,), float(rank))
    dist.reduce(r, dst=0)
    if rank == 0:
        check(torch.all(r == n * (n - 1) / 2).item(), "reduce")
    outs = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), float(rank)))
    check(all(torch.all(o == i).item() for i, o in enumerate(outs)), "all_gather list")
    big = torch.zeros(3 * n)
    dist._all_gather_base(big, torch.full((3,), float(rank)))
    check(torch.equal(big, torch.arange(n).repeat_interleave(3).float()), "_all_gather_base")
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(rank + d)) for d in range(n)])
    check(torch.all(out == n * rank + n * (n - 1) / 2).item(), "reduce_scatter list")
    out = torch.zeros(2)
    dist._reduce_scatter_base(out, torch.arange(2 * n, dtype=torch.float32))
    check(torch.equal(out, torch.tensor([2 * rank, 2 * rank + 1], dtype=torch.float32) * n), "_reduce_scatter_base")
    a2a = torch.zeros(n)
    dist.all_to_all_single(a2a, torch.arange(n, dtype=torch.float32) + 10 * rank)
    check(torch.equal(a2a, torch.arange(n, dtype=torch.float32) * 10 + rank), "all_to_all_single")
    # Splits: rank r sends r + 1 rows to every peer (rows of 2).
    ins = torch.full(((rank + 1) * n, 2), float(rank))
    outv = torch.zeros((sum(s + 1 for s in range(n)), 2))
    dist.all_to_all_single(outv, ins, output_split_sizes=[s + 1 for s in range(n)], input_split_sizes=[rank + 1] * n)
    want = torch.cat([torch.full((s + 1, 2), float(s)) for s in range(n)])
    check(torch.equal(outv, want), "all_to_all_single with splits")
    outl = [torch.zeros(2) for _ in range(n)]
    dist.all_to_all(outl, [torch.full((2,), float(rank * 10 + d)) for d in range(n)])
    check(all(torch.all(o == s * 10 + rank).item() for s, o in enumerate(outl)), "all_to_all list")
    if n >= 2:
        if rank == 0:
            dist.send(torch.arange(4, dtype=torch.float32), dst=1)
        elif rank == 1:
            got = torch.zeros(4)
            dist.recv(got, src=0)
            check(torch.equal(got, torch.arange(4, dtype=torch.float32)), "send/recv")
    dist.barrier()


def ddp(rank, n, gloo):
    """The same model, data and steps under DDP on ncclx (default group) and on gloo."""
    params = []
    for group in (None, gloo):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        for _ in range(20):
            x = torch.randn(8, 16, generator=gen)
            y = torch.randn(8, 4, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp_model(x), y).backward()
            opt.step()
        params.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    rel = ((params[0] - params[1]).abs().max() / params[1].abs().max()).item()
    check(rel < 1e-4, "DDP on ncclx vs gloo: relative difference %.2e" % rel)
    # And the ranks agree with each other.
    mine = params[0].clone()
    dist.broadcast(mine, src=0)
    check(torch.allclose(mine, params[0], rtol=0, atol=0), "DDP parameters equal on every rank")
    return rel


def subgroup(rank, n):
    members = list(range(0, n, 2))  # even ranks
    g = dist.new_group(members, backend="ncclx")
    if rank in members:
        x = torch.ones(3)
        dist.all_reduce(x, group=g)
        check(torch.all(x == len(members)).item(), "new_group all_reduce")


def step(what):
    if os.environ.get("NCCLX_TEST_VERBOSE"):
        print("rank %d: %s" % (dist.get_rank(), what), flush=True)


def main():
    if os.environ.get("NCCLX_TEST_VERBOSE"):
        import faulthandler
        faulthandler.dump_traceback_later(25, exit=True)
    dist.init_process_group("ncclx")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    step("collectives")
    collectives(rank, n)
    step("ddp")
    rel = ddp(rank, n, gloo)
    step("subgroup")
    subgroup(rank, n)
    dist.barrier()
    print("rank %d of %d: %s (DDP ncclx vs gloo relative difference %.1e)" %
          (rank, n, "FAILED: %d checks" % len(failures) if failures else "passed", rel), flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
