"""Shared by the profiler tests: run a 2-rank ncclx-perf allreduce over the network with the
trace profiler loaded, and read back every rank's trace file."""
import glob
import json
import os
import subprocess


def run_perf(perf, outdir, events, max_size, extra_env, clear_net_env=False):
    """ncclx-perf allreduce -np 2 from 8 B to max_size, shared memory off (every byte crosses
    the network), trace events `events` written to outdir. clear_net_env drops inherited
    NCCLX_NET_* settings (but the socket interface) before extra_env is applied.
    Returns (exit status, combined output)."""
    env = dict(os.environ)
    if clear_net_env:
        for k in list(env):
            if k.startswith("NCCLX_NET_") and k != "NCCLX_NET_SOCKET_IFNAME":
                del env[k]
    env.update({"NCCLX_CORE_SHM": "false", "NCCLX_PROFILER_PLUGIN": "trace", "NCCLX_PROFILER_TRACE_DIR": outdir,
                "NCCLX_PROFILER_TRACE_EVENTS": events, "NCCLX_PROFILER_TRACE_SUMMARY": "none",
                "NCCLX_DEBUG": "INFO", "NCCLX_DEBUG_SUBSYS": "PLUGIN,NET"})
    env.update(extra_env)
    cmd = [perf, "allreduce", "-np", "2", "-b", "8", "-e", max_size, "-f", "8", "-n", "5", "-w", "1", "-T", "100"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=110)
    return p.returncode, p.stdout


def load_traces(outdir):
    """{path: [events]} for every trace-*-rank*.json in outdir (one JSON event per line)."""
    traces = {}
    for path in sorted(glob.glob(os.path.join(outdir, "trace-*-rank*.json"))):
        with open(path) as f:
            traces[path] = [json.loads(l.rstrip(",\n")) for l in f if l.strip() not in ("[", "]", "")]
    return traces


def expect_no_net_events(label, outdir, errors):
    """Every trace in outdir has no NET event (net was left out of the activation mask);
    appends a message to errors for each that has some."""
    for path, evs in load_traces(outdir).items():
        n = sum(1 for e in evs if e.get("cat") == "net")
        print("%s: %s: %d NET events" % (label, os.path.basename(path), n))
        if n:
            errors.append("%s: %d NET events although net is not in the activation mask" % (path, n))
