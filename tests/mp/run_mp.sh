#!/bin/sh
# Launch a multi-process test: run_mp.sh NP PROGRAM [ARGS...]
#
# Picks a free TCP port on 127.0.0.1 for the rendezvous (NCCLX_COMM_ID, where rank 0
# listens), forwards every NCCLX_* variable to the ranks, and runs NP copies of PROGRAM
# under Open MPI's mpirun (only as a launcher: the programs do not link MPI). A hard
# timeout (MP_TIMEOUT seconds, default 240) keeps a hung job from blocking CI. The exit code
# is non-zero when any rank fails or the job times out (124).
set -u

if [ $# -lt 2 ]; then
  echo "usage: $0 NP PROGRAM [ARGS...]" >&2
  exit 2
fi
np=$1
shift

# A port below the kernel's ephemeral range, where concurrent tests' connections cannot take
# it between our probe and rank 0's bind (tools/ncclx-run --free-port says why).
free_port() {
  python3 "$(dirname "$0")/../../tools/ncclx-run" --free-port
}

# Without python3, fall back to a pseudo-random port in a range the kernel does not hand
# out for outgoing connections by default (ephemeral ports start at 32768).
port=$(free_port 2>/dev/null) || port=$((20000 + $$ % 12000))
NCCLX_COMM_ID="127.0.0.1:${port}"
export NCCLX_COMM_ID

# Forward NCCLX_* settings (timeouts, debug level, algorithm choices) to every rank.
forward=""
for name in $(env | sed -n 's/^\(NCCLX_[A-Za-z0-9_]*\)=.*/\1/p'); do
  forward="$forward -x $name"
done

# Quiet Open MPI on machines without a fabric or hwloc topology; no MPI runs inside.
export OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none

echo "run_mp.sh: np=$np NCCLX_COMM_ID=$NCCLX_COMM_ID $*"
run() {
  # shellcheck disable=SC2086  # $forward is a list of words on purpose
  timeout --kill-after=10 "${MP_TIMEOUT:-240}" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none $forward -np "$np" "$@"
}
if [ -z "${MP_EXPECT:-}" ]; then
  run "$@"
  exit $?
fi
# MP_EXPECT: an extended regular expression the job's output must contain (a mode line, say)
# besides every rank succeeding.
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
{ run "$@"; echo $? >"$tmp/rc"; } 2>&1 | tee "$tmp/out"
rc=$(cat "$tmp/rc" 2>/dev/null || echo 1)
[ "$rc" -ne 0 ] && exit "$rc"
if ! grep -Eq "$MP_EXPECT" "$tmp/out"; then
  echo "run_mp.sh: the output does not contain /$MP_EXPECT/"
  exit 1
fi
exit 0
