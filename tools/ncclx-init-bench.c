/* ncclx-init-bench: how long does a communicator take to become usable, and what does init
 * cost each rank (bootstrap messages, bytes, connections, memory)? Eager and lazy connection
 * setup are run alternately in one invocation so that machine noise hits both alike.
 *
 *   ncclx-init-bench [-n 8,32,128] [-m lazy,eager] [-r REPS] [-j FILE.json] [-t TIMEOUT_S]
 *       forks N ranks on this host per run (the parent makes the unique id)
 *   ncclx-init-bench --ids K|sqrt[,K|sqrt] ...
 *       multi-root init (ncclxCommInitRankScalable) with K unique ids (at most n; sqrt:
 *       ceil(sqrt(n))), made by the parent before forking; the default, 1, is ncclxCommInitRankConfig;
 *       two values (--ids 1,sqrt) alternate within every repetition, like the modes
 *   ncclx-init-bench --hosts H [-n 128] [--ids K] ...
 *       runs each job through tools/ncclx-hosts (H emulated hosts, N/H ranks each); with
 *       --ids the ranks get NCCLX_COMM_IDS, id g served by its root rank's emulated host
 *   --phases  per run, when the last rank to start, the last ready and rank 0 reached each
 *       init phase (bootstrap, root contact, partners/table, all-gather, usable)
 *   --hold MS  ranks idle MS ms between init and their first allreduce (see usage())
 *   ncclx-init-bench --rank
 *       one rank under a launcher (NCCLX_RANK, NCCLX_NRANKS, NCCLX_COMM_ID); prints one
 *       "INITBENCH ..." line; lazy or eager from [core] lazy_connect / NCCLX_CORE_LAZY_CONNECT
 *
 * Times run from the moment the last rank entered init (CLOCK_MONOTONIC is system wide, also
 * across network namespaces) to the last rank's return: "init" = usable communicator,
 * "first allreduce" = one 4-byte allreduce completed after init. Launchers start ranks over
 * a spread of time (ncclx-hosts: seconds at 128 ranks); that spread is printed as "skew"
 * and not counted, since no init protocol can finish before its last rank starts. Every rank's
 * own start-up inside init (config, transports, listeners) is counted. The JSON file feeds
 * tools/ncclx-init-model (per-rank CPU time against messages and connections). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncclx.h"

/* Exported by the core for this tool, not part of ncclx.h (see core/src/api/comm_lifecycle.c). */
int ncclxInternalInitCounters(ncclxComm_t comm, int64_t* out, int max);

enum { C_MSGS_SENT, C_MSGS_RECV, C_BYTES_SENT, C_BYTES_RECV, C_CONNS_OPENED, C_CONNS_ACCEPTED, C_RDV_MSGS,
       C_RDV_BYTES, C_RDV_CONNS, C_PEER_CONNS, C_RDV_US, C_GATHER_US,
       /* phase timestamps, CLOCK_MONOTONIC us: bootstrap entered, root contacted (a root: its last
        * member's hello), partner list received (a root: replies sent), address all-gather done */
       C_T_BOOTSTRAP, C_T_CONTACT, C_T_REPLY, C_T_READY, NCOUNTERS };

#define MAX_RANKS 1024
#define MAX_SIZES 16

struct rankResult {
  int ok;
  double tStart, tInit, tAr; /* monotonic seconds */
  double cpuInit;            /* user+system CPU seconds spent in init */
  int64_t c[NCOUNTERS];      /* after init */
  int64_t peerConnsAfterAr;
  long rssKB;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpuSec(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)ru.ru_stime.tv_usec;
}

