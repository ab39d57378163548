"""ncclx from Python: a thin ctypes layer over libncclx (the C library stays the product).

    import ncclx
    uid = ncclx.UniqueId.create()          # on one rank; ship uid.bytes to the others
    comm = ncclx.Comm(nranks, uid, rank)
    comm.all_reduce(x)                     # numpy arrays or torch tensors, in place, no copies
    comm.destroy()

Every failure raises ncclx.Error carrying ncclxGetLastError's sentence. Calls run on the
calling thread and return when complete (stream NULL). `import ncclx.torch` registers the
torch.distributed backend "ncclx" (docs/python.md).
"""
import ctypes
import ctypes.util
import os

__all__ = ["Error", "UniqueId", "Comm", "library", "SUM", "PROD", "MAX", "MIN", "AVG"]

SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
_INT8, _UINT8, _INT32, _UINT32, _INT64, _UINT64, _FLOAT16, _FLOAT32, _FLOAT64, _BFLOAT16 = range(10)
_UNIQUE_ID_BYTES = 128


class Error(RuntimeError):
    """A failed ncclx call: .code is the ncclxResult_t, the message ncclxGetLastError's."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _candidates():
    env = os.environ.get("NCCLX_LIBRARY")
    if env:
        yield env
    try:  # installed by cmake --install: the library's installed path
        from ncclx._install_paths import LIBRARY

        yield LIBRARY
    except ImportError:
        pass
    found = ctypes.util.find_library("ncclx")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("ncclx: cannot find libncclx (set NCCLX_LIBRARY to its path); tried: " + "; ".join(tried))


library = _load()
_c_size_p = ctypes.POINTER(ctypes.c_size_t)


class _UniqueIdC(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * _UNIQUE_ID_BYTES)]


def _declare():
    L = library
    vp, sz, i, comm = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
    sigs = {
        "ncclxGetUniqueId": [ctypes.POINTER(_UniqueIdC)],
        "ncclxCommInitRank": [ctypes.POINTER(comm), i, _UniqueIdC, i],
        "ncclxCommSplit": [comm, i, i, ctypes.POINTER(comm), vp],
        "ncclxCommDestroy": [comm],
        "ncclxCommAbort": [comm],
        "ncclxAllReduce": [vp, vp, sz, i, i, comm, vp],
        "ncclxBroadcast": [vp, vp, sz, i, i, comm, vp],
        "ncclxReduce": [vp, vp, sz, i, i, i, comm, vp],
        "ncclxAllGather": [vp, vp, sz, i, comm, vp],
        "ncclxReduceScatter": [vp, vp, sz, i, i, comm, vp],
        "ncclxAllToAll": [vp, vp, sz, i, comm, vp],
        "ncclxAllToAllv": [vp, _c_size_p, _c_size_p, vp, _c_size_p, _c_size_p, i, comm, vp],
        "ncclxSend": [vp, sz, i, i, comm, vp],
        "ncclxRecv": [vp, sz, i, i, comm, vp],
        "ncclxBarrier": [comm, vp],
        "ncclxGroupStart": [],
        "ncclxGroupEnd": [],
    }
    for name, args in sigs.items():
        f = getattr(L, name)
        f.argtypes = args
        f.restype = ctypes.c_int
    L.ncclxGetLastError.argtypes = [comm]
    L.ncclxGetLastError.restype = ctypes.c_char_p
    L.ncclxGetErrorString.argtypes = [ctypes.c_int]
    L.ncclxGetErrorString.restype = ctypes.c_char_p


_declare()


def _check(res, comm=None):
    if res != 0:
        msg = library.ncclxGetLastError(comm).decode(errors="replace")
        kind = library.ncclxGetErrorString(res).decode(errors="replace")
        raise Error(res, "ncclx: %s: %s" % (kind, msg))


class UniqueId:
    """The 128 bytes that name a communicator's rendezvous; create on one rank, send the bytes."""

    def __init__(self, data):
        if len(data) != _UNIQUE_ID_BYTES:
            raise ValueError("ncclx.UniqueId: %d bytes, expected %d" % (len(data), _UNIQUE_ID_BYTES))
        self.bytes = bytes(data)

    @classmethod
    def create(cls):
        uid = _UniqueIdC()
        _check(library.ncclxGetUniqueId(ctypes.byref(uid)))
        return cls(ctypes.string_at(ctypes.addressof(uid), _UNIQUE_ID_BYTES))  # .internal stops at a NUL

    def _c(self):
        uid = _UniqueIdC()
        ctypes.memmove(ctypes.addressof(uid), self.bytes, _UNIQUE_ID_BYTES)
        return uid


_TORCH_TYPES = None


