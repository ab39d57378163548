"""CommFuse from Python: a collective decomposed into point-to-point steps with the compute beside
them (docs/commfuse.md), on torch tensors, with Python callables as the compute.

    from ncclx.fuse import all_gather_matmul, matmul_reduce_scatter
    y = all_gather_matmul(comm, x_shard, w)        # == cat(all_gather(x_shard)) @ w
    z = matmul_reduce_scatter(comm, a, b)          # == reduce_scatter(a @ b), this rank's rows

`comm` is an ncclx.Comm, or ncclx.torch.comm_of(group) for a torch.distributed group. The
callbacks run on the calling thread while the library moves the next blocks; an exception in
one aborts the call on every rank and is raised here.
"""
import ctypes

import ncclx

__all__ = ["Schedule", "all_gather_compute", "compute_reduce_scatter", "all_gather_matmul",
           "matmul_reduce_scatter"]

_ALGOS = {"sequential": 0, "sliced": 1, "ring_p2p": 2, "direct_p2p": 3, "auto": 4}


class _ScheduleC(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_int), ("slices", ctypes.c_int), ("unit", ctypes.c_size_t),
                ("linkBytesPerSec", ctypes.c_double)]


class Schedule:
    """A CommFuse schedule: "sequential", "sliced" (slices=k), "ring_p2p" (slices=pieces, 0 =
    the library's choice), "direct_p2p" or "auto"."""

    def __init__(self, algo="ring_p2p", slices=0):
        if algo not in _ALGOS:
            raise ValueError("ncclx.fuse: schedule %r is not one of %s" % (algo, ", ".join(_ALGOS)))
        self.algo, self.slices = algo, slices

    def _c(self, unit):
        slices = self.slices if self.algo in ("sliced", "ring_p2p") else 1
        if self.algo == "sliced" and slices < 1:
            slices = 2
        return _ScheduleC(_ALGOS[self.algo], slices, unit, 0.0)


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p,
                             ctypes.c_size_t)
_L = ncclx.library
_L.ncclxAllGatherCompute.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, _CALLBACK,
                                     ctypes.c_void_p, _ScheduleC, ctypes.c_void_p, ctypes.c_void_p]
_L.ncclxAllGatherCompute.restype = ctypes.c_int
_L.ncclxComputeReduceScatter.argtypes = [_CALLBACK, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                         ctypes.c_int, _ScheduleC, ctypes.c_void_p, ctypes.c_void_p]
_L.ncclxComputeReduceScatter.restype = ctypes.c_int


def _view(like, address, count):
    """A tensor of count elements of like's dtype at address (library memory), without a copy."""
    import torch

    if count == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(0, dtype=like.dtype)
    raw = (ctypes.c_char * (count * like.element_size())).from_address(address)
    return torch.frombuffer(raw, dtype=like.dtype, count=count)


class _Guard:
    """Runs a Python callable as a C callback: exceptions are kept (the C side sees 1 and aborts
    the call on every rank) and raised after the call returns."""

    def __init__(self, fn):
        self.fn, self.error = fn, None

    def __call__(self, *args):
        try:
            self.fn(*args)
            return 0
        except BaseException as e:  # noqa: B902 - anything must stop the C call, then be raised
            self.error = e
            return 1

    def finish(self, res, comm):
        if self.error is not None:
            raise self.error
        ncclx._check(res, comm._comm)


def all_gather_compute(comm, send, recv, consume, schedule=None, unit=1):
    """All-gather send (this rank's block) into recv (nranks blocks, rank order), calling
    consume(src_rank, offset, piece) on each block, or piece of it, as it arrives: piece is a
    view of recv starting `offset` elements into src_rank's block. unit: pieces are cut at
    multiples of it (a matrix row)."""
    p, count, t = ncclx.buffer(send)
    q, room, rt = ncclx.buffer(recv)
    if room < comm.nranks * count or rt != t:  # the library writes nranks blocks there
        raise ValueError("ncclx.fuse.all_gather_compute: recv must hold %d x %d elements of send's dtype"
                         % (comm.nranks, count))
    flat = recv.reshape(-1)
    guard = _Guard(lambda src, off, data, n: consume(src, off, flat[src * count + off: src * count + off + n]))
    cb = _CALLBACK(lambda user, src, off, data, n: guard(src, off, data, n))
    res = _L.ncclxAllGatherCompute(p, q, count, t, cb, None, (schedule or Schedule())._c(unit), comm._comm,
                                   None)
    guard.finish(res, comm)


def compute_reduce_scatter(comm, produce, recv, op=ncclx.SUM, schedule=None, unit=1):
    """Reduce-scatter of partials that produce(dst_rank, offset, out) writes: out is a tensor
    (library memory, recv's dtype) for elements [offset, offset + out.numel()) of dst_rank's
    block. recv ends with op over every rank's contribution to this rank's block."""
    q, count, t = ncclx.buffer(recv)
    guard = _Guard(lambda dst, off, out, n: produce(dst, off, _view(recv, out, n)))
    cb = _CALLBACK(lambda user, dst, off, out, n: guard(dst, off, out, n))
    res = _L.ncclxComputeReduceScatter(cb, None, q, count, t, op, (schedule or Schedule())._c(unit),
                                       comm._comm, None)
    guard.finish(res, comm)


def _matmul_args(fn, x, w):
    """Shapes checked before the call: a matmul failing in a callback would abort the
    communicator on every rank."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0] or x.dtype != w.dtype:
        raise ValueError("ncclx.fuse.%s: cannot multiply %s %s by %s %s" % (fn, tuple(x.shape), x.dtype,
                                                                        tuple(w.shape), w.dtype))


def all_gather_matmul(comm, x_shard, w, schedule=None):
    """cat(all_gather(x_shard)) @ w, each rank's rows multiplied as they arrive. x_shard is
    (m, k) on every rank, w is (k, f); returns (nranks * m, f)."""
    import torch

    _matmul_args("all_gather_matmul", x_shard, w)
    x_shard = x_shard.contiguous()
    m, k = x_shard.shape
    n = comm.nranks
    gathered = torch.empty((n * m, k), dtype=x_shard.dtype)
    y = torch.empty((n * m, w.shape[1]), dtype=x_shard.dtype)

    def consume(src, off, piece):
        r0 = src * m + off // k
        rows = piece.numel() // k
        torch.matmul(piece.view(rows, k), w, out=y[r0:r0 + rows])

    all_gather_compute(comm, x_shard, gathered, consume, schedule, unit=k)
    return y


def matmul_reduce_scatter(comm, a, b, op=ncclx.SUM, schedule=None):
    """Rows [rank * m, (rank + 1) * m) of sum over ranks of a @ b, each destination's rows
    computed as the library sends them. a is (nranks * m, h) on every rank, b is (h, w);
    returns (m, w)."""
    import torch

    _matmul_args("matmul_reduce_scatter", a, b)
    rows, _ = a.shape
    n = comm.nranks
    if rows % n:
        raise ValueError("ncclx.fuse.matmul_reduce_scatter: %d rows do not split over %d ranks" % (rows, n))
    m, wcols = rows // n, b.shape[1]
    out = torch.empty((m, wcols), dtype=a.dtype)

    def produce(dst, off, piece):
        r0 = dst * m + off // wcols
        nrows = piece.numel() // wcols
        torch.matmul(a[r0:r0 + nrows], b, out=piece.view(nrows, wcols))

    compute_reduce_scatter(comm, produce, out, op, schedule, unit=wcols)
    return out
