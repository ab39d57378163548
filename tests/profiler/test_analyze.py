#!/usr/bin/env python3
"""tools/ncclx-analyze on hand-made directories:
  - corrupt, truncated, empty, binary and foreign files are named with the reason, and the
    rest still gives the right verdict (a rank that never entered a collective);
  - a dead link (both sides posted, nothing arrived; or one side moved on to the next
    collective while the other still waits for its bytes) is named as a link;
  - NET records of a network plugin in a spool survive the merge;
  - a clean run gives "no fault found"; an empty directory exits 1; bad arguments exit 2;
  - `merge` puts truncated and complete traces on one valid timeline with pid = rank.

usage: test_analyze.py ANALYZER
"""
import json
import os
import struct
import shutil
import subprocess
import sys
import tempfile

ANALYZER = sys.argv[1]
HASH = "00000000deadbeef"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)


def run(*args):
    p = subprocess.run([sys.executable, ANALYZER] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=60)
    print("$ ncclx-analyze " + " ".join(args) + "\n" + p.stdout + "(exit %d)" % p.returncode)
    return p.returncode, p.stdout


def verdict(out):
    return "\n".join(l for l in out.splitlines() if l.startswith("VERDICT:"))


def prof_dump(rank, nranks, started, done, inflight=None, peers=None, error=None, t=100.0):
    ops = [{"kind": "coll", "seq": s, "func": "allreduce", "count": 1024, "bytes": 4096, "dtype": "float32",
            "op": "sum", "root": -1, "algo": "ring", "proto": "simple", "start": t, "durMs": 1.0, "status": "ok"}
           for s in range(1, done + 1)]
    inf = []
    if inflight:
        inf = [{"kind": "coll", "seq": inflight, "func": "allreduce", "count": 1024, "bytes": 4096,
                "dtype": "float32", "op": "sum", "root": -1, "algo": "ring", "proto": "simple", "start": t,
                "ageMs": 5000.0, "state": "running"}]
    return {"format": "ncclx-profiler-dump-1", "reason": "watchdog", "time": t, "commHash": HASH,
            "commName": HASH, "rank": rank, "nranks": nranks, "nhosts": 1, "host": "h%d" % rank, "pid": 100 + rank,
            "events": "coll,p2p,step", "lastStarted": {"coll": started, "p2p": 0},
            "lastCompleted": {"coll": done, "p2p": 0}, "lastFailed": {"coll": 0, "p2p": 0}, "error": error,
            "idleMs": 5000.0 if inflight else 0.0, "inflight": inf,
            "peersOp": {"kind": "coll", "seq": inflight or done, "func": "allreduce"} if (inflight or done) else None,
            "peers": peers or [], "recent": ops, "dropped": {"events": 0, "records": 0}}


def peer(p, send, recv):
    return {"peer": p, "send": dict(zip(("expected", "posted", "done"), send)),
            "recv": dict(zip(("expected", "posted", "done"), recv))}


def trace_lines(rank, nranks, nops, closed):
    lines = ["[", json.dumps({"name": "ncclx_comm", "ph": "M", "pid": rank, "args": {
        "format": "ncclx-trace-1", "commHash": HASH, "rank": rank, "nranks": nranks, "host": "h%d" % rank,
        "pid": 100 + rank}})]
    for s in range(1, nops + 1):
        lines.append(json.dumps({"name": "allreduce #%d" % s, "cat": "coll", "ph": "X", "pid": rank, "tid": 0,
                                 "ts": 1000.0 * s, "dur": 10.0, "args": {
                                     "seq": s, "count": 1024, "bytes": 4096, "dtype": "float32", "op": "sum",
                                     "root": -1, "algo": "ring", "proto": "simple", "start_us": 1000.0 * s,
                                     "status": "ok"}}))
    text = lines[0] + "\n" + ",\n".join(lines[1:])
    return text + ("\n]\n" if closed else "")


def spool(rank, nranks, nops, cut):
    """A binary trace as the plugin spools it (plugins/profiler/trace_spool.c)."""
    head = {"format": "ncclx-spool-1", "commHash": HASH, "rank": rank, "nranks": nranks, "host": "h%d" % rank,
            "pid": 100 + rank, "realOffsetNs": 1000000, "recordBytes": 64}
    out = b"NCCLXTR1\n" + json.dumps(head).encode() + b"\n"
    for i, name in enumerate(("allreduce", "float32", "sum", "ring", "simple")):
        out += b"N" + bytes([2 + i, len(name)]) + name.encode()
    for s in range(1, nops + 1):
        out += b"R" + struct.pack("<5Q4i7Bx", s, 1000000 * s, 1000000 * s + 10000, 4096, 1024, 0x2, -1, -1, 0,
                                  0, 0, 2, 3, 4, 5, 6)
    return out[:-cut] if cut else out


