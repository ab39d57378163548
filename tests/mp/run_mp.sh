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

free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
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
# shellcheck disable=SC2086  # $forward is a list of words on purpose
exec timeout --kill-after=10 "${MP_TIMEOUT:-240}" \
  mpirun --allow-run-as-root --oversubscribe --bind-to none $forward -np "$np" "$@"
