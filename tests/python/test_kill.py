"""A rank that dies in a loop of all_reduce (3 ranks under tools/ncclx-run, CTest): rank 2
leaves with os._exit(0) at step 20, without any ncclx call. Ranks 0 and 1 must get an
exception from torch.distributed naming rank 2, within the process group's timeout (10 s
here), never a hang. Exit 0 when the survivors saw that (rank 2 exits 0 on purpose), 1
otherwise, 77 when torch is not installed."""
import datetime
import os
import time

from testlib import dist, torch

import ncclx.torch  # noqa: F401  registers the backend


def main():
    dist.init_process_group("ncclx", timeout=datetime.timedelta(seconds=10))
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1 << 16)
    t0 = None
    for step in range(200):
        if rank == n - 1 and step == 20:
            os._exit(0)  # dies mid-job: no destroy, no goodbye
        try:
            t0 = time.monotonic()
            dist.all_reduce(x)
        except Exception as e:  # the backend's ncclx.Error, as torch passes it on
            took = time.monotonic() - t0
            named = ("rank %d" % (n - 1)) in str(e)
            print("rank %d: step %d failed after %.1f s: %s" % (rank, step, took, e), flush=True)
            ok = named and took < 15 and step >= 20
            print("rank %d: %s" % (rank, "PASS" if ok else "FAIL (the error must name rank %d, within 15 s)" % (n - 1)),
                  flush=True)
            os._exit(0 if ok else 1)
    print("rank %d: FAIL no error after rank %d died" % (rank, n - 1), flush=True)
    os._exit(1)


if __name__ == "__main__":
    main()
