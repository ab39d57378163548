#!/usr/bin/env python3
"""Driver of the emulated-host tests (tests/netns/CMakeLists.txt, label "netns").

  netns_test.py coll LAUNCHER HOSTS RPH NET PROGRAM [ARGS...]
      PROGRAM (tests/mp/coll_check) on HOSTS x RPH emulated hosts over NET (socket | ofi:
      plugin ofi with tcp;ofi_rxm | ofimsg: plugin ofi with tcp's connected endpoints);
      passes when it passes and the log shows every rank on the intended network and NIC,
      the communicator counting HOSTS hosts with shared memory on, and no fallback.
  netns_test.py pairs LAUNCHER HOSTS RPH NET PROGRAM
      PROGRAM (netns_pairs) connects every pair at init; each pair must have used shared memory
      when both ranks are on one host and NET otherwise, exactly one connection per peer.
  netns_test.py cut LAUNCHER PROGRAM TIMEOUT_S [NET]
      2 hosts x 2 ranks all-reducing in a loop (netns_cut) over NET (default socket), host 1's
      link deleted mid-loop:
      every rank must exit with an error within TIMEOUT_S + margin of the cut, and each
      rank's error must name a peer rank.
  netns_test.py launcher LAUNCHER
      the launcher itself: exit statuses, prefixes, namespaces per host, --env/--host-env,
      --outside/--enter/--rsh-agent, hard timeout, cleanup after a normal end, after SIGTERM
      and after SIGKILL (--cleanup-stale).

Exit 0 pass, 1 fail, 77 skipped (no root or no `ip netns`: the launcher says so).
"""
import os
import re
import signal
import subprocess
import sys
import time

SKIP = 77
CUT_MARGIN_S = 5.0  # scheduling slack on a loaded 2-core machine, plus the 1 s abort notice
NET_ENV = {
    "socket": [],
    "ofi": ["NCCLX_NET_PLUGIN=ofi", "NCCLX_NET_OFI_PROVIDER=tcp;ofi_rxm", "NCCLX_NET_OFI_DOMAIN=ncx0"],
    "ofimsg": ["NCCLX_NET_PLUGIN=ofi", "NCCLX_NET_OFI_PROVIDER=tcp", "NCCLX_NET_OFI_DOMAIN=ncx0"],
}
# What the plugin's provider line says for each ofi variant: provider, kind of endpoints.
OFI_LINE = {"ofi": ("NET/OFI: provider tcp;ofi_rxm (", "reliable-datagram"),
            "ofimsg": ("NET/OFI: provider tcp (", "connected endpoints")}
LINE_RE = re.compile(r"^\[r(\d+)\] (.*)$")
ACCEPT_RE = re.compile(r"NCCLX TRACE \S+ accepted (\S+) connection from rank (\d+)")
INIT_RE = re.compile(r"rank (\d+) nranks (\d+) hosts (\d+) net (\S+) dev \d+ shm (\S+) .*init complete")


class Fail(Exception):
    pass


def core_net(net):
    """The network name the core logs for a test's NET (both ofi variants are plugin ofi)."""
    return "ofi" if net.startswith("ofi") else net


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def launch(launcher, hosts, rph, env, cmd, extra=(), timeout=170):
    argv = [launcher, "--hosts", str(hosts), "--ranks-per-host", str(rph), "--timeout", str(timeout)]
    for e in env:
        argv += ["--env", e]
    argv += list(extra) + ["--"] + list(cmd)
    print("netns_test.py: $ " + " ".join(argv), flush=True)
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout + 60)
    if r.returncode == SKIP:
        print(r.stdout)
        sys.exit(SKIP)
    return r.returncode, r.stdout


def rank_lines(log):
    """(rank, text) for every forwarded line."""
    for line in log.splitlines():
        m = LINE_RE.match(line)
        if m:
            yield int(m.group(1)), m.group(2)


def show(log, keep=lambda l: "NCCLX TRACE" not in l and "NCCLX INFO" not in l):
    print("\n".join(l for l in log.splitlines() if keep(l)), flush=True)