def write(d, name, content, mode="w"):
    with open(os.path.join(d, name), mode) as f:
        f.write(content)


def test_bad_input(root):
    d = os.path.join(root, "bad")
    os.mkdir(d)
    # Ranks 0 and 1 wait in #5 on rank 2, which is idle after #4.
    write(d, "dump-r0.json", json.dumps(prof_dump(0, 3, 5, 4, inflight=5, peers=[peer(2, (4096, 4096, 0), (4096, 4096, 0))])))
    write(d, "dump-r1.json", json.dumps(prof_dump(1, 3, 5, 4, inflight=5, peers=[peer(0, (4096, 4096, 4096), (4096, 4096, 4096)), peer(2, (0, 0, 0), (4096, 4096, 0))])))
    write(d, "sigusr1-r2.json", json.dumps(prof_dump(2, 3, 4, 4)))
    write(d, "trace-r0.json", trace_lines(0, 3, 4, closed=True))
    write(d, "trace-r2.json", trace_lines(2, 3, 4, closed=False)[:-40])  # killed mid-line
    write(d, "trace-r1.spool", spool(1, 3, 4, cut=20), mode="wb")  # a rank that died mid-write
    # The broken ones.
    write(d, "cut.json", json.dumps(prof_dump(1, 3, 5, 4))[:150])
    write(d, "empty.json", "")
    write(d, "binary.json", b"\x7fELF\x02\x01\x01\x00\xff\xfe", mode="wb")
    write(d, "other.json", json.dumps({"hello": "world"}))
    write(d, "norank.json", json.dumps({"format": "ncclx-dump-1", "commHash": HASH, "nranks": 3}))
    write(d, "badrank.json", json.dumps(prof_dump(9, 3, 1, 1)))
    write(d, "metrics-x.jsonl", '{"commHash": "%s", "rank": 0, "nranks": 3, "func": "allreduce"}\nnot json\n' % HASH)
    rc, out = run(d, "--svg", os.path.join(d, "out.svg"))
    check(rc == 0, "bad input: exit status %d, expected 0" % rc)
    check("cut.json: not valid JSON" in out and "truncated" in out, "bad input: truncated dump not reported")
    check("empty.json: empty file" in out, "bad input: empty file not reported")
    check("binary.json: not UTF-8" in out, "bad input: binary file not reported")
    check("other.json: valid JSON but not an ncclx dump" in out, "bad input: foreign JSON not reported")
    check("norank.json: field 'rank' is missing" in out, "bad input: missing field not reported")
    check("badrank.json: rank 9 is outside 0..2" in out, "bad input: out-of-range rank not reported")
    check("metrics-x.jsonl: 1 metrics line(s) are not valid JSON" in out, "bad input: bad metrics line not reported")
    check("trace-r2.json: never closed" in out and "cut short" in out, "bad input: truncated trace not noted")
    check("trace-r1.spool: binary trace of rank 1" in out and "its last entry is cut short" in out,
          "bad input: truncated spool not noted")
    check("rank 2 never entered allreduce #5" in verdict(out), "bad input: wrong verdict")
    check(os.path.exists(os.path.join(d, "out.svg")), "bad input: no svg written")
    return d


def test_link(root):
    d = os.path.join(root, "link")
    os.mkdir(d)
    write(d, "a.json", json.dumps(prof_dump(0, 2, 3, 2, inflight=3, peers=[peer(1, (8192, 8192, 0), (8192, 8192, 8192))])))
    write(d, "b.json", json.dumps(prof_dump(1, 2, 3, 2, inflight=3, peers=[peer(0, (8192, 8192, 8192), (8192, 8192, 0))])))
    rc, out = run(d)
    check(rc == 0 and "the link between rank 0 (host h0) and rank 1 (host h1) stopped delivering during allreduce #3" in verdict(out),
          "link: wrong verdict")