static long rssKB(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
    fclose(f);
  }
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* One rank: init (the id is NULL under a launcher: ncclxCommInitFromEnv), one allreduce. */
static void runRank(const ncclxUniqueId* id, int nIds, int rank, int nranks, int lazy, int timeoutSec,
                    struct rankResult* out) {
  memset(out, 0, sizeof(*out));
  ncclxComm_t comm = NULL;
  double cpu0 = cpuSec();
  out->tStart = now();
  ncclxResult_t res;
  if (id) {
    ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
    cfg.lazyConnect = lazy;
    cfg.timeoutSec = timeoutSec;
    res = nIds == 1 ? ncclxCommInitRankConfig(&comm, nranks, *id, rank, &cfg)
                    : ncclxCommInitRankScalable(&comm, nranks, rank, nIds, id, &cfg);
  } else {
    res = ncclxCommInitFromEnv(&comm);
  }
  out->tInit = now();
  /* --hold: idle before the first allreduce, so ranks that finish init early do not take the
   * CPU from those still in init (128 processes on 2 cores); the allreduce time excludes it. */
  const char* hold = getenv("NCCLX_INITBENCH_HOLD_MS");
  double holdSec = hold ? atof(hold) * 1e-3 : 0;
  if (holdSec > 0) usleep((useconds_t)(holdSec * 1e6));
  out->cpuInit = cpuSec() - cpu0;
  if (res != ncclxSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclxGetLastError(NULL));
    return;
  }
  if (ncclxInternalInitCounters(comm, out->c, NCOUNTERS) != NCOUNTERS) fprintf(stderr, "rank %d: no counters\n", rank);
  float x = 1.0f, y = 0.0f;
  res = ncclxAllReduce(&x, &y, 1, ncclxFloat32, ncclxSum, comm, NULL);
  out->tAr = now() - holdSec;
  if (res != ncclxSuccess || y != (float)nranks) {
    fprintf(stderr, "rank %d: allreduce %s (got %g, want %d): %s\n", rank, res == ncclxSuccess ? "wrong" : "failed",
            (double)y, nranks, ncclxGetLastError(comm));
    ncclxCommAbort(comm);
    return;
  }
  int64_t after[NCOUNTERS];
  if (ncclxInternalInitCounters(comm, after, NCOUNTERS) == NCOUNTERS) out->peerConnsAfterAr = after[C_PEER_CONNS];
  out->rssKB = rssKB();
  /* Nobody may leave before everyone measured: a rank that exits early looks like a fault. */
  res = ncclxAllReduce(&x, &y, 1, ncclxFloat32, ncclxSum, comm, NULL);
  ncclxCommDestroy(comm);
  out->ok = res == ncclxSuccess;
}

/* --ids with --hosts: the driver passes NCCLX_INITBENCH_ID_HOSTS="h0,h1,..." (the emulated
 * host of each id's root rank) and each rank turns it into NCCLX_COMM_IDS for
 * ncclxCommInitFromEnv. Host h's address follows ncclx-hosts' documented scheme, the
 * address of host 0 (in NCCLX_COMM_ID) with the last byte h + 1; id g listens on port
 * INITBENCH_ID_PORT + g, so several roots may share a host. */
#define INITBENCH_ID_PORT 29500
static int idsFromHosts(void) {
  const char* hosts = getenv("NCCLX_INITBENCH_ID_HOSTS");
  if (!hosts || !*hosts) return 0;
  const char* id0 = getenv("NCCLX_COMM_ID");
  unsigned a, b, c, d, port;
  if (!id0 || sscanf(id0, "%u.%u.%u.%u:%u", &a, &b, &c, &d, &port) != 5 || d != 1) {
    fprintf(stderr, "NCCLX_INITBENCH_ID_HOSTS needs NCCLX_COMM_ID=A.B.C.1:PORT (host 0 of ncclx-hosts), got %s\n",
            id0 ? id0 : "(unset)");
    return -1;
  }
  static char list[MAX_RANKS * 24];
  size_t len = 0;
  int g = 0;
  for (const char* s = hosts; *s && len + 32 < sizeof(list); g++) {
    char* end;
    long h = strtol(s, &end, 10);
    if (end == s || h < 0 || h > 253) {
      fprintf(stderr, "NCCLX_INITBENCH_ID_HOSTS=%s: entry %d is not a host index 0..253\n", hosts, g);
      return -1;
    }
    len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%u.%u.%u.%ld:%d", g ? "," : "", a, b, c, h + 1,
                            INITBENCH_ID_PORT + g);
    s = *end == ',' ? end + 1 : end;
  }
  return setenv("NCCLX_COMM_IDS", list, 1) == 0 ? 0 : -1;
}

static int rankMain(void) {
  const char* n = getenv("NCCLX_NRANKS");
  const char* r = getenv("NCCLX_RANK");
  struct rankResult rr;
  if (idsFromHosts() != 0) return 1;
  runRank(NULL, 1, r ? atoi(r) : 0, n ? atoi(n) : 1, -1, 0, &rr);
  printf("INITBENCH ok=%d start=%.6f init=%.6f ar=%.6f cpu=%.6f rss=%ld connsAr=%lld c=", rr.ok, rr.tStart,
         rr.tInit, rr.tAr, rr.cpuInit, rr.rssKB, (long long)rr.peerConnsAfterAr);
  for (int i = 0; i < NCOUNTERS; i++) printf("%s%lld", i ? "," : "", (long long)rr.c[i]);
  printf("\n");
  return rr.ok ? 0 : 1;
}

