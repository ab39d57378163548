"""ncclx's features from Python (issue 25) on the communicators of torch.distributed's own
groups, under tools/ncclx-run (python.features.np2 / np3). References are analytic or plain
torch (torch.distributed on the same group), compared to 1e-4 relative:

1. comm_of: the default group's and a subgroup's ncclx.Comm; a gloo group, a non-member refused;
2. MoE dispatch -> combine round trip: each rank receives exactly the tokens routed to its
   experts (source rank, token, k order), identity experts give sum over kept k of weight x
   token; float32 and float64, a rank without tokens, an expert capacity (dropped counts);
3. MoELayer, two SGD steps: output and input, expert and router gradients equal a
   single-process layer over every rank's tokens (weights taken from the distributed one),
   also with fewer experts than ranks (rank 0 owns none) and an input without gradient;
4. all_to_all_v_dynamic against dist.all_to_all_single with the same splits;
5. CommFuse both directions against all_gather + matmul and matmul + reduce_scatter done by
   torch.distributed on the same group (default group and a subgroup; float32 and float64),
   and of empty blocks;
6. bad arguments: ncclx.Error with the library's sentence, ValueError for what the Python
   layer checks, and the communicator still usable;
7. a stalled rank (the last) on a group with a 3 s timeout, then a killed one (os._exit
   inside a loop of all_reduce) on a group with NCCLX_CORE_TIMEOUT_S=5: the others raise
   ncclx.Error naming that rank and its pid, within the timeout.

Each rank exits 0 when its checks passed (the killed rank with os._exit(0), so that the
launcher waits for the others' verdicts), 1 otherwise, 77 when torch is not installed."""
import os
import re
import sys
import time
from datetime import timedelta

from testlib import RANK, check, checked, dist, failures, torch

import ncclx
import ncclx.torch
from ncclx.fuse import Schedule, all_gather_matmul, matmul_reduce_scatter
from ncclx.moe import Moe, MoELayer, all_to_all_v_dynamic

def close(a, b):
    """Equal to 1e-4 relative (an absolute floor of 1e-5 of the largest element, for zeros)."""
    scale = b.abs().max().item() if b.numel() else 1.0
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, scale))


def raises(fn, kind, *words):
    """fn() must raise kind, with every word in its message; returns the message."""
    try:
        fn()
    except kind as e:
        missing = [w for w in words if w not in str(e)]
        check(not missing, "%s's message lacks %s: %s" % (kind.__name__, missing, e))
        return str(e)
    except Exception as e:  # noqa: B902 - any other kind is the failure reported below
        check(False, "expected %s, got %s: %s" % (kind.__name__, type(e).__name__, e))
        return None
    check(False, "expected %s, nothing raised (%s)" % (kind.__name__, words))
    return None


def comm_of_groups(rank, n):
    comm = ncclx.torch.comm_of()
    check((comm.rank, comm.nranks) == (rank, n), "comm_of() is the default group's communicator")
    check(ncclx.torch.comm_of(dist.group.WORLD) is comm, "comm_of(WORLD) is the same")
    sub = dist.new_group([0, 1], backend="ncclx")
    gloo = dist.new_group(backend="gloo")
    raises(lambda: ncclx.torch.comm_of(gloo), ValueError, "not ncclx")
    if rank < 2:
        c = ncclx.torch.comm_of(sub)
        check((c.rank, c.nranks) == (rank, 2) and c is not comm, "a subgroup has its own communicator")
    else:
        raises(lambda: ncclx.torch.comm_of(sub), ValueError, "not a member")
    return comm, sub


# ---- MoE ----

def routing(r, tokens, experts, topk, dtype):
    """Rank r's tokens, expert ids (some -1) and gating weights: every rank can rebuild them."""
    g = torch.Generator().manual_seed(1000 + r)
    x = torch.randn(tokens, 6, generator=g).to(dtype)
    ids = torch.randint(-1, experts, (tokens, topk), generator=g, dtype=torch.int32)
    return x, ids, torch.rand(tokens, topk, generator=g)


