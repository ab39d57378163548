"""An MoE layer trained on ncclx: ncclx.moe.MoELayer (router, top-2 gating, one expert Linear
per expert, experts split over the ranks) fits a fixed random target for a few SGD steps.
The router's gradients are all-reduced (it is replicated); each expert's gradient is already
complete on its rank (the backward's dispatch brings every rank's contribution).

Run: tools/ncclx-run -np 2 /usr/bin/python3 examples/torch/moe_layer.py [--steps 20]
Exit 0 when the loss fell by half, 1 otherwise."""
import argparse
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("SKIPPED: torch is not installed for %s" % sys.executable)
    sys.exit(77)

import ncclx.torch
from ncclx.moe import MoELayer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    dist.init_process_group("ncclx")
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = ncclx.torch.comm_of()
    layer = MoELayer(comm, args.experts, 2, args.hidden, max_tokens=args.tokens, seed=1)
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(args.tokens, args.hidden, generator=g)
    target = torch.randn(args.tokens, args.hidden, generator=g) * 0.1
    opt = torch.optim.SGD(layer.parameters(), lr=2.0)
    first = last = None
    for step in range(args.steps):
        opt.zero_grad()
        loss = ((layer(x) - target) ** 2).mean()
        loss.backward()
        layer.router.weight.grad /= n
        comm.all_reduce(layer.router.weight.grad)  # the replicated router: average its gradient
        opt.step()
        total = loss.detach().clone()
        comm.all_reduce(total)
        first = total.item() / n if first is None else first
        last = total.item() / n
    ok = last < first / 2
    if rank == 0:
        print("MoE layer, %d ranks, %d experts: loss %.4f -> %.4f after %d steps: %s" %
              (n, args.experts, first, last, args.steps, "trained" if ok else "DID NOT TRAIN"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