def _torch_types():
    global _TORCH_TYPES
    if _TORCH_TYPES is None:
        import torch

        _TORCH_TYPES = {torch.int8: _INT8, torch.uint8: _UINT8, torch.int32: _INT32, torch.int64: _INT64,
                        torch.float16: _FLOAT16, torch.float32: _FLOAT32, torch.float64: _FLOAT64,
                        torch.bfloat16: _BFLOAT16, torch.bool: _UINT8}
    return _TORCH_TYPES


_NUMPY_TYPES = {"int8": _INT8, "uint8": _UINT8, "int32": _INT32, "uint32": _UINT32, "int64": _INT64,
                "uint64": _UINT64, "float16": _FLOAT16, "float32": _FLOAT32, "float64": _FLOAT64, "bool": _UINT8}


def buffer(x):
    """(address, elements, ncclx datatype) of a contiguous torch tensor or numpy array."""
    if hasattr(x, "data_ptr"):  # torch
        if not x.is_contiguous():
            raise ValueError("ncclx: the tensor must be contiguous")
        t = _torch_types().get(x.dtype)
        if t is None:
            raise TypeError("ncclx: torch dtype %s is not one ncclx has" % x.dtype)
        return x.data_ptr(), x.numel(), t
    iface = getattr(x, "__array_interface__", None)
    if iface is None:
        raise TypeError("ncclx: expected a torch tensor or a numpy array, got %s" % type(x).__name__)
    if not x.flags["C_CONTIGUOUS"]:
        raise ValueError("ncclx: the array must be C-contiguous")
    t = _NUMPY_TYPES.get(x.dtype.name)
    if t is None:
        raise TypeError("ncclx: numpy dtype %s is not one ncclx has" % x.dtype)
    return iface["data"][0], x.size, t


def _sizes(values):
    arr = (ctypes.c_size_t * len(values))(*values)
    return arr


class Comm:
    """A communicator over nranks ranks; every method is a collective call of the C API."""

    def __init__(self, nranks, uid, rank, _handle=None):
        self.nranks, self.rank = nranks, rank
        if _handle is not None:
            self._comm = _handle
            return
        h = ctypes.c_void_p()
        _check(library.ncclxCommInitRank(ctypes.byref(h), nranks, uid._c(), rank))
        self._comm = h

    def _ck(self, res):
        _check(res, self._comm)

    def all_reduce(self, x, op=SUM, out=None):
        p, n, t = buffer(x)
        q = buffer(out)[0] if out is not None else p
        self._ck(library.ncclxAllReduce(p, q, n, t, op, self._comm, None))

    def broadcast(self, x, root):
        p, n, t = buffer(x)
        self._ck(library.ncclxBroadcast(p, p, n, t, root, self._comm, None))

    def reduce(self, x, root, op=SUM):
        p, n, t = buffer(x)
        self._ck(library.ncclxReduce(p, p, n, t, op, root, self._comm, None))

    def all_gather(self, send, recv):
        p, n, t = buffer(send)
        self._ck(library.ncclxAllGather(p, buffer(recv)[0], n, t, self._comm, None))

    def reduce_scatter(self, send, recv, op=SUM):
        q, n, t = buffer(recv)
        self._ck(library.ncclxReduceScatter(buffer(send)[0], q, n, t, op, self._comm, None))

    def all_to_all(self, send, recv):
        p, n, t = buffer(send)
        self._ck(library.ncclxAllToAll(p, buffer(recv)[0], n // self.nranks, t, self._comm, None))

    def all_to_all_v(self, send, send_counts, recv, recv_counts):
        """Counts in elements, one per rank; blocks packed in rank order."""
        p, _, t = buffer(send)
        q = buffer(recv)[0]
        sd, rd, acc = [], [], 0
        for c in send_counts:
            sd.append(acc)
            acc += c
        acc = 0
        for c in recv_counts:
            rd.append(acc)
            acc += c
        self._ck(library.ncclxAllToAllv(p, _sizes(send_counts), _sizes(sd), q, _sizes(recv_counts), _sizes(rd), t,
                                        self._comm, None))

    def send(self, x, peer):
        p, n, t = buffer(x)
        self._ck(library.ncclxSend(p, n, t, peer, self._comm, None))

    def recv(self, x, peer):
        p, n, t = buffer(x)
        self._ck(library.ncclxRecv(p, n, t, peer, self._comm, None))

    def barrier(self):
        self._ck(library.ncclxBarrier(self._comm, None))

    def split(self, color, key):
        h = ctypes.c_void_p()
        self._ck(library.ncclxCommSplit(self._comm, color, key, ctypes.byref(h), None))
        if not h:
            return None
        return Comm(-1, None, -1, _handle=h)

    def destroy(self):
        if self._comm:
            library.ncclxCommDestroy(self._comm)
            self._comm = None

    def abort(self):
        if self._comm:
            library.ncclxCommAbort(self._comm)
            self._comm = None
