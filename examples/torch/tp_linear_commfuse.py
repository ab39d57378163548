"""A tensor-parallel linear layer pair with CommFuse, checked against plain torch.

Sequence-parallel activations x (m rows per rank) go through a column-parallel linear w1 (each
rank holds f/n of its columns) and a row-parallel linear w2 (each rank holds f/n of its rows):

    h = all_gather(x) @ w1_shard            ncclx.fuse.all_gather_matmul: rows multiplied as they arrive
    y = reduce_scatter(h @ w2_shard)        ncclx.fuse.matmul_reduce_scatter: rows sent as computed

Run: tools/ncclx-run -np 2 /usr/bin/python3 examples/torch/tp_linear_commfuse.py [--schedule ring_p2p]
Exit 0 when the output equals the unsharded computation (1e-4 relative), 1 otherwise."""
import argparse
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("SKIPPED: torch is not installed for %s" % sys.executable)
    sys.exit(77)

import ncclx.torch
from ncclx.fuse import Schedule, all_gather_matmul, matmul_reduce_scatter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="ring_p2p", help="sequential, sliced, ring_p2p, direct_p2p or auto")
    ap.add_argument("--rows", type=int, default=256, help="activation rows per rank")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1536, help="divisible by the rank count")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    dist.init_process_group("ncclx")
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = ncclx.torch.comm_of()
    g = torch.Generator().manual_seed(7)  # every rank builds the same full tensors, keeps its shard
    x_all = torch.randn(n * args.rows, args.hidden, generator=g)
    w1 = torch.randn(args.hidden, args.ffn, generator=g) / args.hidden ** 0.5
    w2 = torch.randn(args.ffn, args.hidden, generator=g) / args.ffn ** 0.5
    cols = args.ffn // n
    x = x_all[rank * args.rows:(rank + 1) * args.rows]
    w1_shard, w2_shard = w1[:, rank * cols:(rank + 1) * cols], w2[rank * cols:(rank + 1) * cols].contiguous()
    sched = Schedule(args.schedule, 2 if args.schedule == "sliced" else 0)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        h = torch.relu(all_gather_matmul(comm, x, w1_shard.contiguous(), sched))
        y = matmul_reduce_scatter(comm, h, w2_shard, schedule=sched)
    per_iter = (time.perf_counter() - t0) / args.iters * 1e3
    want = (torch.relu(x_all @ w1) @ w2)[rank * args.rows:(rank + 1) * args.rows]
    ok = torch.allclose(y, want, rtol=1e-4, atol=1e-4)
    print("rank %d: schedule %s, %.2f ms per layer pair, output %s" %
          (rank, args.schedule, per_iter, "matches the unsharded layer" if ok else "DIFFERS"), flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