/* ---------------- driver ---------------- */

struct options {
  int sizes[MAX_SIZES], nsizes;
  int modes[2], nmodes; /* 1 = lazy, 0 = eager */
  int reps, timeoutSec, hosts, check, phases;
  int ids[2], nids; /* unique ids per job: 1 = single root, -1 = ceil(sqrt(n)); two alternate */
  const char* json;
  const char* self;
};

struct summary {
  int n, nIds, lazy, rep, ok;
  double initMax, arMax, cpuMean, skew;
  int64_t peerConnsInit, peerConnsAr; /* connections (each counted once, not per end) */
  int64_t busiestMsgs, busiestBytes, busiestNonRootMsgs, busiestConns;
  long rssMaxKB, rssMeanKB;
};

/* Ids per job for --ids K|sqrt, never more than n. */
static int idsFor(int want, int n) {
  int k = 1;
  if (want < 0)
    while (k * k < n) k++;
  else
    k = want;
  return k < n ? k : n;
}

/* Fork mode: all ranks are children of this process, results in shared memory. The parent
 * makes every id, so the root of each inherits the id's listener. */
static int runForked(int n, int nIds, int lazy, int timeoutSec, struct rankResult* res) {
  ncclxUniqueId ids[MAX_RANKS];
  for (int i = 0; i < nIds; i++)
    if (ncclxGetUniqueId(&ids[i]) != ncclxSuccess) {
      fprintf(stderr, "ncclxGetUniqueId failed: %s\n", ncclxGetLastError(NULL));
      return -1;
    }
  memset(res, 0, sizeof(*res) * (size_t)n);
  pid_t* pids = calloc((size_t)n, sizeof(pid_t));
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p == 0) {
      runRank(ids, nIds, r, n, lazy, timeoutSec, &res[r]);
      _exit(res[r].ok ? 0 : 1);
    }
    pids[r] = p;
  }
  double deadline = now() + timeoutSec + 30;
  int left = n, bad = 0;
  while (left > 0 && now() < deadline) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      left--;
      bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    } else {
      usleep(2000);
    }
  }
  for (int r = 0; r < n && left > 0; r++) kill(pids[r], SIGKILL);
  while (left > 0 && waitpid(-1, NULL, 0) > 0) left--;
  free(pids);
  return bad + left;
}

/* Hosts mode: one job through ncclx-hosts, results parsed from the ranks' lines. */
static int runHosts(const struct options* o, int n, int nIds, int lazy, struct rankResult* res) {
  char launcher[4096], cmd[16384], idHosts[MAX_RANKS * 5] = "";
  /* ncclx-hosts sits next to this source file (CMake compiles it by absolute path);
   * NCCLX_HOSTS overrides. */
  const char* env = getenv("NCCLX_HOSTS");
  if (env) {
    snprintf(launcher, sizeof(launcher), "%s", env);
  } else {
    snprintf(launcher, sizeof(launcher), "%s", __FILE__);
    char* slash = strrchr(launcher, '/');
    snprintf(slash ? slash + 1 : launcher, sizeof(launcher) - (size_t)(slash ? slash + 1 - launcher : 0), "%s",
             "ncclx-hosts");
  }
  if (n % o->hosts) {
    fprintf(stderr, "-n %d is not a multiple of --hosts %d\n", n, o->hosts);
    return -1;
  }
  /* Multi-root: id g is served by rank ceil(g * n / nIds), on that rank's emulated host. */
  size_t len = 0;
  for (int g = 0; nIds > 1 && g < nIds; g++) {
    int root = (int)(((int64_t)g * n + nIds - 1) / nIds);
    len += (size_t)snprintf(idHosts + len, sizeof(idHosts) - len, "%s%d", g ? "," : "", root / (n / o->hosts));
  }
  snprintf(cmd, sizeof(cmd),
           "NCCLX_INITBENCH_ID_HOSTS=%s NCCLX_CORE_LAZY_CONNECT=%d NCCLX_CORE_TIMEOUT_S=%d %s --hosts %d "
           "--ranks-per-host %d --timeout %d -- %s --rank",
           idHosts, lazy, o->timeoutSec, launcher, o->hosts, n / o->hosts, o->timeoutSec + 30, o->self);
  memset(res, 0, sizeof(*res) * (size_t)n);
  FILE* p = popen(cmd, "r");
  if (!p) return -1;
  char line[1024];
  while (fgets(line, sizeof(line), p)) {
    int rank;
    char* s = strstr(line, "INITBENCH");
    if (!s || sscanf(line, "[r%d]", &rank) != 1 || rank < 0 || rank >= n) continue;
    struct rankResult* rr = &res[rank];
    long long ca;
    if (sscanf(s, "INITBENCH ok=%d start=%lf init=%lf ar=%lf cpu=%lf rss=%ld connsAr=%lld", &rr->ok, &rr->tStart,
               &rr->tInit, &rr->tAr, &rr->cpuInit, &rr->rssKB, &ca) != 7)
      continue;
    rr->peerConnsAfterAr = ca;
    char* c = strstr(s, "c=");
    for (int i = 0; c && i < NCOUNTERS; i++) {
      c += i ? 1 : 2;
      rr->c[i] = strtoll(c, &c, 10);
    }
  }
  int st = pclose(p);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 77) return -77; /* ncclx-hosts: no namespaces here */
  int bad = 0;
  for (int r = 0; r < n; r++) bad += !res[r].ok;
  if (st != 0 && bad == 0) bad = 1;
  return bad;
}

