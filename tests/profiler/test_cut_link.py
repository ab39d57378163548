#!/usr/bin/env python3
"""A cut network link between emulated hosts, with the trace profiler on.

    test_cut_link.py NCCLX-HOSTS PROF_CUT ANALYZER SHAPE      (SHAPE: 2x1 or 2x2 hosts x ranks)

tools/ncclx-hosts runs PROF_CUT as the ranks of SHAPE on emulated hosts (network namespaces)
with [profiler] plugin = trace (coll, p2p, step events, 1 s watchdog) and a 5 s timeout for
the allreduces (60 s for init: ranks start late on a loaded machine),
and deletes host 1's link 300 ms after a rank prints "prof_cut: looping". Then:

- every rank fails (exit 1, a "prof_cut: rank R: ... failed" line) within the core timeout
  plus a margin of the cut, and none hangs;
- ncclx-analyze on the ranks' dumps and traces names the link: its VERDICT says "the link
  between rank A (host X) and rank B (host Y) stopped delivering" with A on host 0 and B on
  host 1 (the hosts of the two sides of the cut).

Exit 77 (skipped) when network namespaces cannot be made here (not root, no `ip netns`).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CORE_TIMEOUT_S = 5
MARGIN_S = 10
SKIP = 77


def main():
    if len(sys.argv) != 5 or not re.fullmatch(r"2x[12]", sys.argv[4]):
        print(__doc__)
        return 2
    launcher, prog, analyzer, shape = sys.argv[1:]
    hosts, rph = (int(x) for x in shape.split("x"))
    nranks = hosts * rph
    if os.geteuid() != 0:
        print("SKIP: not root: network namespaces need root")
        return SKIP
    if not shutil.which("ip"):
        print("SKIP: the `ip` command (iproute2) is not installed")
        return SKIP
    out_dir = tempfile.mkdtemp(prefix="ncclx-cut-link-")
    env = ["NCCLX_PROFILER_PLUGIN=trace", "NCCLX_PROFILER_TRACE_DIR=" + out_dir,
           "NCCLX_PROFILER_TRACE_EVENTS=coll,p2p,step", "NCCLX_PROFILER_TRACE_WATCHDOG_TIMEOUT_MS=1000",
           "NCCLX_PROFILER_TRACE_SUMMARY=none", "NCCLX_CORE_TIMEOUT_S=60",  # init, on a loaded machine
           "PROF_CUT_TIMEOUT_S=%d" % CORE_TIMEOUT_S]  # the allreduce loop
    cmd = [sys.executable, launcher, "--hosts", str(hosts), "--ranks-per-host", str(rph), "--timeout", "120",
           "--grace", "40", "--cut-host", "1", "--cut-on", "prof_cut: looping", "--cut-after-ms", "300"]
    for e in env:
        cmd += ["--env", e]
    cmd += ["--", prog, out_dir, str(1 << 20), "60"]
    print("$", " ".join(cmd))
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=170)
    log = p.stdout
    print("\n".join(l for l in log.splitlines() if "NCCLX INFO" not in l and "NCCLX TRACE" not in l))
    if p.returncode == SKIP:
        print("SKIP: ncclx-hosts cannot build emulated hosts here")
        shutil.rmtree(out_dir, ignore_errors=True)
        return SKIP
    errors = []
    if not re.search(r"cut host 1's link", log):
        errors.append("the link was never cut")
    if "went unnoticed" in log:
        errors.append("a rank saw no error after the cut")
    failed = set(int(m.group(1)) for m in re.finditer(r"prof_cut: rank (\d+): allreduce #\d+ failed", log))
    if failed != set(range(nranks)):
        errors.append("ranks that reported a failure: %s, expected all of 0..%d" % (sorted(failed), nranks - 1))
    bound = CORE_TIMEOUT_S + MARGIN_S
    for m in re.finditer(r"^ncclx-hosts: r(\d+) \(host \d+\) (.*?) after [\d.]+ s \(([+-][\d.]+) s from the cut\)",
                         log, re.M):
        r, status, since = int(m.group(1)), m.group(2), float(m.group(3))
        print("rank %d: %s, %.1f s after the cut" % (r, status, since))
        if since > bound:
            errors.append("rank %d took %.1f s after the cut to end (bound %d s)" % (r, since, bound))
        if "status 1" not in status:
            errors.append("rank %d ended with '%s', expected exit status 1" % (r, status))
    a = subprocess.run([sys.executable, analyzer, out_dir, "--svg", os.path.join(out_dir, "picture.svg")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    print("----- analyzer -----\n" + a.stdout + "----- end of analyzer (status %d) -----" % a.returncode)
    verdicts = [l for l in a.stdout.splitlines() if l.startswith("VERDICT:")]
    # The loop's communicator (a split of the one init made, which ran no collective).
    m = re.search(r"the link between rank (\d+) \(host (\S+)\) and rank (\d+) \(host (\S+)\) stopped delivering",
                  "\n".join(verdicts))
    if a.returncode != 0 or not m:
        errors.append("the analyzer's verdict does not name a link")
    else:
        ra, rb = int(m.group(1)), int(m.group(3))
        if {ra // rph, rb // rph} != {0, 1} or m.group(2) == m.group(4):
            errors.append("the named link (ranks %d, %d) does not cross between host 0 and host 1" % (ra, rb))
    for e in errors:
        print("FAIL:", e)
    print("test_cut_link %s: %s (%.1f s; files in %s)" % (shape, "FAIL" if errors else "PASS",
                                                         time.monotonic() - t0, out_dir))
    if not errors:
        shutil.rmtree(out_dir, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
