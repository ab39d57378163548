#!/bin/sh
# rank_env.sh VAR V0,V1,... PROGRAM [ARGS...]
# Run PROGRAM with VAR set to the value of the list picked by this process's rank
# (OMPI_COMM_WORLD_RANK modulo the list's length), so that ranks of one job can be
# configured differently (e.g. a different number of ofi endpoints per rank).
set -u
[ $# -ge 3 ] || { echo "usage: $0 VAR V0,V1,... PROGRAM [ARGS...]" >&2; exit 2; }
var=$1 list=$2
shift 2
rank=${OMPI_COMM_WORLD_RANK:?rank_env.sh runs under mpirun (OMPI_COMM_WORLD_RANK is not set)}
n=$(echo "$list" | tr ',' '\n' | wc -l)
value=$(echo "$list" | tr ',' '\n' | sed -n "$((rank % n + 1))p")
export "$var=$value"
exec "$@"
