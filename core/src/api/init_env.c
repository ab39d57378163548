/* ncclxCommInitFromEnv: rank and size from the launcher, rendezvous at NCCLX_COMM_ID, or
 * multi-root at NCCLX_COMM_IDS=host:port,host:port,... (entry g served by rank
 * ceil(g * nranks / nIds), docs/init.md). */
#include <errno.h>
#include <stdlib.h>

#include "bootstrap/bootstrap.h"
#include "util/debug.h"

#define API __attribute__((visibility("default")))

/* First variable of the list that is set; -1 when none. Garbage is an error. */
static ncclxResult_t envInt(const char* const* names, const char** found, long* out) {
  *out = -1;
  *found = NULL;
  for (; *names; names++) {
    const char* v = getenv(*names);
    if (!v || !*v) continue;
    char* end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 0 || x > 1 << 30)
      return ncclxSetError(ncclxInvalidUsage, "ncclxCommInitFromEnv: %s=%s is not a valid number", *names, v);
    *out = x;
    *found = *names;
    return ncclxSuccess;
  }
  return ncclxSuccess;
}

API ncclxResult_t ncclxCommInitFromEnv(ncclxComm_t* comm) {
  static const char* const rankVars[] = {"NCCLX_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                         "SLURM_PROCID", "RANK", NULL};
  static const char* const sizeVars[] = {"NCCLX_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                         "SLURM_NTASKS", "WORLD_SIZE", NULL};
  if (!comm) return ncclxSetError(ncclxInvalidArgument, "ncclxCommInitFromEnv: comm is NULL");
  *comm = NULL;
  long rank, size;
  const char *rankVar, *sizeVar;
  NCCLX_CHECK(envInt(rankVars, &rankVar, &rank));
  NCCLX_CHECK(envInt(sizeVars, &sizeVar, &size));
  if (rank < 0 || size < 0)
    return ncclxSetError(ncclxInvalidUsage,
                         "ncclxCommInitFromEnv: no launcher variables found (%s is missing); set "
                         "NCCLX_RANK and NCCLX_NRANKS, or launch with mpirun, srun or torchrun",
                         rank < 0 ? "rank" : "size");
  if (rank >= size)
    return ncclxSetError(ncclxInvalidUsage, "ncclxCommInitFromEnv: %s=%ld is not below %s=%ld", rankVar,
                         rank, sizeVar, size);
  const char* list = getenv("NCCLX_COMM_IDS");
  if (list && *list) {
    ncclxUniqueId* ids = NULL;
    int nIds = 0;
    NCCLX_CHECK(bootstrapIdsFromString(list, &ids, &nIds));
    ncclxResult_t res = ncclxCommInitRankScalable(comm, (int)size, (int)rank, nIds, ids, NULL);
    free(ids);
    return res;
  }
  const char* addr = getenv("NCCLX_COMM_ID");
  if (!addr || !*addr)
    return ncclxSetError(ncclxInvalidUsage,
                         "ncclxCommInitFromEnv: NCCLX_COMM_ID=host:port is not set (rank 0 listens there)");
  ncclxUniqueId id;
  NCCLX_CHECK(bootstrapIdFromString(addr, &id));
  return ncclxCommInitRank(comm, (int)size, id, (int)rank);
}