static void summarize(const struct rankResult* res, int n, struct summary* s) {
  double first = 1e300, t0 = 0, ti = 0, ta = 0, cpu = 0;
  int64_t pi = 0, pa = 0;
  long rssSum = 0;
  for (int r = 0; r < n; r++) {
    const struct rankResult* x = &res[r];
    if (x->tStart < first) first = x->tStart;
    if (x->tStart > t0) t0 = x->tStart;
    if (x->tInit > ti) ti = x->tInit;
    if (x->tAr > ta) ta = x->tAr;
    cpu += x->cpuInit;
    pi += x->c[C_PEER_CONNS];
    pa += x->peerConnsAfterAr;
    rssSum += x->rssKB;
    if (x->rssKB > s->rssMaxKB) s->rssMaxKB = x->rssKB;
    int64_t msgs = x->c[C_MSGS_SENT] + x->c[C_MSGS_RECV] + x->c[C_RDV_MSGS];
    int64_t bytes = x->c[C_BYTES_SENT] + x->c[C_BYTES_RECV] + x->c[C_RDV_BYTES];
    int64_t conns = x->c[C_CONNS_OPENED] + x->c[C_CONNS_ACCEPTED] + x->c[C_RDV_CONNS];
    if (msgs > s->busiestMsgs) s->busiestMsgs = msgs;
    if (bytes > s->busiestBytes) s->busiestBytes = bytes;
    if (conns > s->busiestConns) s->busiestConns = conns;
    int isRoot = r == 0 || (r * (int64_t)s->nIds) / n != ((r - 1) * (int64_t)s->nIds) / n; /* first of a group */
    if (!isRoot && msgs > s->busiestNonRootMsgs) s->busiestNonRootMsgs = msgs;
  }
  s->skew = t0 - first;
  s->initMax = ti - t0;
  s->arMax = ta - t0;
  s->cpuMean = cpu / n;
  s->peerConnsInit = pi / 2;
  s->peerConnsAr = pa / 2;
  s->rssMeanKB = rssSum / n;
}

/* Where the time goes: phase ends of a few ranks in ms after t0 (the last rank's start):
 * bootstrap entered (before it: config, transports, listeners), root contacted (a root: its
 * last member's hello arrived), partners received (a root: replies sent), all-gather done,
 * communicator usable. The ranks shown: the last to start, the last to be ready, rank 0,
 * and the median over all ranks of each phase end. */
static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void phaseEnds(const struct rankResult* x, double t0, double* e) {
  e[0] = (x->tStart - t0) * 1e3;
  for (int k = 0; k < 4; k++) e[1 + k] = (double)x->c[C_T_BOOTSTRAP + k] * 1e-3 - t0 * 1e3;
  e[5] = (x->tInit - t0) * 1e3;
}