def test_link_ahead(root):
    """A cut link seen from both sides: rank 0 finished its part of #59 (its sends to rank 1
    done) and waits in #60; rank 1 still waits in #59 for the half that never arrived. That
    is a link, not a rank that skipped #60."""
    d = os.path.join(root, "link-ahead")
    os.mkdir(d)
    mib = 1 << 20
    write(d, "a.json", json.dumps(prof_dump(0, 2, 60, 59, inflight=60, peers=[peer(1, (0, 0, 0), (mib // 2, mib // 2, 0))])))
    write(d, "b.json", json.dumps(prof_dump(1, 2, 59, 58, inflight=59, peers=[peer(0, (mib, mib, mib), (mib, mib, mib // 2))])))
    rc, out = run(d)
    check(rc == 0 and "the link between rank 0 (host h0) and rank 1 (host h1) stopped delivering during allreduce #59"
          in verdict(out), "link-ahead: wrong verdict")
    check("moved on to #60; rank 1 received 512 KiB of 1 MiB from it" in out, "link-ahead: evidence not shown")


def test_net_spool(root):
    """NET records (a network plugin's events) in a spool survive the merge."""
    d = os.path.join(root, "net")
    os.mkdir(d)
    head = {"format": "ncclx-spool-1", "commHash": HASH, "rank": 0, "nranks": 2, "host": "h0", "pid": 100,
            "realOffsetNs": 1000000, "recordBytes": 64}
    out = b"NCCLXTR1\n" + json.dumps(head).encode() + b"\n"
    for i, name in enumerate(("allreduce", "float32", "sum", "ring", "simple")):
        out += b"N" + bytes([2 + i, len(name)]) + name.encode()
    # seq, start, end, bytes, count(= plugin id), type NET, peer 1, root, step; isSend, failed,
    # func, dtype, op, algo, proto, parent = STEP.
    out += b"R" + struct.pack("<5Q4i8B", 7, 2000000, 2005000, 4096, 0x7e0000f1, 0x10, 1, -1, 0, 1, 0, 2, 0, 0, 0, 0, 0x8)
    out += b"R" + struct.pack("<5Q4i8B", 7, 1000000, 3000000, 4096, 1024, 0x2, -1, -1, 0, 0, 0, 2, 3, 4, 5, 6, 0)
    write(d, "trace-r0.spool", out, mode="wb")
    merged = os.path.join(root, "net.json")
    rc, _ = run("merge", d, "-o", merged)
    with open(merged) as f:
        events = json.load(f)
    net = [e for e in events if e.get("cat") == "net"]
    check(rc == 0 and len(net) == 1 and net[0]["args"].get("plugin_id") == 0x7e0000f1 and
          net[0]["args"].get("parent") == "step" and net[0]["args"].get("op") == "allreduce" and
          net[0]["args"].get("peer") == 1 and net[0]["args"].get("dir") == "send",
          "net spool: the NET record is lost or wrong in the merge: %s" % net)


def test_clean_and_usage(root):
    d = os.path.join(root, "clean")
    os.mkdir(d)
    for r in range(3):
        write(d, "trace-%d.json" % r, trace_lines(r, 3, 6, closed=True))
    rc, out = run(d)
    check(rc == 0 and "no fault found" in verdict(out), "clean: wrong verdict")
    e = os.path.join(root, "empty")
    os.mkdir(e)
    rc, out = run(e)
    check(rc == 1 and "nothing to analyze" in out, "empty dir: exit %d" % rc)
    rc, _ = run()
    check(rc == 2, "no arguments: exit %d, expected 2" % rc)
    rc, _ = run(os.path.join(root, "no-such-dir"))
    check(rc == 2, "missing dir: exit %d, expected 2" % rc)


def test_merge(root, bad):
    out = os.path.join(root, "all.json")
    rc, text = run("merge", bad, "-o", out)
    check(rc == 0, "merge: exit %d" % rc)
    try:
        with open(out) as f:
            events = json.load(f)
    except (OSError, ValueError) as e:
        check(False, "merge: output is not valid JSON: %s" % e)
        return
    pids = sorted(set(e["pid"] for e in events if e.get("ph") == "X"))
    check(pids == [0, 1, 2], "merge: pids %s, expected [0, 1, 2]" % pids)
    spooled = [e for e in events if e.get("pid") == 1 and e.get("ph") == "X"]
    check(len(spooled) == 3 and spooled[0]["name"] == "allreduce #1" and spooled[0]["args"]["dtype"] == "float32",
          "merge: the spooled rank's events are wrong: %s" % spooled[:1])


def main():
    root = tempfile.mkdtemp(prefix="ncclx-analyze-test-")
    try:
        bad = test_bad_input(root)
        test_link(root)
        test_link_ahead(root)
        test_net_spool(root)
        test_clean_and_usage(root)
        test_merge(root, bad)
    finally:
        if not failures:
            shutil.rmtree(root)
        else:
            print("files kept in " + root)
    print("FAIL (%d)" % len(failures) if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