def moe_round_trip(comm, rank, n, dtype, capacity):
    experts, topk = n + 2, 2
    sizes = [5 + 3 * r if r != n - 1 else 0 for r in range(n)]  # the last rank sends no tokens
    data = [routing(r, sizes[r], experts, topk, dtype) for r in range(n)]
    moe = Moe(comm, experts, topk, 6, dtype, max_tokens=max(sizes), expert_capacity=capacity)
    x, ids, w = data[rank]
    rows, counts = moe.dispatch(x, ids)
    what = "%s capacity %d" % (dtype, capacity)
    # Expected: per local expert, pairs by source rank, token, k; at most `capacity` per source.
    want, want_counts = [], []
    for e in range(moe.first_expert, moe.first_expert + moe.n_local):
        got = []
        for xs, ids_s, _ in data:
            mine = [xs[t] for t in range(ids_s.shape[0]) for k in range(topk) if ids_s[t, k] == e]
            got += mine[:capacity] if capacity else mine
        want += got
        want_counts.append(len(got))
    check(counts == want_counts, "dispatch counts %s, expected %s (%s)" % (counts, want_counts, what))
    check(want_counts != counts or torch.equal(rows, torch.stack(want) if want else rows[:0]),
          "dispatched rows are the routed tokens (%s)" % what)
    # Kept pairs: the first `capacity` of each expert in token order on this rank.
    kept, seen = torch.zeros(ids.shape, dtype=torch.bool), {}
    for t in range(ids.shape[0]):
        for k in range(topk):
            e = int(ids[t, k])
            if e >= 0:
                seen[e] = seen.get(e, 0) + 1
                kept[t, k] = not capacity or seen[e] <= capacity
    dropped = [max(0, seen.get(e, 0) - capacity) if capacity else 0 for e in range(experts)]
    check(moe.dropped() == dropped, "dropped %s, expected %s (%s)" % (moe.dropped(), dropped, what))
    out = moe.combine(rows, w)  # identity experts
    check(close(out, (w * kept).sum(dim=1, keepdim=True).to(dtype) * x), "combine of the round trip (%s)" % what)
    moe.close()


def full_experts(comm, layer, experts, hidden):
    """Every expert's weight: each rank fills its own, an all-reduce sums them."""
    w = torch.zeros(experts, hidden, hidden)
    for i, p in enumerate(layer.experts):
        w[layer.moe.first_expert + i] = p.detach()
    comm.all_reduce(w)
    return w


def moe_layer(comm, rank, n, experts, topk, x_grad):
    hidden = 12
    sizes = [7 + 2 * r for r in range(n)]
    layer = MoELayer(comm, experts, topk, hidden, max_tokens=max(sizes), seed=5)
    router = layer.router.weight.detach().clone()
    weights = full_experts(comm, layer, experts, hidden)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    for step in range(2):
        xs = [torch.randn(sizes[r], hidden, generator=torch.Generator().manual_seed(10 * step + r)) for r in range(n)]
        cs = [torch.randn(sizes[r], hidden, generator=torch.Generator().manual_seed(99 + 10 * step + r))
              for r in range(n)]
        x = xs[rank].clone().requires_grad_(x_grad)
        opt.zero_grad()
        y = layer(x)
        (y * cs[rank]).sum().backward()
        comm.all_reduce(layer.router.weight.grad)  # replicated: the sum of every rank's share
        # Single process, plain torch: every rank's tokens through every expert.
        rw, ew = router.clone().requires_grad_(True), weights.clone().requires_grad_(True)
        xr = [xi.clone().requires_grad_(True) for xi in xs]
        total, ys = 0, []
        for r in range(n):
            wk, ik = torch.topk(torch.softmax(xr[r] @ rw.t(), dim=-1), topk, dim=-1)
            wk = wk / wk.sum(dim=-1, keepdim=True)
            ys.append(sum(wk[:, k:k + 1] * torch.einsum("th,toh->to", xr[r], ew[ik[:, k]]) for k in range(topk)))
            total = total + (ys[r] * cs[r]).sum()
        total.backward()
        what = "step %d, %d experts, top-%d" % (step, experts, topk)
        check(close(y.detach(), ys[rank].detach()), "MoELayer output, " + what)
        check(close(x.grad, xr[rank].grad) if x_grad else x.grad is None, "MoELayer input gradient, " + what)
        for i, p in enumerate(layer.experts):
            e = layer.moe.first_expert + i
            check(close(p.grad, ew.grad[e]), "expert %d gradient, %s" % (e, what))
        check(close(layer.router.weight.grad, rw.grad), "router gradient, " + what)
        opt.step()
        with torch.no_grad():  # the same SGD step on the reference
            router -= 0.5 * rw.grad
            weights -= 0.5 * ew.grad