static void printPhases(const struct rankResult* res, int n) {
  double t0 = 0, tLast = 0;
  int lastStart = 0, lastReady = 0;
  for (int r = 0; r < n; r++) {
    if (res[r].tStart > t0) t0 = res[r].tStart, lastStart = r;
    if (res[r].tInit > tLast) tLast = res[r].tInit, lastReady = r;
  }
  const int who[3] = {lastStart, lastReady, 0};
  const char* what[3] = {"last to start", "last ready", "rank 0"};
  printf("#   phase ends, ms after the last start: start bootstrap contact partners gathered usable\n");
  for (int i = 0; i < 3; i++) {
    double e[6];
    phaseEnds(&res[who[i]], t0, e);
    printf("#   %-13s r%-4d %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", what[i], who[i], e[0], e[1], e[2], e[3], e[4],
           e[5]);
  }
  double* col = malloc(sizeof(double) * (size_t)n);
  if (!col) return;
  double med[6];
  for (int k = 0; k < 6; k++) {
    for (int r = 0; r < n; r++) {
      double e[6];
      phaseEnds(&res[r], t0, e);
      col[r] = e[k];
    }
    qsort(col, (size_t)n, sizeof(double), cmpDouble);
    med[k] = col[n / 2];
  }
  free(col);
  printf("#   %-13s       %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", "median", med[0], med[1], med[2], med[3], med[4],
         med[5]);
}

/* --check: the scaling claims of docs/init.md for one run. Returns the number of violations. */
static int checkRun(const struct summary* s) {
  int logn = 0, bad = 0;
  while ((1L << logn) < s->n) logn++;
  int64_t wantConns = s->lazy ? 0 : (int64_t)s->n * (s->n - 1);
  if (s->peerConnsInit != wantConns) {
    printf("CHECK FAILED: %s init at %d ranks opened %lld connections, expected %lld\n", s->lazy ? "lazy" : "eager",
           s->n, (long long)s->peerConnsInit, (long long)wantConns);
    bad++;
  }
  if (s->busiestNonRootMsgs > 8 * logn + 8) {
    printf("CHECK FAILED: a non-root rank handled %lld bootstrap messages at %d ranks (bound %d)\n",
           (long long)s->busiestNonRootMsgs, s->n, 8 * logn + 8);
    bad++;
  }
  /* A root: its group's hellos and replies, 4 per round among the roots, and the rest. */
  int logIds = 0;
  while ((1L << logIds) < s->nIds) logIds++;
  int64_t rootBound = 2 * ((s->n + s->nIds - 1) / s->nIds) + 4 * logIds + 8 * logn + 8;
  if (s->busiestMsgs > rootBound) {
    printf("CHECK FAILED: the busiest rank handled %lld bootstrap messages at %d ranks with %d ids (bound %lld)\n",
           (long long)s->busiestMsgs, s->n, s->nIds, (long long)rootBound);
    bad++;
  }
  return bad;
}

static int parseList(const char* s, int* out, int max) {
  int k = 0;
  while (*s && k < max) {
    char* end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > MAX_RANKS) return -1;
    out[k++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return k;
}

static void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [-n N[,N...]] [-m lazy,eager] [-r reps] [-j out.json] [-t timeout_s] [--hosts H] [--ids K|sqrt] "
          "[--check] [--phases] [--hold MS]\n"
          "  --hold MS: every rank idles MS ms between init and its first allreduce (not counted in\n"
          "           1st_ar_s), so ranks done early leave the CPU to those still in init: init alone,\n"
          "           as with one core per rank. Default 0: ranks go straight to work, as a job would\n"
          "  --phases: after each run, when the last rank to start, the last to be ready and rank 0\n"
          "           reached each init phase (ms after the last start), and the median rank\n"
          "  --check: fail unless lazy init opens no connection, eager opens all n(n-1), and every\n"
          "           rank but the roots handles at most 8*ceil(log2 n)+8 bootstrap messages, and the busiest\n"
          "           at most 2*ceil(n/ids) + 4*ceil(log2 ids) + 8*ceil(log2 n) + 8\n"
          "  --ids K|sqrt[,K|sqrt]: multi-root init with K unique ids (ncclxCommInitRankScalable, or with\n"
          "           --hosts NCCLX_COMM_IDS: id g's root runs on its own emulated host); two values\n"
          "           alternate in every repetition, e.g. --ids 1,sqrt or --ids 1,8\n"
          "       %s --rank   (one rank under a launcher)\n",
          argv0, argv0);
}

