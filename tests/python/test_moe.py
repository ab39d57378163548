"""ncclx.moe under tools/ncclx-run (2 and 3 ranks in CTest):

1. dispatch/combine: experts scale their rows by (expert id + 1); combine must give
   sum over k of weight x (id + 1) x token for every token (dropped pairs: nothing);
2. MoELayer forward and backward against a single-process layer built from the same seed
   over every rank's tokens: outputs, input gradients, expert gradients and the all-reduced
   router gradient agree to 1e-4 relative;
3. all_to_all_v_dynamic with counts that differ per pair of ranks;
4. an expert id out of range raises ncclx.Error on its rank only, and the handle still works.

Exit 0 when every check passed, 1 otherwise, 77 when torch is not installed."""
import sys

from testlib import check, dist, failures, torch

import ncclx
import ncclx.torch
from ncclx.moe import Moe, MoELayer, all_to_all_v_dynamic



def close(a, b):
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def dispatch_combine(comm, rank, n):
    experts, topk, hidden, tokens = 2 * n + 1, 2, 6, 7
    moe = Moe(comm, experts, topk, hidden, torch.float32, max_tokens=tokens)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(tokens, hidden, generator=g)
    ids = torch.randint(-1, experts, (tokens, topk), generator=g, dtype=torch.int32)
    w = torch.rand(tokens, topk, generator=g)
    rows, counts = moe.dispatch(x, ids)
    check(len(counts) == moe.n_local and rows.shape[0] == sum(counts), "counts per local expert")
    at = 0
    for i, c in enumerate(counts):
        rows[at:at + c] *= moe.first_expert + i + 1
        at += c
    out = moe.combine(rows, w)
    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for k in range(topk):
            if ids[t, k] >= 0:
                want[t] += w[t, k] * (ids[t, k] + 1) * x[t]
    check(close(out, want), "combine of scaled rows")
    bad = ids.clone()
    if rank == 0:
        bad[0, 0] = experts + 5
    try:
        moe.dispatch(x, bad)
        check(rank != 0, "an expert id out of range must be refused on its rank")
    except ncclx.Error as e:
        check(rank == 0 and "expert" in str(e), "the refusal names the expert id: %s" % e)
    out2 = moe.combine(moe.dispatch(x, ids)[0], w)  # the handle still works
    check(out2.shape == (tokens, hidden), "dispatch and combine after a refusal")
    moe.close()
    # A handle whose first dispatch is refused on one rank: the exchange ran without the bad
    # pairs everywhere, and the combine reverses it on every rank.
    fresh = Moe(comm, experts, topk, hidden, torch.float32, max_tokens=tokens)
    try:
        rows, _ = fresh.dispatch(x, bad)
    except ncclx.Error:
        rows = None
    if rows is None:
        rows = torch.empty((sum(fresh.last_counts), hidden))
    try:
        fresh.combine(rows, w)
        check(True, "")
    except ncclx.Error as e:
        check(False, "combine after a refused first dispatch: %s" % e)
    fresh.close()


def layer(comm, rank, n):
    experts, topk, hidden, tokens = 4, 2, 8, 10
    dist_layer = MoELayer(comm, experts, topk, hidden, max_tokens=tokens, seed=11)
    xs = [torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(200 + r)) for r in range(n)]
    cs = [torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(300 + r)) for r in range(n)]
    x = xs[rank].clone().requires_grad_(True)
    y = dist_layer(x)
    (y * cs[rank]).sum().backward()
    router_grad = dist_layer.router.weight.grad.clone()
    comm.all_reduce(router_grad)
    # The single-process layer: same seed, every rank's tokens, all experts.
    g = torch.Generator().manual_seed(11)
    router = torch.nn.Linear(hidden, experts, bias=False)
    weights = (torch.randn(experts, hidden, hidden, generator=g) / hidden ** 0.5).requires_grad_(True)
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, hidden, generator=g) / hidden ** 0.5)
    xr = [xi.clone().requires_grad_(True) for xi in xs]
    total = 0
    ys = []
    for r in range(n):
        gates = torch.softmax(router(xr[r]), dim=-1)
        wk, ik = torch.topk(gates, topk, dim=-1)
        wk = wk / wk.sum(dim=-1, keepdim=True)
        yr = torch.zeros(tokens, hidden)
        for k in range(topk):
            yr = yr + wk[:, k:k + 1] * torch.einsum("th,toh->to", xr[r], weights[ik[:, k]])
        ys.append(yr)
        total = total + (yr * cs[r]).sum()
    total.backward()
    check(close(y.detach(), ys[rank].detach()), "MoELayer output equals the single-process layer")
    check(close(x.grad, xr[rank].grad), "input gradient")
    first = dist_layer.moe.first_expert
    for i, p in enumerate(dist_layer.experts):
        check(close(p.grad, weights.grad[first + i]), "gradient of expert %d" % (first + i))
    check(close(router_grad, router.weight.grad), "router gradient (all-reduced)")


def dynamic(comm, rank, n):
    counts = [(rank + p) % 3 + 1 for p in range(n)]  # elements this rank sends to p
    send = torch.cat([torch.full((c,), float(rank * 10 + p)) for p, c in enumerate(counts)])
    maxc = 4
    recv = torch.full((n * maxc,), -1.0)
    got = all_to_all_v_dynamic(comm, send, counts, recv, maxc)
    for p in range(n):
        want = (p + rank) % 3 + 1
        check(got[p] == want, "count from rank %d: %d, expected %d" % (p, got[p], want))
        check(torch.all(recv[p * maxc:p * maxc + want] == p * 10 + rank).item(), "data from rank %d" % p)


def main():
    dist.init_process_group("ncclx")
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = ncclx.torch.comm_of()
    dispatch_combine(comm, rank, n)
    layer(comm, rank, n)
    dynamic(comm, rank, n)
    print("rank %d: %s (%d failures)" % (rank, "PASS" if not failures else "FAIL", len(failures)), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
