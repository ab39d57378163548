/* Ranks as forked children of one parent, for the fault tests: mpirun aborts the whole job
 * when a rank dies, so tests that kill or leave out a rank run their own processes.
 *
 * The parent creates the unique id (ncclxGetUniqueId) before forking, like an application
 * that broadcasts it, and checks every child's exit status against a wall-clock deadline;
 * children still running at the deadline are killed and reported. */
#ifndef MP_FORK_H
#define MP_FORK_H

#include <sys/types.h>

#include "ncclx.h"

#define MP_MAX_RANKS 16

typedef int (*mpRankFn)(int rank, int nranks, ncclxUniqueId id, void* arg);

typedef struct {
  int nranks;
  pid_t pid[MP_MAX_RANKS]; /* 0: not started */
  int done[MP_MAX_RANKS];
  int status[MP_MAX_RANKS]; /* from waitpid */
  double endTime[MP_MAX_RANKS];
  int releaseFd[2]; /* children in mpWaitRelease block until the parent closes [1] */
} mpJob;

void mpJobInit(mpJob* job, int nranks);
/* Fork rank `rank`; the child exits with fn's return value. */
void mpJobSpawn(mpJob* job, int rank, mpRankFn fn, ncclxUniqueId id, void* arg);
/* Parent: wait until every listed rank has ended or `deadline` (mpNow() time) passes.
 * Returns the number of listed ranks still running. */
int mpJobWait(mpJob* job, const int* ranks, int n, double deadline);
/* Parent: let the children blocked in mpWaitRelease go on. */
void mpJobRelease(mpJob* job);
/* Parent: SIGKILL and reap every child still running; returns how many there were. */
int mpJobKillRest(mpJob* job);
/* Child: block until the parent calls mpJobRelease (0) or maxSec passes (-1). */
int mpWaitRelease(mpJob* job, double maxSec);

/* A whole job: a fresh unique id, nranks children running fn, waited for up to timeoutSec;
 * every rank that did not exit 0 is printed with its status (then killed if still running).
 * Returns how many ranks did not exit 0 (nranks when no unique id could be made). */
int mpRunJob(int nranks, mpRankFn fn, void* arg, double timeoutSec);

/* "exit 0", "exit 3", "killed by signal 9", "still running". */
const char* mpDescribeStatus(const mpJob* job, int rank, char* buf, size_t size);
int mpExitedZero(const mpJob* job, int rank);
int mpKilledBy(const mpJob* job, int rank, int sig);
#endif
