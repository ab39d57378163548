"""Mixture of experts on ncclx (docs/moe.md): dispatch and combine on torch tensors, and an MoE
layer module with autograd.

    from ncclx.moe import Moe, MoELayer
    moe = Moe(comm, n_experts=8, topk=2, hidden=512, dtype=torch.float32, max_tokens=1024)
    expert_in, counts = moe.dispatch(tokens, expert_ids)   # rows grouped by local expert
    out = moe.combine(expert_out, weights)                 # sum over k of weight x expert row

    layer = MoELayer(comm, n_experts=8, topk=2, hidden=512)  # router + this rank's experts
    y = layer(x)                                             # forward and backward

Experts are split contiguously over the ranks (rank r owns n_experts * r / n ..). Calls run
on the calling thread and return when done; errors raise ncclx.Error with the library's
sentence.
"""
import ctypes

import ncclx

__all__ = ["Moe", "MoELayer", "all_to_all_v_dynamic"]

_L = ncclx.library
_sz = ctypes.c_size_t


class _MoeConfigC(ctypes.Structure):
    _fields_ = [("size", _sz), ("nExperts", ctypes.c_int), ("topk", ctypes.c_int), ("hidden", _sz),
                ("datatype", ctypes.c_int), ("maxTokens", _sz), ("maxRecvTokens", _sz), ("expertCapacity", _sz)]


_vp, _i = ctypes.c_void_p, ctypes.c_int
for _name, _args in {
    "ncclxMoeCreate": [ctypes.POINTER(_vp), ctypes.POINTER(_MoeConfigC), _vp],
    "ncclxMoeDestroy": [_vp],
    "ncclxMoeLocalExperts": [_vp, ctypes.POINTER(_i), ctypes.POINTER(_i)],
    "ncclxMoeDispatch": [_vp, _vp, _sz, _vp, _vp, ctypes.POINTER(_sz), _vp],
    "ncclxMoeCombine": [_vp, _vp, _vp, _vp, _vp],
    "ncclxMoeDroppedCounts": [_vp, ctypes.POINTER(_sz)],
    "ncclxAllToAllvDynamic": [_vp, ctypes.POINTER(_sz), _vp, _sz, ctypes.POINTER(_sz), _i, _vp, _vp],
}.items():
    _f = getattr(_L, _name)
    _f.argtypes, _f.restype = _args, ctypes.c_int


def all_to_all_v_dynamic(comm, send, send_counts, recv, max_recv_count):
    """ncclxAllToAllvDynamic: send holds this rank's blocks back to back (send_counts[p] elements
    for rank p); the block from rank p lands at recv[p * max_recv_count:]. Returns the received
    counts, one per rank."""
    p, have, t = ncclx.buffer(send)
    q, room, rt = ncclx.buffer(recv)
    n = comm.nranks
    # The C call trusts these sizes: check them here rather than read or write past a tensor.
    if len(send_counts) != n or sum(send_counts) > have:
        raise ValueError("ncclx.moe.all_to_all_v_dynamic: %d send counts summing to %d for %d ranks and %d elements"
                         % (len(send_counts), sum(send_counts), n, have))
    if room < n * max_recv_count or rt != t:
        raise ValueError("ncclx.moe.all_to_all_v_dynamic: recv must hold %d x %d elements of send's dtype"
                         % (n, max_recv_count))
    sc = (_sz * n)(*send_counts)
    rc = (_sz * n)()
    comm._ck(_L.ncclxAllToAllvDynamic(p, sc, q, max_recv_count, rc, t, comm._comm, None))
    return list(rc)


