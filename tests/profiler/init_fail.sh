#!/bin/sh
# A trace profiler whose init fails is reported (naming what is wrong) and disabled; the job
# runs on and produces correct results.
#   init_fail.sh NCCLX-PERF
perf=$1
out=$(mktemp)
fail=0
run() { # expected-text... ; runs a 2-rank allreduce with the environment set by the caller
  "$perf" allreduce -np 2 -b 8 -e 4K -n 5 -T 120 >"$out" 2>&1
  rc=$?
  cat "$out"
  [ $rc -eq 0 ] || { echo "FAIL: ncclx-perf exited $rc with a broken profiler"; fail=1; }
  grep -q "profiler plugin 'trace' failed to initialize" "$out" || { echo "FAIL: the failed init is not reported"; fail=1; }
  for text in "$@"; do
    grep -q -- "$text" "$out" || { echo "FAIL: the report does not mention '$text'"; fail=1; }
  done
}
export NCCLX_PROFILER_PLUGIN=trace
echo "== dir in an unwritable place"
NCCLX_PROFILER_TRACE_DIR=/proc/ncclx-no-such-dir/trace run "/proc/ncclx-no-such-dir"
echo "== a bad value"
dir=$(mktemp -d)
NCCLX_PROFILER_TRACE_DIR=$dir NCCLX_PROFILER_TRACE_EVENTS=coll,bogus run "env NCCLX_PROFILER_TRACE_EVENTS" "bogus"
[ -z "$(ls "$dir")" ] || { echo "FAIL: a disabled profiler wrote files: $(ls "$dir")"; fail=1; }
rm -rf "$dir" "$out"
[ $fail -eq 0 ] && echo PASS || echo FAIL
exit $fail