def verify_net(log, nranks, hosts, net):
    """Every rank used `net` on the emulated NIC for its world communicator, with no fallback."""
    world = {}
    for r, text in rank_lines(log):
        m = INIT_RE.search(text)
        if m and int(m.group(2)) == nranks:
            world[r] = m
    check(sorted(world) == list(range(nranks)),
          f"'init complete' of the {nranks}-rank communicator from ranks {sorted(world)} only")
    for r, m in world.items():
        check(m.group(4) == core_net(net), f"rank {r} initialized with net {m.group(4)}, expected {core_net(net)}")
        check(int(m.group(3)) == hosts, f"rank {r} counts {m.group(3)} hosts, expected {hosts}")
        check(m.group(5) == "on", f"rank {r} has the shared-memory transport off")
    fallback = [t for _, t in rank_lines(log) if re.search(r"plugin '\w+' refused|falling back", t)]
    check(not fallback, f"a rank fell back to another network: {fallback[0] if fallback else ''}")
    if net == "socket":
        using = {r for r, t in rank_lines(log) if re.search(r"NET/Socket: using ncx0 \(198\.1[89]\.", t)}
    else:
        using = {r for r, t in rank_lines(log) if "net: using plugin 'ofi'" in t}
        prov, kind = OFI_LINE[net]
        provs = {r for r, t in rank_lines(log) if prov in t and kind in t and "0: ncx0" in t}
        check(provs == set(range(nranks)), f"ranks {sorted(set(range(nranks)) - provs)} did not "
              f"log '{prov}' with {kind} on ncx0")
    check(using == set(range(nranks)), f"ranks {sorted(set(range(nranks)) - using)} did not log "
          f"using {net} on the emulated NIC ncx0")


def mode_coll(launcher, hosts, rph, net, cmd):
    hosts, rph = int(hosts), int(rph)
    n = hosts * rph
    # INFO, not TRACE: per-message plugin traces would slow the run down (pairs checks links).
    env = NET_ENV[net] + ["NCCLX_DEBUG=INFO", "NCCLX_DEBUG_SUBSYS=INIT,NET,PLUGIN", "NCCLX_CORE_TIMEOUT_S=60"]
    rc, log = launch(launcher, hosts, rph, env, cmd)
    show(log)
    check(rc == 0, f"the job exited with status {rc}")
    verify_net(log, n, hosts, net)
    print(f"netns_test.py: PASS ({n} ranks on {hosts} hosts over {net})")


def mode_pairs(launcher, hosts, rph, net, cmd):
    hosts, rph = int(hosts), int(rph)
    n = hosts * rph
    env = NET_ENV[net] + ["NCCLX_DEBUG=TRACE", "NCCLX_DEBUG_SUBSYS=INIT,NET,PLUGIN",
                          "NCCLX_CORE_LAZY_CONNECT=0", "NCCLX_CORE_TIMEOUT_S=60"]
    rc, log = launch(launcher, hosts, rph, env, cmd)
    show(log)
    check(rc == 0, f"the job exited with status {rc}")
    verify_net(log, n, hosts, net)
    seen = {}
    for r, t in rank_lines(log):
        m = ACCEPT_RE.search(t)
        if m:
            p = int(m.group(2))
            check((r, p) not in seen, f"rank {r} accepted two connections from rank {p}")
            seen[(r, p)] = m.group(1)
    host = lambda r: r // rph  # noqa: E731
    table = []
    for r in range(n):
        for p in range(n):
            if p == r:
                continue
            want = "shm" if host(r) == host(p) else core_net(net)
            got = seen.get((r, p))
            check(got == want, f"rank {r} (host {host(r)}) <- rank {p} (host {host(p)}): "
                  f"{got or 'no connection'}, expected {want}")
            table.append(f"{p}->{r}:{got}")
    print("netns_test.py: pairs " + " ".join(table))
    print(f"netns_test.py: PASS (all {n * (n - 1)} directed pairs: shm within a host, {net} between hosts)")


