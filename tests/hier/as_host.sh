#!/bin/sh
# Run one rank as if it were on its own host: as_host.sh LAYOUT PROGRAM [ARGS...]
#
# LAYOUT lists the host of every rank, comma-separated ("0,0,0,1,1": ranks 0-2 on host 0,
# ranks 3-4 on host 1). The rank comes from the launcher (OMPI_COMM_WORLD_RANK, PMI_RANK,
# PMIX_RANK or NCCLX_RANK), so
# `run_mp.sh NP as_host.sh LAYOUT PROGRAM` gives each rank its own NCCLX_CORE_HOST_ID while
# run_mp.sh passes one environment to all. Ranks with different ids use the network between
# them and count as different hosts in hierarchical collectives.
# With AS_HOST_STDERR_DIR set, the rank's stderr goes to DIR/rank.N (mpirun's merged output
# can splice one rank's log line into another's when ranks log fast).
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 LAYOUT PROGRAM [ARGS...]" >&2
  exit 2
fi
layout=$1
shift
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-${NCCLX_RANK:-}}}}
if [ -z "$rank" ]; then
  echo "as_host.sh: no rank from the launcher (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, NCCLX_RANK)" >&2
  exit 2
fi
host=$(echo "$layout" | cut -d, -f$((rank + 1)))
if [ -z "$host" ]; then
  echo "as_host.sh: layout '$layout' has no entry for rank $rank" >&2
  exit 2
fi
NCCLX_CORE_HOST_ID="emulated-host-$host"
export NCCLX_CORE_HOST_ID
if [ -n "${AS_HOST_STDERR_DIR:-}" ]; then
  exec 2>>"$AS_HOST_STDERR_DIR/rank.$rank"
fi
exec "$@"
