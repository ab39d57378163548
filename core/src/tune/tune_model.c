/* The default tuner's cost model: constants per transport, the calibration file, and the
 * alpha-beta-gamma estimate of every algorithm. */
#include "tune/tune_model.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/config.h"
#include "util/debug.h"

/* Built-in constants: `ncclx-perf --calibrate -np 2 -n 200` on the development machine
 * (2 cores, Debian 12, load average ~2.7; 2026-11-22 07:00 UTC; shm, then NCCLX_CORE_SHM=false
 * over loopback TCP; see docs/tuning.md). A cluster should calibrate its own and point
 * [tuner] model at the file. */
#define BUILTIN_SHM_ALPHA_US 0.91
#define BUILTIN_SHM_BETA_US_PER_BYTE 8.1e-5  /* ~12.3 GB/s per pair (single-copy) */
#define BUILTIN_NET_ALPHA_US 13.4
#define BUILTIN_NET_BETA_US_PER_BYTE 2.7e-4  /* loopback TCP, ~3.6 GB/s */
#define BUILTIN_GAMMA_US_PER_BYTE 3.3e-5     /* the core's float sum, ~30 GB/s in cache */

void tuneModelDefaults(TuneModel* m) {
  memset(m, 0, sizeof(*m));
  m->link[NCCLX_TP_SHM] = (TuneLink){BUILTIN_SHM_ALPHA_US, BUILTIN_SHM_BETA_US_PER_BYTE};
  m->link[NCCLX_TP_NET] = (TuneLink){BUILTIN_NET_ALPHA_US, BUILTIN_NET_BETA_US_PER_BYTE};
  m->gammaUsPerByte = BUILTIN_GAMMA_US_PER_BYTE;
  snprintf(m->source, sizeof(m->source), "built-in");
}

/* ---------------- the calibration file ---------------- */

typedef struct {
  const char* key;
  double max; /* sanity bound: larger is certainly a unit mistake */
} ModelKey;

/* Index order is the order of modelSlot(). */
static const ModelKey modelKeys[] = {
    {"shm.alpha_us", 1e6},     {"shm.beta_us_per_byte", 1.0}, {"net.alpha_us", 1e6},
    {"net.beta_us_per_byte", 1.0}, {"gamma_us_per_byte", 1.0},
};
#define NUM_MODEL_KEYS (sizeof(modelKeys) / sizeof(modelKeys[0]))

static double* modelSlot(TuneModel* m, size_t i) {
  switch (i) {
    case 0: return &m->link[NCCLX_TP_SHM].alphaUs;
    case 1: return &m->link[NCCLX_TP_SHM].betaUsPerByte;
    case 2: return &m->link[NCCLX_TP_NET].alphaUs;
    case 3: return &m->link[NCCLX_TP_NET].betaUsPerByte;
    default: return &m->gammaUsPerByte;
  }
}

