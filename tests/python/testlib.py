"""What the Python tests share: torch, or CTest's skip (exit 77) when it is not installed, and
the record of checks (a failed one is printed with its rank and kept in `failures`)."""
import os
import sys

try:
    import torch  # noqa: F401  re-exported for the tests
    import torch.distributed as dist  # noqa: F401
except ImportError:
    print("SKIPPED: torch is not installed for %s" % sys.executable)
    sys.exit(77)

failures = []
checked = [0]
RANK = int(os.environ.get("RANK", "0"))  # tools/ncclx-run's rank, the default group's too


def check(cond, what):
    checked[0] += 1
    if not cond:
        failures.append(what)
        print("rank %d: FAIL %s" % (RANK, what), flush=True)