def dynamic_vs_torch(comm, rank, n):
    counts = [(3 * rank + p) % 4 for p in range(n)]  # rows of 3 for rank p, some 0
    send = torch.randn(sum(counts), 3, generator=torch.Generator().manual_seed(rank))
    recv_counts = [(3 * p + rank) % 4 for p in range(n)]
    want = torch.empty(sum(recv_counts), 3)
    dist.all_to_all_single(want, send, output_split_sizes=recv_counts, input_split_sizes=counts)
    cap = 4 * 3
    recv = torch.zeros(n * cap)
    got = all_to_all_v_dynamic(comm, send.reshape(-1), [c * 3 for c in counts], recv, cap)
    check(got == [c * 3 for c in recv_counts], "all_to_all_v_dynamic counts %s" % got)
    blocks = torch.cat([recv[p * cap:p * cap + got[p]] for p in range(n)])
    check(torch.equal(blocks, want.reshape(-1)), "all_to_all_v_dynamic equals all_to_all_single")


# ---- CommFuse ----

def fuse_vs_torch(group, comm, dtype, seed):
    n, rank = comm.nranks, comm.rank
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(6, 10, generator=g).to(dtype)
    w = torch.randn(10, 8, generator=torch.Generator().manual_seed(seed)).to(dtype)  # the same on every rank
    a = torch.randn(6 * n, 10, generator=g).to(dtype)
    b = torch.randn(10, 8, generator=g).to(dtype)
    gathered = torch.empty(6 * n, 10, dtype=dtype)
    dist.all_gather_into_tensor(gathered, x, group=group)
    want_ag = gathered @ w
    want_rs = torch.empty(6, 8, dtype=dtype)
    dist.reduce_scatter_tensor(want_rs, a @ b, group=group)
    for s in (Schedule("ring_p2p"), Schedule("sliced", 3), Schedule("direct_p2p"), Schedule("auto")):
        what = "%s ranks %d %s %s" % (dtype, n, s.algo, s.slices)
        check(close(all_gather_matmul(comm, x, w, s), want_ag), "all_gather_matmul = all_gather + matmul, " + what)
        check(close(matmul_reduce_scatter(comm, a, b, schedule=s), want_rs),
              "matmul_reduce_scatter = matmul + reduce_scatter, " + what)
        # Empty blocks: no callback, empty results (AUTO once crashed the library on them).
        empty = torch.empty(0, 10, dtype=dtype)
        check(all_gather_matmul(comm, empty, w, s).shape == (0, 8), "all_gather_matmul of nothing, " + what)
        check(matmul_reduce_scatter(comm, empty, b, schedule=s).shape == (0, 8),
              "matmul_reduce_scatter of nothing, " + what)


# ---- errors ----

def bad_arguments(comm, rank, n):
    """Every rank passes the same bad argument, so no rank waits for another."""
    moe = Moe(comm, 4, 2, 6, torch.float32, max_tokens=3)
    x, ids, w = routing(rank, 5, 4, 2, torch.float32)
    e = raises(lambda: moe.dispatch(x, ids), ncclx.Error, "nTokens 5", "maxTokens 3")
    check(e is None or re.match(r"ncclx: \w.* \w+ \w+", e), "a sentence: %s" % e)
    raises(lambda: Moe(comm, 0, 1, 6, torch.float32, max_tokens=3), ncclx.Error, "nExperts")
    raises(lambda: all_gather_matmul(comm, torch.ones(4, 4), torch.ones(4, 4), Schedule("ring_p2p", -1)),
           ncclx.Error, "RING_P2P", "-1")
    # What the C calls cannot check (sizes of the tensors behind pointers): ValueError first.
    raises(lambda: moe.dispatch(x[:3, :5].contiguous(), ids[:3]), ValueError, "tokens", "(3, 5)")
    raises(lambda: all_gather_matmul(comm, torch.ones(4, 3), torch.ones(4, 4)), ValueError, "cannot multiply")
    raises(lambda: all_to_all_v_dynamic(comm, torch.ones(4), [1] * n, torch.ones(1), 2), ValueError, "recv")
    # Still usable: a dispatch and combine, and a collective of torch.distributed.
    rows, _ = moe.dispatch(x[:3], ids[:3])
    check(moe.combine(rows, w[:3]).shape == (3, 6), "the handle works after the refusals")
    one = torch.ones(1)
    dist.all_reduce(one)
    check(one.item() == n, "the communicator works after the refusals")
    moe.close()