int main(int argc, char** argv) {
  if (argc > 1 && !strcmp(argv[1], "--rank")) return rankMain();
  struct options o = {{8, 32}, 2, {1, 0}, 2, 1, 120, 0, 0, 0, {1, 1}, 1, NULL, argv[0]};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-n") && v) {
      o.nsizes = parseList(v, o.sizes, MAX_SIZES);
      if (o.nsizes <= 0) {
        fprintf(stderr, "-n %s: expected rank counts 1..%d separated by commas\n", v, MAX_RANKS);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "-m") && v) {
      o.nmodes = 0;
      if (strstr(v, "lazy")) o.modes[o.nmodes++] = 1;
      if (strstr(v, "eager")) o.modes[o.nmodes++] = 0;
      if (!o.nmodes) {
        fprintf(stderr, "-m %s: expected lazy, eager or lazy,eager\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "-r") && v) {
      o.reps = atoi(v);
      i++;
    } else if (!strcmp(a, "-t") && v) {
      o.timeoutSec = atoi(v);
      i++;
    } else if (!strcmp(a, "-j") && v) {
      o.json = v;
      i++;
    } else if (!strcmp(a, "--ids") && v) {
      char buf[64];
      snprintf(buf, sizeof(buf), "%s", v);
      o.nids = 0;
      for (char* t = strtok(buf, ","); t && o.nids < 2; t = strtok(NULL, ","))
        o.ids[o.nids++] = !strcmp(t, "sqrt") ? -1 : atoi(t);
      if (o.nids == 0 || o.ids[0] == 0 || o.ids[o.nids - 1] == 0 || o.ids[0] > MAX_RANKS ||
          o.ids[o.nids - 1] > MAX_RANKS) {
        fprintf(stderr, "--ids %s: expected one or two (alternated) of: a count 1..%d, sqrt\n", v, MAX_RANKS);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--check")) {
      o.check = 1;
    } else if (!strcmp(a, "--phases")) {
      o.phases = 1;
    } else if (!strcmp(a, "--hold") && v) {
      if (atoi(v) < 0 || setenv("NCCLX_INITBENCH_HOLD_MS", v, 1) != 0) {
        fprintf(stderr, "--hold %s: expected milliseconds >= 0\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--hosts") && v) {
      o.hosts = atoi(v);
      i++;
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  if (o.reps < 1 || o.timeoutSec < 1 || o.hosts < 0) {
    usage(argv[0]);
    return 2;
  }
  int maxN = 0;
  for (int i = 0; i < o.nsizes; i++) maxN = o.sizes[i] > maxN ? o.sizes[i] : maxN;
  struct rankResult* res =
      mmap(NULL, sizeof(*res) * (size_t)maxN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (res == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  FILE* js = o.json ? fopen(o.json, "w") : NULL;
  if (o.json && !js) {
    fprintf(stderr, "cannot write %s: %s\n", o.json, strerror(errno));
    return 1;
  }
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (js)
    fprintf(js, "{\"cores\": %ld, \"hosts\": %d, \"hold_ms\": %s, \"load_before\": %.2f, \"runs\": [\n", cores,
            o.hosts, getenv("NCCLX_INITBENCH_HOLD_MS") ? getenv("NCCLX_INITBENCH_HOLD_MS") : "0", load[0]);
  printf("# ncclx-init-bench: %ld cores, load %.2f %.2f %.2f, %s%s\n", cores, load[0], load[1], load[2],
         o.hosts ? "emulated hosts (ncclx-hosts)" : "forked ranks on one host",
         getenv("NCCLX_INITBENCH_HOLD_MS") ? ", ranks hold before the first allreduce (--hold)" : "");
  printf("%6s %4s %5s %3s %7s %9s %9s %8s %8s %8s %9s %9s %8s %8s %8s\n", "ranks", "ids", "mode", "rep", "skew_s", "init_s",
         "1st_ar_s", "conns@i", "conns@ar", "bs_msgs", "bs_bytes", "nonroot", "bs_conn", "cpu_ms", "rss_MB");
  int failures = 0, firstRun = 1;
  for (int si = 0; si < o.nsizes; si++) {
    int n = o.sizes[si];
    for (int rep = 0; rep < o.reps; rep++) {
      for (int run = 0; run < o.nmodes * o.nids; run++) {
        int mi = run % o.nmodes, ii = run / o.nmodes;
        int lazy = o.modes[(mi + rep) % o.nmodes]; /* alternate which mode goes first */
        int nIds = idsFor(o.ids[(ii + rep) % o.nids], n);
        int bad = o.hosts ? runHosts(&o, n, nIds, lazy, res) : runForked(n, nIds, lazy, o.timeoutSec, res);
        if (bad == -77) {
          printf("skipped: ncclx-hosts cannot make network namespaces here (needs root and ip netns)\n");
          return 77;
        }
        struct summary s;
        memset(&s, 0, sizeof(s));
        s.n = n;
        s.nIds = nIds;
        s.lazy = lazy;
        s.rep = rep;
        s.ok = bad == 0;
        if (bad != 0) {
          failures++;
          printf("%6d %4d %5s %3d FAILED (%d ranks)\n", n, nIds, lazy ? "lazy" : "eager", rep, bad);
          continue;
        }
        summarize(res, n, &s);
        printf("%6d %4d %5s %3d %7.3f %9.3f %9.3f %8lld %8lld %8lld %9lld %9lld %8lld %8.1f %8.1f\n", n, nIds,
               lazy ? "lazy" : "eager", rep, s.skew, s.initMax, s.arMax, (long long)s.peerConnsInit, (long long)s.peerConnsAr, (long long)s.busiestMsgs,
               (long long)s.busiestBytes, (long long)s.busiestNonRootMsgs, (long long)s.busiestConns,
               s.cpuMean * 1e3, s.rssMaxKB / 1024.0);
        if (o.phases) printPhases(res, n);
        fflush(stdout);
        if (o.check) failures += checkRun(&s);
        if (js) {
          fprintf(js,
                  "%s {\"n\": %d, \"ids\": %d, \"mode\": \"%s\", \"rep\": %d, \"skew_s\": %.6f, \"init_s\": %.6f, \"first_allreduce_s\": %.6f, "
                  "\"peer_conns_init\": %lld, \"peer_conns_after_allreduce\": %lld, \"busiest_msgs\": %lld, "
                  "\"busiest_bytes\": %lld, \"busiest_nonroot_msgs\": %lld, \"busiest_conns\": %lld, "
                  "\"rss_max_kb\": %ld, \"rss_mean_kb\": %ld,\n   \"ranks\": [",
                  firstRun ? "" : ",", n, nIds, lazy ? "lazy" : "eager", rep, s.skew, s.initMax, s.arMax,
                  (long long)s.peerConnsInit, (long long)s.peerConnsAr, (long long)s.busiestMsgs,
                  (long long)s.busiestBytes, (long long)s.busiestNonRootMsgs, (long long)s.busiestConns,
                  s.rssMaxKB, s.rssMeanKB);
          double lastStart = 0;
          for (int r = 0; r < n; r++) lastStart = res[r].tStart > lastStart ? res[r].tStart : lastStart;
          for (int r = 0; r < n; r++) {
            const struct rankResult* x = &res[r];
            double e[6];
            phaseEnds(x, lastStart, e);
            fprintf(js, "%s[%.6f, %lld, %lld, %lld, %lld, %lld, %.2f, %.2f, %.2f, %.2f, %.2f, %.2f]", r ? ", " : "",
                    x->cpuInit, (long long)(x->c[C_MSGS_SENT] + x->c[C_MSGS_RECV]), (long long)x->c[C_RDV_MSGS],
                    (long long)(x->c[C_CONNS_OPENED] + x->c[C_CONNS_ACCEPTED] + x->c[C_RDV_CONNS]),
                    (long long)x->c[C_PEER_CONNS], (long long)(x->c[C_RDV_US] + x->c[C_GATHER_US]), e[0], e[1], e[2],
                    e[3], e[4], e[5]);
          }
          fprintf(js, "]}\n");
          firstRun = 0;
        }
      }
    }
  }
  if (js) {
    getloadavg(load, 3);
    fprintf(js, "], \"rank_fields\": [\"cpu_init_s\", \"bs_msgs\", \"rdv_msgs\", \"bs_conns\", \"peer_conn_ends\", "
                "\"bootstrap_us\", \"ms_after_last_start: start\", \"bootstrap\", \"contact\", \"partners\", "
                "\"gathered\", \"usable\"], \"load_after\": %.2f}\n", load[0]);
    fclose(js);
  }
  return failures ? 1 : 0;
}