class Moe:
    """An ncclxMoe_t handle: the routing between a dispatch and its combine, on comm."""

    def __init__(self, comm, n_experts, topk, hidden, dtype, max_tokens, max_recv_tokens=None, expert_capacity=0):
        import torch

        self.comm, self.topk, self.hidden, self.dtype = comm, topk, hidden, dtype
        self.n_experts, self.max_tokens = n_experts, max_tokens
        # Worst case without a capacity: every pair of every rank lands here.
        self.max_recv = max_recv_tokens if max_recv_tokens is not None else comm.nranks * max_tokens * topk
        cfg = _MoeConfigC(ctypes.sizeof(_MoeConfigC), n_experts, topk, hidden,
                          ncclx.buffer(torch.empty(0, dtype=dtype))[2], max_tokens, self.max_recv, expert_capacity)
        h = _vp()
        comm._ck(_L.ncclxMoeCreate(ctypes.byref(h), ctypes.byref(cfg), comm._comm))
        self._h = h
        first, count = _i(), _i()
        comm._ck(_L.ncclxMoeLocalExperts(h, ctypes.byref(first), ctypes.byref(count)))
        self.first_expert, self.n_local = first.value, count.value

    def dispatch(self, tokens, expert_ids):
        """tokens (T, hidden), expert_ids (T, topk) int32 (-1: drop the pair). Returns (rows,
        counts): this rank's received rows grouped by local expert (a view of a new tensor) and
        the rows per local expert."""
        import torch

        tokens = tokens.contiguous()
        ids = expert_ids.to(torch.int32).contiguous()
        self._rows(tokens, "tokens")
        if ids.shape != (tokens.shape[0], self.topk):
            raise ValueError("ncclx.moe: expert_ids is %s, expected (%d, %d)" % (tuple(ids.shape), tokens.shape[0],
                                                                                  self.topk))
        out = torch.empty((self.max_recv, self.hidden), dtype=self.dtype)
        counts = (_sz * max(self.n_local, 1))()
        res = _L.ncclxMoeDispatch(self._h, tokens.data_ptr() if tokens.numel() else None, tokens.shape[0],
                                  ids.data_ptr() if ids.numel() else None, out.data_ptr(), counts, None)
        # What combine must match. Kept when an expert id was refused (the dispatch ran without
        # those pairs, and combine reverses it), not when the call itself was refused.
        if tokens.shape[0] <= self.max_tokens:
            self.last_counts, self.last_tokens = list(counts)[:self.n_local], tokens.shape[0]
        self.comm._ck(res)
        return out[:sum(self.last_counts)], list(self.last_counts)

    def combine(self, expert_out, weights):
        """The reverse of the latest dispatch: expert_out has the dispatch's rows (same layout),
        weights (T, topk) float32; returns out (T, hidden) = sum over k of weight x row."""
        import torch

        expert_out = expert_out.contiguous()
        w = weights.to(torch.float32).contiguous()
        if hasattr(self, "last_counts"):  # else the library refuses: no dispatch to reverse
            self._rows(expert_out, "expert_out", sum(self.last_counts))
            if w.shape != (self.last_tokens, self.topk):
                raise ValueError("ncclx.moe: weights is %s, expected (%d, %d) as the dispatch's expert_ids"
                                 % (tuple(w.shape), self.last_tokens, self.topk))
        if expert_out.numel() == 0:
            # No rows came here, but the library only learns that when the call executes and
            # refuses NULL whenever rows could have: one unread row.
            expert_out = torch.empty((1, self.hidden), dtype=self.dtype)
        out = torch.empty((w.shape[0], self.hidden), dtype=self.dtype)
        self.comm._ck(_L.ncclxMoeCombine(self._h, expert_out.data_ptr(),
                                         w.data_ptr() if w.numel() else None,
                                         out.data_ptr() if out.numel() else None, None))
        return out

    def _rows(self, x, what, nrows=None):
        """The C calls read whole rows of the handle's dtype: refuse anything else here."""
        if x.dtype != self.dtype or x.dim() != 2 or x.shape[1] != self.hidden or nrows not in (None, x.shape[0]):
            raise ValueError("ncclx.moe: %s is %s %s, expected (%s, %d) %s" % (
                what, tuple(x.shape), x.dtype, "T" if nrows is None else nrows, self.hidden, self.dtype))

    def dropped(self):
        """Pairs this rank dropped for lack of expert capacity in the latest dispatch, per expert."""
        d = (_sz * self.n_experts)()
        self.comm._ck(_L.ncclxMoeDroppedCounts(self._h, d))
        return list(d)

    def close(self):
        if getattr(self, "_h", None):
            _L.ncclxMoeDestroy(self._h)
            self._h = None

    def __del__(self):
        self.close()


