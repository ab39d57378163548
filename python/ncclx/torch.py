"""torch.distributed backend "ncclx": `import ncclx.torch`, then
dist.init_process_group("ncclx") (env:// with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, or
an explicit store). A Python ProcessGroup (torch 1.13 lets one override the ops) over ncclx.Comm:
the unique id goes through the c10d store, as ProcessGroupNCCL's does; tensors are passed to
the C library by address, without copies when they are contiguous. Calls complete before they
return (CPU tensors): async_op=True gets a completed Work. Errors raise ncclx.Error with the
library's sentence; a rank that dies or stalls makes the others raise within the group's
timeout (each group's becomes its communicator's [core] timeout_s unless NCCLX_CORE_TIMEOUT_S
is set). docs/python.md."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, _create_work_from_future

import ncclx

_OPS = {dist.ReduceOp.SUM: ncclx.SUM, dist.ReduceOp.PRODUCT: ncclx.PROD, dist.ReduceOp.MIN: ncclx.MIN,
        dist.ReduceOp.MAX: ncclx.MAX, dist.ReduceOp.AVG: ncclx.AVG}


def _op(reduce_op):
    for k, v in _OPS.items():
        if reduce_op == k:
            return v
    for name in ("BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if reduce_op == getattr(dist.ReduceOp, name):
            raise ValueError("ncclx: ReduceOp.%s is not supported (ncclx reduces with SUM, PRODUCT, MIN, MAX, AVG)"
                             % name)
    raise ValueError("ncclx: unsupported reduce op %r" % (reduce_op,))


def _reduce_op(opts):
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _root(opts):
    return opts.rootRank if opts is not None else 0


def _Done(tensors=None):
    """A completed operation (ncclx calls with no stream return when they are done), as a C++
    Work: c10d code that waits on it (DDP's checks, its reducer) waits in C++, where a Python
    subclass of Work would never report completion."""
    fut = torch.futures.Future()
    fut.set_result(tensors or [])
    return _create_work_from_future(fut)


def _flat(tensors):
    """One contiguous buffer for a list of tensors of one dtype (a view when they already are)."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def _with_timeout(timeout, init):
    """Runs init (a communicator's creation) with the group's timeout as [core] timeout_s: the
    library reads NCCLX_CORE_TIMEOUT_S when a communicator is created, so setting it only around
    the creation gives every group its own timeout. A value the user set wins."""
    key = "NCCLX_CORE_TIMEOUT_S"
    if timeout is None or key in os.environ:
        return init()
    os.environ[key] = str(max(1, int(timeout.total_seconds())))
    try:
        return init()
    finally:
        del os.environ[key]


class ProcessGroupNCCLX(ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        if "TORCHELASTIC_RUN_ID" not in os.environ and "NCCLX_JOB_ID" not in os.environ:
            os.environ["NCCLX_JOB_ID"] = "torch-%s" % os.environ.get("MASTER_PORT", "store")
        key = "ncclx_unique_id"
        if rank == 0:
            store.set(key, ncclx.UniqueId.create().bytes)
        uid = ncclx.UniqueId(store.get(key))
        self.comm = _with_timeout(timeout, lambda: ncclx.Comm(size, uid, rank))
        self._rank, self._size = rank, size

    def getBackendName(self):
        return "ncclx"

    # ---- collectives: each completes before it returns ----

    def allreduce(self, tensors, opts=None):
        for t in tensors:
            self.comm.all_reduce(t, _op(_reduce_op(opts)))
        return _Done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        for t in tensors:
            self.comm.broadcast(t, _root(opts))
        return _Done(tensors)

    def reduce(self, tensors, opts=None):
        self.comm.reduce(tensors[0], _root(opts), _op(_reduce_op(opts)))
        return _Done(tensors)

    def allgather(self, output_lists, input_tensors, opts=None):
        for outs, inp in zip(output_lists, input_tensors):
            gathered = torch.empty(self._size * inp.numel(), dtype=inp.dtype)
            self.comm.all_gather(inp.contiguous(), gathered)
            for r, o in enumerate(outs):
                o.copy_(gathered[r * inp.numel():(r + 1) * inp.numel()].view_as(o))
        return _Done([t for outs in output_lists for t in outs])

    def _allgather_base(self, output, input, opts=None):
        self.comm.all_gather(input.contiguous(), output)
        return _Done([output])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        for out, ins in zip(outputs, input_lists):
            flat = _flat(ins)
            res = torch.empty_like(out).contiguous()
            self.comm.reduce_scatter(flat, res, _op(_reduce_op(opts)))
            out.copy_(res)
        return _Done(outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        self.comm.reduce_scatter(input.contiguous(), output, _op(_reduce_op(opts)))
        return _Done([output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        inp = input.contiguous()
        if not output_split_sizes and not input_split_sizes:
            self.comm.all_to_all(inp, output)
            return _Done([output])
        row_in = inp.numel() // max(inp.shape[0], 1) if inp.dim() else 1
        row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        sc = [s * row_in for s in (input_split_sizes or [inp.shape[0] // self._size] * self._size)]
        rc = [s * row_out for s in (output_split_sizes or [output.shape[0] // self._size] * self._size)]
        self.comm.all_to_all_v(inp, sc, output, rc)
        return _Done([output])

    def alltoall(self, outputs, inputs, opts=None):
        send = _flat([t.contiguous() for t in inputs])
        recv = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype)
        self.comm.all_to_all_v(send, [t.numel() for t in inputs], recv, [t.numel() for t in outputs])
        off = 0
        for o in outputs:
            o.copy_(recv[off:off + o.numel()].view_as(o))
            off += o.numel()
        return _Done(outputs)

    def send(self, tensors, dst, tag):
        self.comm.send(tensors[0].contiguous(), dst)
        return _Done(tensors)

    def recv(self, tensors, src, tag):
        self.comm.recv(tensors[0], src)
        return _Done(tensors)

    def barrier(self, opts=None):
        self.comm.barrier()
        return _Done()

    def __del__(self):
        comm = getattr(self, "comm", None)
        if comm is not None:
            comm.destroy()


def comm_of(group=None):
    """The ncclx.Comm under a torch.distributed group of backend "ncclx" (None: the default
    group), for ncclx's own features on the same ranks (ncclx.fuse)."""
    if group is None or group is dist.group.WORLD:
        group = dist.distributed_c10d._get_default_group()
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group returns on the other ranks
        raise ValueError("ncclx.torch.comm_of: this rank (%d) is not a member of the group" % dist.get_rank())
    comm = getattr(group, "comm", None)
    if not isinstance(group, ProcessGroupNCCLX) or comm is None:
        raise ValueError("ncclx.torch.comm_of: the group's backend is %s, not ncclx" %
                         getattr(group, "getBackendName", lambda: type(group).__name__)())
    return comm


def _create(store, rank, size, timeout):
    return ProcessGroupNCCLX(store, rank, size, timeout)


if "ncclx" not in dist.Backend.__dict__.values() and not hasattr(dist.Backend, "NCCLX"):
    dist.Backend.register_backend("ncclx", _create)
