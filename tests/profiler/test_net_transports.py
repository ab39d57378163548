#!/usr/bin/env python3
"""NET profiler events from the built-in socket network and the OFI plugin.

    test_net_transports.py NCCLX-PERF [LIBNCCLX-NET-OFI.SO]

Two ranks (ncclx-perf -np 2 allreduce, shared memory off so that every byte crosses the
network) with the trace profiler loaded:

1. socket, events = coll,step,net: both ranks' traces hold NET events with the socket
   network's plugin id (0x534f434b), each inside the time span of a collective that is in
   the trace, nested under one of its STEPs (args parent = "step", with the peer and
   direction) or, for the few messages the core sends without a STEP (connection set-up in
   the first collective), under the collective; most must be under STEPs.
2. socket, events = coll: no NET events (the activation mask is honoured).
3. with the OFI plugin given and its tcp;ofi_rxm provider available: as 1, with the plugin
   id 0x4f4649. Skipped (not failed) when the provider is missing.
"""
import os
import sys
import tempfile

from trace_run import expect_no_net_events, load_traces as load, run_perf

SOCKET_ID = 0x534F434B
OFI_ID = 0x4F4649


def check(name, outdir, plugin_id, errors):
    traces = load(outdir)
    if len(traces) != 2:
        errors.append("%s: expected 2 traces in %s, found %s" % (name, outdir, sorted(os.listdir(outdir))))
    for path, evs in traces.items():
        colls = {e["args"]["seq"]: e for e in evs if e.get("cat") == "coll"}
        nets = [e for e in evs if e.get("cat") == "net"]
        base = "%s: %s" % (name, os.path.basename(path))
        if not nets:
            errors.append("%s: no NET events" % base)
            continue
        bad = None
        for e in nets:
            a = e["args"]
            c = colls.get(a.get("seq"))
            start = a.get("start_us", e["ts"])
            if a.get("plugin_id") != plugin_id:
                bad = "plugin id %r, expected %#x" % (a.get("plugin_id"), plugin_id)
            elif a.get("parent") not in ("step", "coll") or (a["parent"] == "step" and "dir" not in a):
                bad = "not nested under a STEP or a collective: %r" % a
            elif c is None or c["name"].split(" #")[0] != a.get("op"):
                bad = "names %s #%r, which is not in the trace" % (a.get("op"), a.get("seq"))
            elif not (c["ts"] - 1 <= start and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + 1):
                bad = "%r at %.3f+%.3f lies outside its collective at %.3f+%.3f" % (
                    e["name"], start, e["dur"], c["ts"], c["dur"])
            if bad:
                errors.append("%s: NET event %s" % (base, bad))
                break
        under = sum(1 for e in nets if e["args"].get("parent") == "step")
        sends = sum(1 for e in nets if e["args"].get("dir") == "send")
        print("%s: %d NET events in %d collectives, %d under STEPs (%d send, %d recv)" %
              (base, len(nets), len(colls), under, sends, under - sends))
        if not bad and under * 2 < len(nets):
            errors.append("%s: only %d of %d NET events under a STEP" % (base, under, len(nets)))


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        return 2
    perf = sys.argv[1]
    ofi = sys.argv[2] if len(sys.argv) == 3 else None
    errors = []
    with tempfile.TemporaryDirectory(prefix="ncclx-net-transports-") as tmp:
        d = os.path.join(tmp, "socket")
        rc, out = run_perf(perf, d, "coll,step,net", "64K", {}, True)
        if rc != 0:
            print(out)
            errors.append("socket: ncclx-perf exited %d" % rc)
        check("socket", d, SOCKET_ID, errors)

        d = os.path.join(tmp, "socket-off")
        rc, out = run_perf(perf, d, "coll", "64K", {}, True)
        if rc != 0:
            print(out)
            errors.append("socket, events = coll: ncclx-perf exited %d" % rc)
        expect_no_net_events("socket, events = coll", d, errors)

        if ofi and os.path.exists(ofi):
            d = os.path.join(tmp, "ofi")
            rc, out = run_perf(perf, d, "coll,step,net", "64K", {"NCCLX_NET_PLUGIN": ofi, "NCCLX_NET_OFI_PROVIDER": "tcp;ofi_rxm",
                                                     "NCCLX_NET_OFI_DOMAIN": "lo"}, True)
            if rc != 0 and "not available" in out:
                print("ofi: provider tcp;ofi_rxm not available here: skipped")
            elif rc != 0 or "using plugin 'ofi'" not in out:
                print(out)
                errors.append("ofi: ncclx-perf exited %d%s" % (rc, "" if "using plugin 'ofi'" in out
                                                                  else " without loading the ofi plugin"))
            else:
                check("ofi", d, OFI_ID, errors)
        else:
            print("ofi: plugin not built: skipped")
    for e in errors:
        print("FAIL:", e)
    print("PASS" if not errors else "FAIL")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