def _autograd():
    """The two exchanges as autograd functions, on a handle with topk = 1 whose 'tokens' are
    (token, k) pairs. The gradient of a combine (weights 1) is the dispatch of the gradient
    (the same ids give the same layout); the gradient of a dispatch is the combine of the
    gradient rows (each goes back to its pair), which reverses that latest dispatch. The gating
    weights are applied on the pairs' side, where autograd sees them.

    Both take an `anchor`, a scalar that requires grad: autograd skips the backward of a node
    whose inputs need no gradient, which differs between ranks (a rank without experts, or
    without rows, has nothing of its own that requires grad), and a reverse exchange that one
    rank skips leaves the others waiting. With the anchor every rank runs both."""
    import torch

    class Dispatch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, pairs, ids, moe, anchor):
            ctx.moe, ctx.n = moe, pairs.shape[0]
            rows, _ = moe.dispatch(pairs, ids)
            return rows.clone()

        @staticmethod
        def backward(ctx, grad_rows):
            ones = torch.ones((ctx.n, 1), dtype=torch.float32)
            grad_pairs = ctx.moe.combine(grad_rows.contiguous(), ones)
            return grad_pairs if ctx.needs_input_grad[0] else None, None, None, None

    class Combine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, rows, ids, moe, anchor):
            ctx.moe, ctx.ids = moe, ids
            return moe.combine(rows.contiguous(), torch.ones((ids.shape[0], 1), dtype=torch.float32))

        @staticmethod
        def backward(ctx, grad_pairs):
            grad_rows, _ = ctx.moe.dispatch(grad_pairs.contiguous(), ctx.ids)
            return grad_rows.clone(), None, None, None

    return Dispatch, Combine


def MoELayer(comm, n_experts, topk, hidden, max_tokens=1024, seed=0):
    """A mixture-of-experts layer (a torch.nn.Module) over the ranks of comm: a router
    (hidden -> n_experts, replicated on every rank), top-k gating, and this rank's experts (one
    bias-free Linear each). Built with the same seed on every rank, the router and the experts
    hold the weights a single-process layer with that seed would. y = layer(x), x (T, hidden),
    T <= max_tokens. The router's gradients are this rank's share (all-reduce them, as DDP
    does); the experts' are complete. One forward, then its backward: a second forward of the
    same layer before the first's backward routes the backward wrongly. With grad enabled
    every rank runs both reverse exchanges in its backward, whatever its own tensors need:
    call backward on every rank (or on none)."""
    import torch

    dispatch, combine = _autograd()

    class _MoELayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            self.router = torch.nn.Linear(hidden, n_experts, bias=False)
            weights = torch.randn(n_experts, hidden, hidden, generator=g) / hidden ** 0.5
            with torch.no_grad():
                self.router.weight.copy_(torch.randn(n_experts, hidden, generator=g) / hidden ** 0.5)
            self.moe = Moe(comm, n_experts, 1, hidden, torch.float32, max_tokens * topk)
            first = self.moe.first_expert
            self.experts = torch.nn.ParameterList(
                [torch.nn.Parameter(weights[first + i].clone()) for i in range(self.moe.n_local)])

        def forward(self, x):
            t = x.shape[0]
            gates = torch.softmax(self.router(x), dim=-1)
            w, ids = torch.topk(gates, topk, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
            pair_ids = ids.to(torch.int32).reshape(-1, 1)  # pair (t, k) -> its expert
            anchor = torch.zeros((), requires_grad=torch.is_grad_enabled())  # see _autograd
            rows = dispatch.apply(x.repeat_interleave(topk, dim=0), pair_ids, self.moe, anchor)
            outs, at = [], 0
            for i, n_rows in enumerate(self.moe.last_counts):
                outs.append(rows[at:at + n_rows] @ self.experts[i].t())
                at += n_rows
            expert_out = torch.cat(outs) if outs else rows[:0]
            pairs = combine.apply(expert_out, pair_ids, self.moe, anchor)
            return (pairs.view(t, topk, hidden) * w.unsqueeze(-1)).sum(dim=1)

    return _MoELayer()