static char* trim(char* s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

/* One "key = value" line into m; 0, or -1 after a WARN naming path:line. */
static int parseLine(char* body, const char* path, long lineNo, TuneModel* m, int* seen) {
  char* eq = strchr(body, '=');
  if (!eq) {
    WARN("tuner model: %s:%ld: '%.100s' is not 'key = value'", path, lineNo, body);
    return -1;
  }
  *eq = '\0';
  char* key = trim(body);
  char* value = trim(eq + 1);
  size_t k = 0;
  while (k < NUM_MODEL_KEYS && strcasecmp(key, modelKeys[k].key) != 0) k++;
  if (k == NUM_MODEL_KEYS) {
    WARN("tuner model: %s:%ld: unknown key '%.100s' (known: shm.alpha_us, shm.beta_us_per_byte, "
         "net.alpha_us, net.beta_us_per_byte, gamma_us_per_byte)", path, lineNo, key);
    return -1;
  }
  if (seen[k]) {
    WARN("tuner model: %s:%ld: '%s' is set twice (first on line %d)", path, lineNo,
         modelKeys[k].key, seen[k]);
    return -1;
  }
  errno = 0;
  char* end = NULL;
  double v = strtod(value, &end);
  if (!*value || errno || *end != '\0' || !isfinite(v) || v < 0 || v > modelKeys[k].max) {
    WARN("tuner model: %s:%ld: %s = '%.100s' is not a number in [0, %g]", path, lineNo,
         modelKeys[k].key, value, modelKeys[k].max);
    return -1;
  }
  seen[k] = (int)lineNo;
  *modelSlot(m, k) = v;
  return 0;
}

int tuneModelRead(const char* path, TuneModel* m) {
  tuneModelDefaults(m);
  FILE* f = fopen(path, "r");
  if (!f) {
    WARN("tuner model: cannot open '%s': %s; using the built-in constants", path, strerror(errno));
    return -1;
  }
  TuneModel read = *m;
  int seen[NUM_MODEL_KEYS] = {0}, errors = 0, keys = 0;
  char* line = NULL;
  size_t size = 0;
  for (long lineNo = 1; getline(&line, &size, f) >= 0; lineNo++) {
    char* hash = strpbrk(line, "#;");
    if (hash) *hash = '\0';
    char* body = trim(line);
    if (!*body) continue;
    if (lineNo > 1000000) break; /* not a calibration file: the errors below say so */
    if (parseLine(body, path, lineNo, &read, seen) != 0) errors++;
    else keys++;
  }
  if (ferror(f)) {
    WARN("tuner model: %s: read error: %s", path, strerror(errno));
    errors++;
  }
  free(line);
  fclose(f);
  if (errors || keys == 0) {
    WARN("tuner model: %s: %s; using the built-in constants", path,
         errors ? "invalid (see above)" : "no constants in the file");
    return -1;
  }
  *m = read;
  snprintf(m->source, sizeof(m->source), "%s", path);
  return 0;
}

/* ---------------- the process model ---------------- */

static pthread_mutex_t modelLock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int modelLoaded; /* set after processModel is complete: calls read it lock-free */
static TuneModel processModel;
static atomic_uint modelGeneration; /* bumped by tuneModelReset */

unsigned tuneModelGeneration(void) { return atomic_load_explicit(&modelGeneration, memory_order_relaxed); }

const TuneModel* tuneModelGet(void) {
  if (atomic_load_explicit(&modelLoaded, memory_order_acquire)) return &processModel;
  pthread_mutex_lock(&modelLock);
  if (!atomic_load(&modelLoaded)) {
    const char* path = ncclxConfigGet("tuner", "model");
    while (path && isspace((unsigned char)*path)) path++;
    if (path && *path) tuneModelRead(path, &processModel);
    else tuneModelDefaults(&processModel);
    const TuneModel* m = &processModel;
    INFO(NCCLX_LOG_TUNING | NCCLX_LOG_INIT,
         "tuner model (%s): shm alpha %.3g us beta %.3g us/B, net alpha %.3g us beta %.3g us/B, "
         "gamma %.3g us/B", m->source, m->link[NCCLX_TP_SHM].alphaUs,
         m->link[NCCLX_TP_SHM].betaUsPerByte, m->link[NCCLX_TP_NET].alphaUs,
         m->link[NCCLX_TP_NET].betaUsPerByte, m->gammaUsPerByte);
    atomic_store_explicit(&modelLoaded, 1, memory_order_release);
  }
  pthread_mutex_unlock(&modelLock);
  return &processModel;
}

void tuneModelReset(void) {
  pthread_mutex_lock(&modelLock);
  atomic_store(&modelLoaded, 0);
  atomic_fetch_add(&modelGeneration, 1);
  pthread_mutex_unlock(&modelLock);
}

int tuneModelTransport(const struct ncclxComm* comm) {
  /* A rank whose own shm setup failed is still costed as shm: rare, and only a speed matter. */
  return comm->nhosts == 1 && comm->tp[NCCLX_TP_SHM].net ? NCCLX_TP_SHM : NCCLX_TP_NET;
}

/* ---------------- the estimates ---------------- */

static double log2ceil(int p) {
  int l = 0;
  while ((1 << l) < p) l++;
  return (double)l;
}

/* Ring and Rabenseifner all-reduce at 2 ranks over shared memory, each rank on its own CPU: in
 * their allgather step the peer copies the half this rank has just reduced, so the next
 * call's reduction first takes those lines back from the peer's cache. While the buffers stay
 * in cache that costs about one more reduction of the vector (sharedLines). 2 ranks,
 * alternating runs (us, recursive doubling / Rabenseifner / ring): 64 KiB 3.4 / 8.3 / 8.5,
 * 128 KiB 6.2 / 16.0 / 15.8, 256 KiB 13.1 / 17.5 / 17.1, 512 KiB 32.8 / 35.4 / 36.6; from
 * 1 MiB recursive doubling is behind (124 / 97 / 107). */
#define TUNE_SHARED_LINES_MAX_BYTES ((double)(512 << 10))

double tuneModelCost(const TuneModel* m, int tp, ncclxCollType_t coll, int algo, int p,
                     double S, double chunk, int sharedCpus) {
  double a = m->link[tp].alphaUs, b = m->link[tp].betaUsPerByte, g = m->gammaUsPerByte;
  double L = log2ceil(p), frac = (double)(p - 1) / p;
  int pow2 = (p & (p - 1)) == 0;
  double fold = pow2 ? 0 : 2 * (a + S * b); /* non-power-of-two pre/post step */
  /* Pipelined algorithms pay a fraction of alpha per extra chunk. */
  double pipeline = ceil(S / chunk) * a * 0.25;
  double sharedLines =
      p == 2 && tp == NCCLX_TP_SHM && !sharedCpus && S <= TUNE_SHARED_LINES_MAX_BYTES ? S * g : 0;
  /* The linear algorithms' bytes where ranks share CPUs on one host (measured there only). */
  int shmShared = tp == NCCLX_TP_SHM && sharedCpus;
  if (p == 1) return algo == NCCLX_ALGO_RING || coll == NCCLX_COLL_BARRIER ? 0.0 : 1.0;
  /* Hierarchical: collHierModelCost (coll_hier.c), called by tune.c with both links. */
  if (algo == NCCLX_ALGO_HIERARCHICAL) return -1.0;
  switch (coll) {
    case NCCLX_COLL_ALLREDUCE:
      if (algo == NCCLX_ALGO_RING)
        return 2 * (p - 1) * a + 2 * frac * S * b + frac * S * g + pipeline + sharedLines;
      if (algo == NCCLX_ALGO_RECURSIVE_DOUBLING) return L * (a + S * (b + g)) + fold;
      if (algo == NCCLX_ALGO_RABENSEIFNER) /* latencies once per segment of p chunks */
        return (2 * L + (pow2 ? 0 : 2)) * a * ceil(S / (chunk * p)) + 2 * frac * S * b + frac * S * g +
               (pow2 ? 0 : 2 * S * b) + sharedLines;
      if (algo == NCCLX_ALGO_TREE) return 2 * L * (a + S * b) + L * S * g;
      /* Linear: a linear reduce-scatter and a linear all-gather (every block at once, then
       * every result at once), its bytes priced like linear reduce-scatter's (below). Where
       * ranks share CPUs it overtakes Rabenseifner at about 100 KiB at 4 ranks and 48 KiB at
       * 8, which a fixed 10 alpha fits. 8 ranks on 2 CPUs: 128 KiB 81 us against 125, 2 MiB
       * 1573 against 2408; 4 ranks: 256 KiB 54 against 95, 8 MiB 2712 against 4429. Beyond 11
       * ranks (not measured) an alpha per peer. */
      if (algo == NCCLX_ALGO_LINEAR)
        return (p - 1 > 10 ? p - 1 : 10) * a + (2 * frac * S * b + frac * S * g) * (shmShared ? 0.6 : 1.5);
      break;
    case NCCLX_COLL_BROADCAST:
      if (algo == NCCLX_ALGO_TREE) return L * (a + S * b);
      if (algo == NCCLX_ALGO_RING) return (p - 1) * a + S * b + pipeline;
      break;
    case NCCLX_COLL_REDUCE:
      if (algo == NCCLX_ALGO_TREE) return L * (a + S * (b + g));
      break;
    case NCCLX_COLL_ALLGATHER:
      if (algo == NCCLX_ALGO_RING) return (p - 1) * a + frac * S * b;
      if (algo == NCCLX_ALGO_RECURSIVE_DOUBLING) return L * a + frac * S * b;
      if (algo == NCCLX_ALGO_BRUCK) return L * a + frac * S * b + 0.3 * S * b;
      /* Linear sends this rank's block to every rank at once, like a linear all-to-all; where
       * ranks share CPUs a receiver copies it once from a mapped buffer, with nothing waiting
       * on a ring step's partner: 4 ranks on 2 CPUs, 64 KiB-16 MiB, 0.5-0.8x the board's bulk
       * rounds, 8 ranks from 256 KiB 0.78-0.89x (16 MiB: 2508 against 3124 us, 7057 against
       * 8470). The bulk rounds win below: 8 ranks, 64 KiB 12.8 against 20.7, 128 KiB 22.9
       * against 25.4; 4 ranks even at 32 KiB (5.5). From ordinary buffers every message is a
       * process_vm_readv call, p (p - 1) of them per call on the host's CPUs: at 8 ranks the
       * bulk rounds win at every size (256 KiB: 52.7 against 96.6, Open MPI 88.3; 4 MiB 1212
       * against 1442), so the shared-CPU price applies up to 4 ranks only (4 ranks, ordinary
       * buffers: 512 KiB 60 against 65, 2 MiB 385 against 350, Open MPI 451). */
      if (algo == NCCLX_ALGO_LINEAR)
        return (p == 2 ? 1.0 : 0.75) * (p - 1) * a +
               frac * S * b * (shmShared && p <= 4 ? 0.5 : 1.1);
      break;
    case NCCLX_COLL_REDUCESCATTER:
      if (algo == NCCLX_ALGO_RING) return (p - 1) * a + frac * S * (b + g);
      if (algo == NCCLX_ALGO_PAIRWISE) return 0.5 * (p - 1) * a + frac * S * (b + g) * 1.2;
      /* Linear posts every block at once, like a linear all-to-all (one exchange at 2 ranks),
       * then reduces what arrived. Where ranks share CPUs nothing waits on a step's partner:
       * 8 ranks on 2 CPUs, 8 KiB-8 MiB, 0.54-0.84x ring's time, 4 ranks 0.53-0.70x; with a
       * CPU per rank the staging costs more than the steps (2 ranks: 1.4-1.6x ring's). */
      if (algo == NCCLX_ALGO_LINEAR)
        return (p == 2 ? 1.0 : 0.5) * (p - 1) * a + frac * S * (b + g) * (shmShared ? 0.6 : 1.5);
      break;
    case NCCLX_COLL_ALLTOALL:
    case NCCLX_COLL_ALLTOALLV:
      if (algo == NCCLX_ALGO_PAIRWISE) return (p - 1) * a + frac * S * b;
      /* Linear posts every exchange at once, so they overlap (half an alpha each), except
       * at 2 ranks: one exchange, nothing to overlap, a whole alpha like pairwise. Half an
       * alpha there ranked it below LL up to 4 KiB while LL measured 1.1-1.8x faster.
       * Its bytes cost 10% more (every peer's slots in play at once), but not when ranks
       * share CPUs: a pairwise step then moves only while both partners hold a CPU, where
       * whichever ranks run move their linear exchanges. 4 ranks on 2 CPUs, 128 KiB-8 MiB,
       * 7 alternating rounds: linear 1.05-1.2x pairwise; 8 ranks even within noise. */
      if (algo == NCCLX_ALGO_LINEAR)
        return (p == 2 ? 1.0 : 0.5) * (p - 1) * a + frac * S * b * (sharedCpus ? 1.0 : 1.1);
      if (algo == NCCLX_ALGO_BRUCK && coll == NCCLX_COLL_ALLTOALL)
        return L * a + 0.5 * L * S * b + S * b * 0.3;
      break;
    case NCCLX_COLL_BARRIER:
      return L * a;
    default:
      break;
  }
  return -1.0;
}
