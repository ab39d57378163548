#!/usr/bin/env python3
"""Network plugin events end to end.

    test_net_events.py NCCLX-PERF LIBNCCLX-NET-PROFTEST.SO ANALYZER

Two ranks (ncclx-perf -np 2) run allreduces over libncclx-net-proftest.so ([net] plugin,
shared memory off so that every byte goes through it) with the trace profiler loaded:

1. events = coll,step,net: every rank's trace holds NET events (cat "net") with the plugin's
   id, each under a collective (args op/seq name it; the allreduces, and ncclx-perf's own
   barriers) and inside that collective's time span;
   the analyzer's merge carries them over.
2. events = coll: the core sends no NET events (the activation mask is honoured), although
   the plugin calls env->profiler for every transfer.
"""
import json
import os
import subprocess
import sys
import tempfile

from trace_run import expect_no_net_events, load_traces as load, run_perf

PROFTEST_ID = 0x7E0000F1


def check_nested(path, evs, errors):
    colls = {e["args"]["seq"]: e for e in evs if e.get("cat") == "coll"}
    nets = [e for e in evs if e.get("cat") == "net"]
    if not nets:
        errors.append("%s: no NET events" % path)
        return 0
    for e in nets:
        a = e["args"]
        if a.get("plugin_id") != PROFTEST_ID:
            errors.append("%s: NET event with plugin id %r, expected %#x" % (path, a.get("plugin_id"), PROFTEST_ID))
            return 0
        if a.get("parent") not in ("coll", "step"):
            errors.append("%s: NET event not under a collective: %r" % (path, a))
            return 0
        c = colls.get(a.get("seq"))
        if c is None or c["name"].split(" #")[0] != a.get("op"):
            errors.append("%s: NET event names %s #%r, which is not in the trace" % (path, a.get("op"), a.get("seq")))
            return 0
        start = a.get("start_us", e["ts"])  # the true start when the slice was clipped
        if not (c["ts"] - 1 <= start and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + 1):
            errors.append("%s: NET event %r at %.3f+%.3f lies outside allreduce #%d at %.3f+%.3f" %
                          (path, e["name"], start, e["dur"], a["seq"], c["ts"], c["dur"]))
            return 0
    under = sum(1 for e in nets if e["args"]["op"] == "allreduce")
    if not under:
        errors.append("%s: no NET event under an allreduce" % path)
    return len(nets)


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    perf, plugin, analyzer = sys.argv[1:]
    errors = []
    with tempfile.TemporaryDirectory(prefix="ncclx-net-events-") as tmp:
        on = os.path.join(tmp, "on")
        rc, out = run_perf(perf, on, "coll,step,net", "256K", {"NCCLX_NET_PLUGIN": plugin})
        print(out)
        if rc != 0:
            errors.append("ncclx-perf exited %d with the proftest plugin" % rc)
        if "using plugin 'proftest'" not in out:
            errors.append("the core did not load the proftest net plugin")
        traces = load(on)
        if len(traces) != 2:
            errors.append("expected 2 traces in %s, found %s" % (on, sorted(os.listdir(on))))
        for path, evs in traces.items():
            n = check_nested(path, evs, errors)
            steps = sum(1 for e in evs if e.get("cat") == "step")
            print("%s: %d NET events under their collectives, %d STEP events" % (os.path.basename(path), n, steps))
        merged = os.path.join(tmp, "all.json")
        p = subprocess.run([sys.executable, analyzer, "merge", on, "-o", merged], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        print(p.stdout.strip())
        if p.returncode != 0:
            errors.append("ncclx-analyze merge exited %d" % p.returncode)
        else:
            with open(merged) as f:
                doc = json.load(f)
            evs = doc["traceEvents"] if isinstance(doc, dict) else doc
            if not any(e.get("cat") == "net" for e in evs):
                errors.append("the merged trace lost the NET events")

        off = os.path.join(tmp, "off")
        rc, out = run_perf(perf, off, "coll", "256K", {"NCCLX_NET_PLUGIN": plugin})
        if rc != 0:
            print(out)
            errors.append("ncclx-perf exited %d with events = coll" % rc)
        expect_no_net_events("events = coll", off, errors)
    for e in errors:
        print("FAIL:", e)
    print("PASS" if not errors else "FAIL")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
