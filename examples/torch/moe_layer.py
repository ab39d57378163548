"""An MoE layer trained on ncclx: ncclx.moe.MoELayer (router, top-2 gating, one expert Linear
per expert, experts split over the ranks) fits a fixed random target for a few SGD steps.
The router's gradients are all-reduced (it is replicated); each expert's gradient is already
complete on its rank (the backward's dispatch brings every rank's contribution).

The first step is checked against plain torch on one process: the same layer (its experts
gathered from the ranks) over every rank's tokens must give this rank's output and every
gradient to 1e-4 relative.

Run: tools/ncclx-run -np 2 /usr/bin/python3 examples/torch/moe_layer.py [--steps 20]
Exit 0 when the check passed and the loss fell by half, 1 otherwise."""
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


def data(rank, tokens, hidden):
    """Rank r's tokens and target: every rank can rebuild every other's."""
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(tokens, hidden, generator=g)
    return x, torch.randn(tokens, hidden, generator=g) * 0.1


def plain_torch(router, experts, xs, targets, topk):
    """One process, no ncclx: every rank's loss through the full layer; returns the outputs
    and the gradients of the router and of every expert (their sum over the ranks' losses)."""
    router = router.clone().requires_grad_(True)
    experts = experts.clone().requires_grad_(True)
    ys, total = [], 0
    for x, target in zip(xs, targets):
        w, ids = torch.topk(torch.softmax(x @ router.t(), dim=-1), topk, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        y = sum(w[:, k:k + 1] * torch.einsum("th,toh->to", x, experts[ids[:, k]]) for k in range(topk))
        ys.append(y.detach())
        total = total + ((y - target) ** 2).mean()
    total.backward()
    return ys, router.grad, experts.grad


def check_first_step(layer, rank, n, y, args, experts):
    xs, targets = zip(*[data(r, args.tokens, args.hidden) for r in range(n)])
    ys, router_grad, expert_grads = plain_torch(layer.router.weight.detach(), experts, xs, targets, 2)
    router_grad /= n  # the training loop averages the router's gradient over the ranks

    def close(a, b):
        return torch.allclose(a, b, rtol=1e-4, atol=1e-6 * max(1.0, b.abs().max().item()))

    bad = [] if close(y.detach(), ys[rank]) else ["output"]
    bad += [] if close(layer.router.weight.grad, router_grad) else ["router gradient"]
    bad += ["expert %d gradient" % (layer.moe.first_expert + i) for i, p in enumerate(layer.experts)
            if not close(p.grad, expert_grads[layer.moe.first_expert + i])]
    if bad:
        print("rank %d: differs from plain torch: %s" % (rank, ", ".join(bad)), flush=True)
    return not bad


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
    # Every expert's weight for the check: each rank fills its own, an all-reduce sums them.
    experts = torch.zeros(args.experts, args.hidden, args.hidden)
    for i, p in enumerate(layer.experts):
        experts[layer.moe.first_expert + i] = p.detach()
    comm.all_reduce(experts)
    x, target = data(rank, args.tokens, args.hidden)
    opt = torch.optim.SGD(layer.parameters(), lr=2.0)
    first = last = None
    matches = True
    for step in range(args.steps):
        opt.zero_grad()
        y = layer(x)
        loss = ((y - target) ** 2).mean()
        loss.backward()
        layer.router.weight.grad /= n
        comm.all_reduce(layer.router.weight.grad)  # the replicated router: average its gradient
        if step == 0:
            matches = check_first_step(layer, rank, n, y, args, experts)
        opt.step()
        total = loss.detach().clone()
        comm.all_reduce(total)
        first = total.item() / n if first is None else first
        last = total.item() / n
    ok = matches and last < first / 2
    if rank == 0:
        print("MoE layer, %d ranks, %d experts: first step %s plain torch; loss %.4f -> %.4f after %d steps: %s" %
              (n, args.experts, "equals" if matches else "DIFFERS FROM", first, last, args.steps,
               "trained" if ok else "FAILED"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
