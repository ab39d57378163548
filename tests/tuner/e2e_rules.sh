#!/bin/sh
# End-to-end test of the rules tuner: e2e_rules.sh PATH/TO/ncclx-perf PLUGIN_DIR
#
# Runs ncclx-perf with 3 forked ranks (-np 3, results checked with -c 1) and reads the
# core's per-call INFO line "ncclxAllReduce #N: count C TYPE ... algo A proto P"
# (NCCLX_DEBUG=INFO, NCCLX_DEBUG_SUBSYS=COLL,TUNING) to check which algorithm each call used.
#   A. rules file via the environment: allreduce -> ring, allgather -> bruck, all sizes.
#   B. rules as [tuner.rules] keys of an ncclx.ini: allreduce <= 4K -> tree, larger ->
#      rabenseifner (size boundary and first match wins).
#   C. an invalid rules file: the plugin refuses to start, the core says so and runs with
#      its default choice, results still right.
# A control run without a tuner shows what the default would have picked.
set -u

perf=${1:?usage: e2e_rules.sh ncclx-perf plugin-dir}
plugindir=${2:?usage: e2e_rules.sh ncclx-perf plugin-dir}
if [ ! -x "$perf" ] || [ ! -f "$plugindir/libncclx-tuner-rules.so" ]; then
  echo "e2e_rules: SKIP: $perf or $plugindir/libncclx-tuner-rules.so not built"
  exit 77
fi

tmp=$(mktemp -d /tmp/ncclx-tuner-e2e-XXXXXX) || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# Every setting comes from here, not from an ncclx.ini that happens to be around.
unset NCCLX_ALGO NCCLX_TUNER_PLUGIN NCCLX_TUNER_RULES_FILE
export NCCLX_CONF_FILE="$tmp/empty.ini" NCCLX_CORE_PLUGIN_PATH="$plugindir"
: >"$tmp/empty.ini"
export NCCLX_NET_SOCKET_IFNAME="${NCCLX_NET_SOCKET_IFNAME:-lo}" NCCLX_CORE_TIMEOUT_S="${NCCLX_CORE_TIMEOUT_S:-60}"

# run NAME OP: ncclx-perf OP on 3 ranks; stdout to $tmp/NAME.out, the log to $tmp/NAME.log.
run() {
  NCCLX_DEBUG=INFO NCCLX_DEBUG_SUBSYS=COLL,TUNING \
    "$perf" "$2" -np 3 -b 8 -e 1M -n 2 -w 1 -c 1 -T 120 >"$tmp/$1.out" 2>"$tmp/$1.log"
  rc=$?
  if [ $rc -ne 0 ]; then
    fail "$1: ncclx-perf $2 exited with $rc"
    cat "$tmp/$1.out"
    tail -20 "$tmp/$1.log"
  fi
  grep -q "Out of bounds values : 0 OK" "$tmp/$1.out" || fail "$1: ncclx-perf $2 found wrong results"
}