def pids(n):
    p = torch.zeros(n, dtype=torch.int64)
    p[RANK] = os.getpid()
    dist.all_reduce(p)
    return p.tolist()


def names(msg, victim, pid):
    return msg is not None and re.search(r"\brank %d\b.*\bpid %d\b" % (victim, pid), msg) is not None


def stalled_rank(rank, n, pid):
    """The last rank stops calling on a group whose timeout is 3 s; the others must raise at
    about 3 s. The stalled rank waits (store) until they have, then gets the abort notice."""
    victim, store = n - 1, dist.distributed_c10d._get_default_store()
    group = dist.new_group(backend="ncclx", timeout=timedelta(seconds=3))
    x, err, waited = torch.ones(64), None, 0.0
    try:
        for i in range(1000):
            if rank == victim and i == 10:
                store.wait(["stall_seen_%d" % r for r in range(n - 1)], timedelta(seconds=30))
            t0 = time.monotonic()
            dist.all_reduce(x, group=group)
    except ncclx.Error as e:
        err, waited = str(e), time.monotonic() - t0
    if rank != victim:
        store.set("stall_seen_%d" % rank, "1")
        check(names(err, victim, pid) and "timeout" in err, "a stalled rank is named: %s" % err)
        check(2.0 < waited < 8.0, "raised after %.1f s with a 3 s timeout" % waited)
    else:
        check(err is not None, "the stalled rank gets the others' abort notice")


def killed_rank(rank, n, pid):
    """The last rank exits inside a loop of all_reduce on a group with NCCLX_CORE_TIMEOUT_S=5."""
    victim = n - 1
    os.environ["NCCLX_CORE_TIMEOUT_S"] = "5"  # read when the group's communicator is created
    group = dist.new_group(backend="ncclx")
    del os.environ["NCCLX_CORE_TIMEOUT_S"]
    x, err, waited = torch.ones(4096), None, 0.0
    try:
        for i in range(100000):
            if rank == victim and i == 20:
                print("rank %d of %d: %d checks, %s; exits now (killed-rank test)" % (
                    rank, n, checked[0], "%d FAILED" % len(failures) if failures else "passed"), flush=True)
                os._exit(1 if failures else 0)
            t0 = time.monotonic()
            dist.all_reduce(x, group=group)
    except ncclx.Error as e:
        err, waited = str(e), time.monotonic() - t0
    check(names(err, victim, pid) and "exited" in err, "a killed rank is named: %s" % err)
    check(waited < 5.0, "raised %.1f s after the last success, within the 5 s timeout" % waited)


def main():
    os.environ.pop("NCCLX_CORE_TIMEOUT_S", None)  # the groups' timeouts below are the test's own
    dist.init_process_group("ncclx", timeout=timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    t0 = time.monotonic()
    comm, sub = comm_of_groups(rank, n)
    for dtype in (torch.float32, torch.float64):
        for capacity in (0, 2):
            moe_round_trip(comm, rank, n, dtype, capacity)
    moe_layer(comm, rank, n, n + 1, 2, x_grad=True)
    # Rank 0 owns no expert and its input needs no gradient: it must still take part in the
    # backward's exchanges.
    moe_layer(comm, rank, n, n - 1, min(2, n - 1), x_grad=False)
    dynamic_vs_torch(comm, rank, n)
    for dtype in (torch.float32, torch.float64):
        fuse_vs_torch(None, comm, dtype, 7)
        if rank < 2:
            fuse_vs_torch(sub, ncclx.torch.comm_of(sub), dtype, 8)
    bad_arguments(comm, rank, n)
    pid = pids(n)[n - 1]
    stalled_rank(rank, n, pid)
    killed_rank(rank, n, pid)  # last: the victim exits, the communicators fail
    print("rank %d of %d: %d checks, %s in %.1f s" % (rank, n, checked[0], "%d FAILED" % len(failures) if failures
                                                      else "passed", time.monotonic() - t0), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