def mode_cut(launcher, cmd, timeout_s, net="socket"):
    timeout_s = float(timeout_s)
    env = [f"NCCLX_CORE_TIMEOUT_S={int(timeout_s)}"] + NET_ENV[net]
    extra = ["--cut-host", "1", "--cut-on", "netns_cut: looping", "--cut-after-ms", "300",
             "--grace", str(timeout_s + 2 * CUT_MARGIN_S)]
    t0 = time.monotonic()
    rc, log = launch(launcher, 2, 2, env, list(cmd) + ["1048576", "60"], extra, timeout=90)
    show(log, keep=lambda l: "NCCLX INFO" not in l)
    check(re.search(r"cut host 1's link", log), "the link was never cut")
    check("went unnoticed" not in log, "a rank saw no error after the cut")
    ends = {int(m.group(1)): (m.group(2), float(m.group(3)))
            for m in re.finditer(r"^ncclx-hosts: r(\d+) \(host \d\) (.*?) after [\d.]+ s \(([+-][\d.]+) s from the cut\)",
                                 log, re.M)}
    check(sorted(ends) == [0, 1, 2, 3], f"exit lines for ranks {sorted(ends)} only (rc {rc})")
    bound = timeout_s + CUT_MARGIN_S
    for r, (what, since) in sorted(ends.items()):
        check(what == "exit status 1", f"rank {r}: {what}, expected exit status 1 (an error from ncclx)")
        check(since <= bound, f"rank {r} took {since:.1f} s after the cut to fail (bound {bound:.0f} s)")
    errors = {}
    for r, t in rank_lines(log):
        if t.startswith(f"netns_cut: rank {r}: ") and "failed" in t:
            errors[r] = t
    check(sorted(errors) == [0, 1, 2, 3], f"error lines from ranks {sorted(errors)} only")
    for r, t in errors.items():
        msg = t.split(": ", 3)[-1]
        check(re.search(r"\brank \d+\b", msg), f"rank {r}'s error names no peer rank: {t}")
    print(f"netns_test.py: PASS (every rank failed within {max(s for _, s in ends.values()):.1f} s "
          f"of the cut, bound {bound:.0f} s; whole run {time.monotonic() - t0:.1f} s)")


def leftover(pid):
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [l.split()[0] for l in r.stdout.splitlines() if l.startswith(f"ncclx-{pid}-")]