# algos NAME FUNC: "bytes algo" for each call of FUNC (ncclxAllReduce...) in NAME's log.
algos() {
  awk -v f="$2" '
    function size(t) {
      if (t ~ /^u?int8$/) return 1
      if (t ~ /^(b?float16)$/) return 2
      if (t ~ /^(u?int32|float32)$/) return 4
      return 8
    }
    {
      for (i = 1; i < NF; i++) if ($i == f) break
      if (i == NF || $(i + 1) !~ /^#[0-9]+:$/ || $(i + 2) != "count") next
      for (j = i; j < NF; j++) if ($j == "algo") break
      print $(i + 3) * size($(i + 4)), $(j + 1)
    }' "$tmp/$1.log"
}

# expect NAME FUNC ALGO [LIMIT ALGO2]: every FUNC call used ALGO (ALGO2 above LIMIT bytes).
expect() {
  name=$1 func=$2 small=$3 limit=${4:-} large=${5:-}
  algos "$name" "$func" >"$tmp/$name.$func.algos"
  calls=$(wc -l <"$tmp/$name.$func.algos")
  [ "$calls" -ge 3 ] || fail "$name: only $calls $func call(s) in the log"
  bad=$(awk -v s="$small" -v lim="$limit" -v l="$large" '
      { want = (lim == "" || $1 <= lim + 0) ? s : l; if ($2 != want) print $1 " bytes: " $2 " (want " want ")" }' \
      "$tmp/$name.$func.algos" | sort -u)
  if [ -n "$bad" ]; then
    fail "$name: $func calls with the wrong algorithm:"
    echo "$bad" | head -10
  else
    echo "ok: $name: $calls $func calls, all as the rules say ($small${limit:+ up to $limit bytes, $large above})"
  fi
}

# --- control: the core's own choice at 3 ranks ---
NCCLX_TUNER_PLUGIN=none run control allreduce
NCCLX_TUNER_PLUGIN=none run control_ag allgather
echo "control (no tuner): allreduce uses $(algos control ncclxAllReduce | awk '{print $2}' | sort -u | tr '\n' ' ')," \
  "allgather uses $(algos control_ag ncclxAllGather | awk '{print $2}' | sort -u | tr '\n' ' ')"

# --- A: rules file named by the environment ---
cat >"$tmp/a.rules" <<'EOF'
# collective, min, max, algorithm, protocol, chunk, channels, hosts, ranks
allreduce, any, any, ring,  simple, 0, 0, any, any
allgather, any, any, bruck, simple, 0, 0, any, 3
EOF
export NCCLX_TUNER_PLUGIN=rules NCCLX_TUNER_RULES_FILE="$tmp/a.rules"
run a allreduce
run a_ag allgather
unset NCCLX_TUNER_PLUGIN NCCLX_TUNER_RULES_FILE
expect a ncclxAllReduce ring
expect a_ag ncclxAllGather bruck
for r in 0 1 2; do
  grep -q "\[$r\] NCCLX INFO tuner rules: rule $tmp/a.rules:2 matches allreduce" "$tmp/a.log" ||
    fail "A: rank $r did not log the match of a.rules:2"
  grep -q "\[$r\] NCCLX INFO tuner rules: rule $tmp/a.rules:3 matches allgather" "$tmp/a_ag.log" ||
    fail "A: rank $r did not log the match of a.rules:3"
done
n=$(grep -c "INFO tuner rules: rule .* matches allreduce" "$tmp/a.log")
[ "$n" -eq 3 ] || fail "A: $n INFO match lines for the allreduce rule, want 3 (once per rank)"

# --- B: rules as ncclx.ini keys ---
cat >"$tmp/b.ini" <<'EOF'
[tuner]
plugin = rules
[tuner.rules]
rule2 = allreduce, any, any, rabenseifner, simple, 0, 0, any, any
rule1 = allreduce, 0, 4K, tree, simple, 64K, 0, 1, 3
EOF
NCCLX_CONF_FILE="$tmp/b.ini" run b allreduce
expect b ncclxAllReduce tree 4096 rabenseifner
grep -q "INFO tuner rules: rule $tmp/b.ini:5 (rule1) matches allreduce" "$tmp/b.log" ||
  fail "B: no INFO line for rule1 at b.ini:5"

# --- C: an invalid rules file: refused with file:line, the default tuner runs ---
printf 'allreduce, any, any, rign, simple, 0, 0, any, any\n' >"$tmp/c.rules"
NCCLX_TUNER_PLUGIN=rules NCCLX_TUNER_RULES_FILE="$tmp/c.rules" run c allreduce
grep -q "WARN tuner rules: $tmp/c.rules:1: invalid rule .*unknown algorithm 'rign'" "$tmp/c.log" ||
  fail "C: no WARN naming c.rules:1 and the unknown algorithm"
grep -q "WARN tuner plugin 'rules' failed to initialize" "$tmp/c.log" ||
  fail "C: the core did not say it runs without the rules tuner"
algos c ncclxAllReduce | awk '{print $2}' | sort -u >"$tmp/c.set"
algos control ncclxAllReduce | awk '{print $2}' | sort -u >"$tmp/control.set"
cmp -s "$tmp/c.set" "$tmp/control.set" || fail "C: algorithms differ from the control run"

if [ $failures -ne 0 ]; then
  echo "e2e_rules: $failures failure(s); logs were in $tmp"
  exit 1
fi
rm -rf "$tmp"
echo "e2e_rules: all checks passed"
