#!/bin/sh
# End-to-end test of ncclx-perf --calibrate, --tune and --verify:
#   e2e_tune.sh PATH/TO/ncclx-perf PLUGIN_DIR
#
#   A. --tune at 2 and 3 ranks (every collective, small sizes, few iterations) writes a rules
#      file with hosts 1 and the rank count filled in; the rules plugin loads it without a
#      warning, its rules match calls, and every collective gives correct results (-c 1).
#   B. --verify runs the rules against the default tuner and prints a ratio per size
#      (exit 0, or 4 when this loaded machine made some size look slower).
#   C. --calibrate writes a model file (shm constants; net ones with [core] shm = false)
#      that the core then uses ([tuner] model via NCCLX_TUNER_MODEL), results correct.
#   D. a bad model file: a WARN naming file:line, the built-in constants, results correct.
set -u

perf=${1:?usage: e2e_tune.sh ncclx-perf plugin-dir}
plugindir=${2:?usage: e2e_tune.sh ncclx-perf plugin-dir}
if [ ! -x "$perf" ] || [ ! -f "$plugindir/libncclx-tuner-rules.so" ]; then
  echo "e2e_tune: SKIP: $perf or $plugindir/libncclx-tuner-rules.so not built"
  exit 77
fi

tmp=$(mktemp -d /tmp/ncclx-tune-e2e-XXXXXX) || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

unset NCCLX_ALGO NCCLX_TUNER_PLUGIN NCCLX_TUNER_RULES_FILE NCCLX_TUNER_MODEL NCCLX_CORE_SHM
export NCCLX_CONF_FILE="$tmp/empty.ini" NCCLX_CORE_PLUGIN_PATH="$plugindir"
: >"$tmp/empty.ini"
export NCCLX_NET_SOCKET_IFNAME="${NCCLX_NET_SOCKET_IFNAME:-lo}" NCCLX_CORE_TIMEOUT_S="${NCCLX_CORE_TIMEOUT_S:-60}"
sizes="-b 8 -e 4K -f 8"

# check_ok NAME: the ncclx-perf output NAME.out says every op's results were right.
check_ok() {
  grep -q "FAILED\|WRONG" "$tmp/$1.out" && fail "$1: wrong results"
  grep -q "Out of bounds values : 0 OK" "$tmp/$1.out" || fail "$1: no correct-results line"
}