def mode_launcher(launcher):
    # Exit status of the first failing rank; every rank's output comes through prefixed.
    rc, log = launch(launcher, 2, 2, [], ["sh", "-c", 'echo "hello from $NCCLX_RANK of $NCCLX_NRANKS '
                                          'at $NCCLX_HOSTS_ADDR"; [ "$NCCLX_RANK" != 2 ] || exit 7'])
    print(log)
    check(rc == 7, f"a rank exiting 7 gave status {rc}")
    for r in range(4):
        check(re.search(rf"^\[r{r}\] hello from {r} of 4 at 198\.1[89]\.\d+\.{r // 2 + 1}$", log, re.M),
              f"rank {r}'s line is missing or has the wrong address")
    # Ranks of one host share a namespace, ranks of different hosts do not.
    rc, log = launch(launcher, 2, 2, [], ["sh", "-c", 'echo "ns $(readlink /proc/self/ns/net)"'])
    ns = {r: t for r, t in rank_lines(log) if t.startswith("ns ")}
    check(rc == 0 and len(ns) == 4, f"namespace probe failed (rc {rc}):\n{log}")
    check(ns[0] == ns[1] and ns[2] == ns[3] and ns[0] != ns[2], f"namespaces wrong: {ns}")
    check(ns[0] != "ns " + os.readlink("/proc/self/ns/net"), "rank 0 runs in the root namespace")
    # --env for every rank, --host-env for one host's ranks only.
    rc, log = launch(launcher, 2, 1, ["NETNS_ALL=a"], ["sh", "-c", 'echo "env $NETNS_ALL ${NETNS_ONE:-none}"'],
                     extra=["--host-env", "1:NETNS_ONE=b"])
    check(rc == 0 and re.search(r"^\[r0\] env a none$", log, re.M) and re.search(r"^\[r1\] env a b$", log, re.M),
          f"--env/--host-env not applied as asked (rc {rc}):\n{log}")
    # --outside: one command in the root namespace; --enter and --rsh-agent reach the hosts.
    probe = ('echo "outside $(readlink /proc/self/ns/net)"; '
             f'NCCLX_RANK=1 {launcher} --enter -- sh -c \'echo "enter $(hostname) $(readlink /proc/self/ns/net)"\'; '
             f'{launcher} --rsh-agent "${{NCCLX_HOSTS_ADDRS##* }}" \'echo "agent $(hostname) $(readlink /proc/self/ns/net)"\'')
    rc, log = launch(launcher, 2, 1, [], ["sh", "-c", probe], extra=["--outside"])
    root = os.readlink("/proc/self/ns/net")
    m_out = re.search(r"^outside (\S+)$", log, re.M)
    m_enter = re.search(r"^enter (\S+) (\S+)$", log, re.M)
    m_agent = re.search(r"^agent (\S+) (\S+)$", log, re.M)
    check(rc == 0 and m_out and m_enter and m_agent, f"--outside/--enter/--rsh-agent probe failed (rc {rc}):\n{log}")
    check(m_out.group(1) == root, "--outside did not run in the root namespace")
    check(m_enter.group(1).endswith("-h1") and m_enter.group(2) != root,
          f"--enter as rank 1 ran on {m_enter.group(1)} {m_enter.group(2)}, expected host 1")
    check(m_agent.groups() == m_enter.groups(), f"--rsh-agent reached {m_agent.groups()}, expected host 1")
    # Hard timeout: status 124, promptly, nothing left behind.
    t0 = time.monotonic()
    rc, log = launch(launcher, 2, 1, [], ["sleep", "30"], timeout=2)
    took = time.monotonic() - t0
    check(rc == 124, f"a job past --timeout gave status {rc}")
    check(took < 10, f"the timeout took {took:.1f} s to act")
    # SIGTERM to the launcher: ranks killed, namespaces removed.
    p = subprocess.Popen([launcher, "--hosts", "2", "--", "sleep", "30"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 10
    while not leftover(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    check(leftover(p.pid), "the launcher created no namespaces")
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=20)
    check(p.returncode == 128 + signal.SIGTERM, f"SIGTERM gave status {p.returncode}:\n{out}")
    check(not leftover(p.pid), f"namespaces left after SIGTERM: {leftover(p.pid)}")
    # SIGKILL leaves namespaces behind; --cleanup-stale removes them (and their processes).
    p = subprocess.Popen([launcher, "-q", "--hosts", "2", "--", "sleep", "30"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while len(leftover(p.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.kill()
    p.wait()
    check(leftover(p.pid), "no namespace survived SIGKILL: the stale-cleanup path is untested")
    r = subprocess.run([launcher, "--cleanup-stale"], capture_output=True, text=True, timeout=60)
    print(r.stderr.strip())
    check(r.returncode == 0, f"--cleanup-stale exited {r.returncode}")
    check(not leftover(p.pid), f"--cleanup-stale left {leftover(p.pid)}")
    print("netns_test.py: PASS (statuses, prefixes, namespaces per host, --env/--host-env, --outside, "
          "--enter, --rsh-agent, timeout, SIGTERM and stale cleanup)")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    mode, args = argv[0], argv[1:]
    try:
        if mode == "coll" and len(args) >= 5:
            mode_coll(args[0], args[1], args[2], args[3], args[4:])
        elif mode == "pairs" and len(args) == 5:
            mode_pairs(args[0], args[1], args[2], args[3], args[4:])
        elif mode == "cut" and len(args) in (3, 4) and (len(args) == 3 or args[3] in NET_ENV):
            mode_cut(args[0], args[1:2], args[2], *args[3:])
        elif mode == "launcher" and len(args) == 1:
            mode_launcher(args[0])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Fail as e:
        print(f"netns_test.py: FAIL: {e}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
