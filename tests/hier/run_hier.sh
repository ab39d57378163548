#!/bin/sh
# Run a test program (tests/mp's coll_check, hier_inplace) with every hierarchical algorithm
# forced on several (emulated) hosts, and check from the COLL log that they ran:
#
#   run_hier.sh LAYOUT PROGRAM [ARGS...]
#   run_hier.sh --netns NCCLX_HOSTS HOSTS RANKS_PER_HOST PROGRAM [ARGS...]
#
# LAYOUT is the host of each rank ("0,0,0,1,1"; see as_host.sh): ranks of this machine
# launched by run_mp.sh, each with its own NCCLX_CORE_HOST_ID. With --netns, the ranks run
# in network namespaces made by tools/ncclx-hosts (real separate addresses; exit 77, skipped,
# when namespaces cannot be made here). Fails when the program fails, or when a call of a
# hierarchical collective on the full communicator ran another algorithm, or one of them
# never ran at all. HIER_COLLS lists the collectives the program must call (API names
# without "ncclx"; default: all five).
set -u
usage() {
  echo "usage: $0 LAYOUT PROGRAM [ARGS...]" >&2
  echo "       $0 --netns NCCLX_HOSTS HOSTS RANKS_PER_HOST PROGRAM [ARGS...]" >&2
  exit 2
}
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--netns" ]; then
  [ $# -ge 5 ] || usage
  launcher=$2 hosts=$3 perHost=$4
  shift 4
  np=$((hosts * perHost))
  layout="${hosts}x${perHost} in network namespaces"
else
  [ $# -ge 2 ] || usage
  launcher="" layout=$1
  shift
  np=$(echo "$layout" | tr ',' '\n' | grep -c .)
fi
colls=${HIER_COLLS:-AllReduce Broadcast Reduce AllGather AllToAll}

NCCLX_ALGO=allreduce:hierarchical,broadcast:hierarchical,reduce:hierarchical,allgather:hierarchical,alltoall:hierarchical
NCCLX_DEBUG=INFO
NCCLX_DEBUG_SUBSYS=COLL
export NCCLX_ALGO NCCLX_DEBUG NCCLX_DEBUG_SUBSYS

log=$(mktemp)
ranklogs=$(mktemp -d)
trap 'rm -rf "$log" "$ranklogs"' EXIT
if [ -n "$launcher" ]; then
  "$launcher" --hosts "$hosts" --ranks-per-host "$perHost" --timeout 200 \
    --env NCCLX_ALGO="$NCCLX_ALGO" --env NCCLX_DEBUG=INFO --env NCCLX_DEBUG_SUBSYS=COLL \
    -- "$@" >"$log" 2>&1
else
  # One stderr file per rank: mpirun's merged stream garbled a COLL line now and then.
  AS_HOST_STDERR_DIR=$ranklogs "$here/../mp/run_mp.sh" "$np" "$here/as_host.sh" "$layout" "$@" \
    >"$log" 2>&1
fi
status=$?
cat "$ranklogs"/rank.* >>"$log" 2>/dev/null
# The test's own verdict and any errors, without the thousands of per-call log lines.
grep -v "NCCLX INFO" "$log"
if [ -n "$launcher" ] && [ "$status" -eq 77 ]; then
  echo "run_hier: skipped (ncclx-hosts cannot make network namespaces here)"
  exit 77
fi
if [ "$status" -ne 0 ]; then
  echo "run_hier: the program failed (exit $status)"
  exit "$status"
fi

fail=0
for c in $colls; do
  calls=$(grep -c "NCCLX INFO ncclx$c #.* nranks $np algo " "$log")
  hier=$(grep -c "NCCLX INFO ncclx$c #.* nranks $np algo hierarchical " "$log")
  echo "run_hier: ncclx$c on $np ranks: $hier of $calls calls hierarchical"
  if [ "$calls" -eq 0 ] || [ "$hier" -ne "$calls" ]; then
    grep "NCCLX INFO ncclx$c #.* nranks $np algo " "$log" | grep -v "algo hierarchical " | head -3
    fail=1
  fi
done
# The host map each rank of the full communicator built (one line per rank).
world=$(sed -n "s/.*NCCLX INFO ncclx[A-Za-z]* #.* comm \([^ ]*\) nranks $np algo .*/\1/p" "$log" | head -1)
echo "run_hier: layout $layout, host maps of comm $world:"
grep "NCCLX INFO hierarchical: comm $world " "$log" | sed 's/.*NCCLX INFO hierarchical: comm [^ ]* /  /' | sort -k2n
if [ "$fail" -ne 0 ]; then
  echo "run_hier: FAIL (a hierarchical collective ran another algorithm)"
  exit 1
fi
echo "run_hier: PASS"