# --- A: --tune, then the rules file in use ---
for np in 2 3; do
  "$perf" --tune -np "$np" $sizes -n 3 -w 1 --tol 0 -T 120 -o "$tmp/r$np.rules" \
    >"$tmp/tune$np.out" 2>"$tmp/tune$np.log"
  rc=$?
  [ $rc -eq 0 ] || { fail "A: --tune -np $np exited with $rc"; tail -20 "$tmp/tune$np.log"; continue; }
  [ -s "$tmp/r$np.rules" ] || { fail "A: --tune -np $np wrote no $tmp/r$np.rules"; continue; }
  grep -q "^# --tune allreduce: nranks $np, nhosts 1" "$tmp/tune$np.out" || fail "A: no sweep table for allreduce at $np ranks"
  grep -q "^# reduce: only tree can run" "$tmp/tune$np.out" || fail "A: reduce not reported as untunable"
  grep -q "WRONG" "$tmp/tune$np.out" && fail "A: the sweep at $np ranks saw wrong results"
  nrules=$(grep -vc '^#' "$tmp/r$np.rules")
  bad=$(grep -v '^#' "$tmp/r$np.rules" | awk -F, -v np="$np" '
      { gsub(/ /, "") } NF != 9 || $8 != "1" || $9 != np || $5 != "simple" { print }')
  [ -z "$bad" ] || fail "A: rules without hosts 1 / ranks $np / 9 fields: $bad"
  NCCLX_TUNER_PLUGIN=rules NCCLX_TUNER_RULES_FILE="$tmp/r$np.rules" NCCLX_DEBUG=INFO \
    NCCLX_DEBUG_SUBSYS=TUNING "$perf" all -np "$np" $sizes -n 2 -w 1 -c 1 -T 120 \
    >"$tmp/use$np.out" 2>"$tmp/use$np.log"
  rc=$?
  [ $rc -eq 0 ] || { fail "A: ncclx-perf all with the rules at $np ranks exited with $rc"; tail -20 "$tmp/use$np.log"; }
  check_ok "use$np"
  if [ "$nrules" -gt 0 ]; then
    grep -q "INFO tuner rules: $nrules rule(s): 0 from \[tuner.rules\] keys, $nrules from $tmp/r$np.rules" \
      "$tmp/use$np.log" || fail "A: the plugin did not load the $nrules rules of r$np.rules"
    grep -q "INFO tuner rules: rule $tmp/r$np.rules:[0-9]* matches" "$tmp/use$np.log" ||
      fail "A: no rule of r$np.rules matched a call"
  fi
  grep -q "WARN tuner" "$tmp/use$np.log" && [ "$nrules" -gt 0 ] &&
    { fail "A: tuner warnings with r$np.rules:"; grep "WARN tuner" "$tmp/use$np.log" | head -5; }
  echo "ok: A: $np ranks: $nrules rule(s) written, loaded and used, results correct"
done

# --- B: --verify ---
if [ -s "$tmp/r2.rules" ]; then
  "$perf" --verify "$tmp/r2.rules" allreduce -np 2 $sizes -n 3 -w 1 -T 120 >"$tmp/verify.out" 2>"$tmp/verify.log"
  rc=$?
  { [ $rc -eq 0 ] || [ $rc -eq 4 ]; } || { fail "B: --verify exited with $rc"; tail -20 "$tmp/verify.log"; }
  grep -q "^# verify: worst ratio .*results checked, OK" "$tmp/verify.out" || fail "B: no verify summary"
  n=$(grep -c "^ allreduce " "$tmp/verify.out")
  [ "$n" -eq 4 ] || fail "B: $n allreduce sizes in the verify table, want 4"
  echo "ok: B: --verify printed $n ratios (exit $rc)"
fi

# --- C: --calibrate, then the model in use ---
"$perf" --calibrate -np 2 -b 8 -e 64K -f 16 -n 5 -w 1 -T 120 -o "$tmp/shm.conf" >"$tmp/cal.out" 2>"$tmp/cal.log"
rc=$?
[ $rc -eq 0 ] || { fail "C: --calibrate exited with $rc"; tail -20 "$tmp/cal.log"; }
grep -q "^shm.alpha_us = " "$tmp/shm.conf" && grep -q "^shm.beta_us_per_byte = " "$tmp/shm.conf" &&
  grep -q "^gamma_us_per_byte = " "$tmp/shm.conf" || fail "C: shm.conf lacks shm or gamma constants"
grep -q "^net\." "$tmp/shm.conf" && fail "C: shm.conf has net constants without a net peer"
grep -q "^# shm: alpha .* us, beta .* us/B" "$tmp/cal.out" || fail "C: no shm fit printed"
NCCLX_CORE_SHM=false "$perf" --calibrate -np 2 -b 8 -e 64K -f 16 -n 5 -w 1 -T 120 -o "$tmp/net.conf" \
  >"$tmp/calnet.out" 2>"$tmp/calnet.log" || fail "C: --calibrate with shm off failed"
grep -q "^net.alpha_us = " "$tmp/net.conf" && ! grep -q "^shm\." "$tmp/net.conf" ||
  fail "C: net.conf should hold net constants only"
NCCLX_TUNER_MODEL="$tmp/shm.conf" NCCLX_DEBUG=INFO NCCLX_DEBUG_SUBSYS=TUNING \
  "$perf" allreduce -np 2 $sizes -n 2 -c 1 -T 120 >"$tmp/model.out" 2>"$tmp/model.log" ||
  fail "C: ncclx-perf with the calibrated model failed"
check_ok model
grep -q "INFO tuner model ($tmp/shm.conf): shm alpha" "$tmp/model.log" || fail "C: the core did not use $tmp/shm.conf"
echo "ok: C: calibrated shm and net constants written and used"

# --- D: a bad model file ---
printf 'shm.alpha_us = 1\nshm.alpha = 2\n' >"$tmp/bad.conf"
NCCLX_TUNER_MODEL="$tmp/bad.conf" "$perf" allreduce -np 2 $sizes -n 2 -c 1 -T 120 \
  >"$tmp/bad.out" 2>"$tmp/bad.log" || fail "D: ncclx-perf with a bad model file failed"
check_ok bad
grep -q "WARN tuner model: $tmp/bad.conf:2: unknown key 'shm.alpha'" "$tmp/bad.log" || fail "D: no WARN naming bad.conf:2"
grep -q "using the built-in constants" "$tmp/bad.log" || fail "D: no word on the built-in constants"
echo "ok: D: a bad model file is reported with file:line and the defaults are used"

if [ $failures -ne 0 ]; then
  echo "e2e_tune: $failures failure(s); files are in $tmp"
  exit 1
fi
rm -rf "$tmp"
echo "e2e_tune: all checks passed"
