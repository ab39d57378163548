/* Unique ids (a private layout inside ncclxUniqueId: magic, job secret, root address),
 * ids derived from a "host:port" string, and this host's identity. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"
#include "util/debug.h"

static uint64_t fnv1a64(uint64_t h, const char* s) {
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 0x100000001b3ull;
  }
  return h;
}
#define FNV_OFFSET 0xcbf29ce484222325ull

/* Where a job's identity comes from: set by the user, or by the launcher for every rank of
 * one job alike (and differently for two jobs). A job's id from "host:port" mixes in every
 * one present, so two jobs on one address get different secrets, and a process that lacks
 * NCCLX_JOB_SECRET cannot compute the secret of a job that has it. */
static const char* const jobIdentityVars[] = {
    "NCCLX_JOB_SECRET",   /* the user's secret: the only one a stranger cannot read elsewhere */
    "NCCLX_JOB_ID",       /* the user's name for the job */
    "SLURM_JOB_ID",       "SLURM_STEP_ID", /* srun */
    "PMIX_NAMESPACE",     /* PMIx launchers (Open MPI 4+'s mpirun, prterun) */
    "OMPI_MCA_ess_base_jobid", /* Open MPI without PMIx */
    "TORCHELASTIC_RUN_ID", /* torchrun */
};

/* Mix the identity into h; *sources: how many variables were present. */
static uint64_t mixJobIdentity(uint64_t h, int* sources) {
  *sources = 0;
  for (size_t i = 0; i < sizeof(jobIdentityVars) / sizeof(jobIdentityVars[0]); i++) {
    const char* v = getenv(jobIdentityVars[i]);
    if (!v || !v[0]) continue;
    h = fnv1a64(fnv1a64(fnv1a64(h, "\n"), jobIdentityVars[i]), v);
    (*sources)++;
  }
  return h;
}

static void warnAnonymous(const char* hostport) {
  static atomic_int warned;
  if (atomic_exchange(&warned, 1)) return;
  WARN("bootstrap: NCCLX_COMM_ID=%s with no job identity: any process that reaches this address can join "
       "the job or abort it, and two jobs started on it together are refused (not mixed) only when their "
       "ranks meet at the root within %.1f s. Set NCCLX_JOB_SECRET (the same value on every rank) or "
       "NCCLX_JOB_ID, or launch with mpirun, srun or torchrun (docs/api.md, \"Job identity\")",
       hostport, ANON_GRACE_SEC);
}

static uint64_t randomSecret(void) {
  uint64_t s = 0;
  if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s)) {
    /* No entropy source: still unique enough to tell jobs apart, not to resist attackers. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    WARN("bootstrap: getrandom failed (%s); the job secret is derived from time and pid", strerror(errno));
  }
  return s ? s : 1;
}

int bsLoadId(const ncclxUniqueId* id, struct idLayout* l) {
  memcpy(l, id->internal, sizeof(*l));
  return l->magic == ID_MAGIC && (l->root.family == AF_INET || l->root.family == AF_INET6) ? 0 : -1;
}

static void storeId(ncclxUniqueId* id, uint64_t secret, const struct wireAddr* root, uint32_t flags) {
  struct idLayout l;
  memset(&l, 0, sizeof(l));
  l.magic = ID_MAGIC;
  l.flags = flags;
  l.secret = secret;
  l.root = *root;
  memset(id, 0, sizeof(*id));
  memcpy(id->internal, &l, sizeof(l));
}

/* ---------------- unique ids ---------------- */

/* Listeners opened by bootstrapGetUniqueId, waiting for rank 0 of that id in this process. */
struct keptListener {
  struct keptListener* next;
  uint64_t secret;
  struct wireAddr addr;
  int fd;
};
static pthread_mutex_t keptLock = PTHREAD_MUTEX_INITIALIZER;
static struct keptListener* keptListeners;

int bsTakeKeptListener(const struct idLayout* id) {
  int fd = -1;
  pthread_mutex_lock(&keptLock);
  for (struct keptListener** p = &keptListeners; *p; p = &(*p)->next) {
    struct keptListener* k = *p;
    if (k->secret == id->secret && memcmp(&k->addr, &id->root, sizeof(k->addr)) == 0) {
      fd = k->fd;
      *p = k->next;
      free(k);
      break;
    }
  }
  pthread_mutex_unlock(&keptLock);
  return fd;
}

ncclxResult_t bootstrapGetUniqueId(ncclxUniqueId* id) {
  if (id == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap: unique id pointer is NULL");
  const char* env = getenv("NCCLX_COMM_ID");
  if (env && env[0]) {
    INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: unique id from NCCLX_COMM_ID=%s", env);
    return bootstrapIdFromString(env, id);
  }
  struct wireAddr want, bound;
  bsPickLocalAddress(&want);
  int fd = bsOpenListener(&want, 0, &bound);
  char name[80];
  if (fd < 0)
    return ncclxSetError(ncclxSystemError, "bootstrap: cannot listen on %s for a new unique id: %s",
                         bsAddrString(&want, name, sizeof(name)), strerror(errno));
  struct keptListener* k = calloc(1, sizeof(*k));
  if (!k) {
    close(fd);
    return ncclxSetError(ncclxSystemError, "bootstrap: out of memory creating a unique id");
  }
  k->secret = randomSecret();
  k->addr = bound;
  k->fd = fd;
  pthread_mutex_lock(&keptLock);
  k->next = keptListeners;
  keptListeners = k;
  pthread_mutex_unlock(&keptLock);
  storeId(id, k->secret, &bound, 0);
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: new unique id, root address %s", bsAddrString(&bound, name, sizeof(name)));
  return ncclxSuccess;
}

ncclxResult_t bootstrapIdFromString(const char* hostport, ncclxUniqueId* id) {
  if (hostport == NULL || id == NULL)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: NULL %s", hostport ? "unique id pointer" : "address string");
  char host[256];
  const char* portStr;
  size_t len = strlen(hostport);
  if (len == 0 || len >= sizeof(host))
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: \"%s\" is not a host:port address", hostport);
  if (hostport[0] == '[') {
    const char* close = strchr(hostport, ']');
    if (!close || close[1] != ':')
      return ncclxSetError(ncclxInvalidArgument,
                           "bootstrap: \"%s\" is not a valid address: expected [ipv6-address]:port", hostport);
    memcpy(host, hostport + 1, (size_t)(close - hostport - 1));
    host[close - hostport - 1] = '\0';
    portStr = close + 2;
  } else {
    const char* colon = strrchr(hostport, ':');
    if (!colon)
      return ncclxSetError(ncclxInvalidArgument, "bootstrap: \"%s\" is not a valid address: missing :port", hostport);
    if (strchr(hostport, ':') != colon)
      return ncclxSetError(ncclxInvalidArgument,
                           "bootstrap: \"%s\" is not a valid address: write IPv6 addresses as [address]:port",
                           hostport);
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    portStr = colon + 1;
  }
  if (host[0] == '\0')
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: \"%s\" is not a valid address: empty host", hostport);
  char* end = NULL;
  errno = 0;
  long port = strtol(portStr, &end, 10);
  if (portStr[0] < '0' || portStr[0] > '9' || *end != '\0' || errno != 0 || port < 1 || port > 65535)
    return ncclxSetError(ncclxInvalidArgument,
                         "bootstrap: \"%s\" is not a valid address: port must be a number in 1..65535", hostport);

  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: cannot resolve host \"%s\" of \"%s\": %s", host,
                         hostport, gai_strerror(rc));
  /* Prefer IPv4 when a name has both: it is what the other ranks most likely resolve too. */
  const struct addrinfo* pick = NULL;
  for (const struct addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  for (const struct addrinfo* a = res; a && !pick; a = a->ai_next)
    if (a->ai_family == AF_INET6) pick = a;
  struct wireAddr root;
  int ok = pick && bsSockaddrToWire(pick->ai_addr, &root) == 0;
  freeaddrinfo(res);
  if (!ok)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: host \"%s\" of \"%s\" has no IPv4 or IPv6 address",
                         host, hostport);
  root.port = htons((uint16_t)port);
  int sources = 0;
  uint64_t secret = mixJobIdentity(fnv1a64(FNV_OFFSET, hostport), &sources);
  if (!sources) warnAnonymous(hostport);
  storeId(id, secret ? secret : 1, &root, sources ? 0 : ID_FLAG_ANONYMOUS);
  return ncclxSuccess;
}

uint64_t bootstrapIdSecret(const ncclxUniqueId* id) {
  struct idLayout l;
  if (id == NULL || bsLoadId(id, &l) != 0) return 0;
  return l.secret;
}
/* ---------------- host identity ---------------- */

static pthread_once_t hostOnce = PTHREAD_ONCE_INIT;
static char hostName[256];

static void hostInit(void) {
  if (gethostname(hostName, sizeof(hostName) - 1) != 0) snprintf(hostName, sizeof(hostName), "unknown-host");
  hostName[sizeof(hostName) - 1] = '\0';
}

const char* bootstrapHostname(void) {
  pthread_once(&hostOnce, hostInit);
  return hostName;
}


/* ---------------- several ids (multi-root init) ---------------- */

int bootstrapIdGroup(int rank, int nIds, int nranks) { return (int)((long long)rank * nIds / nranks); }
int bootstrapIdRoot(int g, int nIds, int nranks) {
  return (int)(((long long)g * nranks + nIds - 1) / nIds);
}

uint64_t bootstrapIdsSecret(const ncclxUniqueId* ids, int nIds) {
  if (ids == NULL || nIds < 1) return 0;
  uint64_t h = bootstrapIdSecret(&ids[0]);
  for (int i = 1; i < nIds && h; i++) { /* order matters: every rank passes the same list */
    uint64_t s = bootstrapIdSecret(&ids[i]);
    if (s == 0) return 0;
    h = (h ^ s) * 0x100000001b3ull + (uint64_t)i;
  }
  return h ? h : 1;
}

ncclxResult_t bootstrapIdsFromString(const char* list, ncclxUniqueId** ids, int* nIds) {
  if (list == NULL || ids == NULL || nIds == NULL)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: NULL argument parsing an id list");
  *ids = NULL;
  *nIds = 0;
  int n = 1;
  for (const char* c = list; *c; c++) n += *c == ',';
  ncclxUniqueId* out = calloc((size_t)n, sizeof(*out));
  if (!out) return ncclxSetError(ncclxSystemError, "bootstrap: out of memory for %d ids", n);
  const char* p = list;
  for (int i = 0; i < n; i++) {
    const char* comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char one[300];
    if (len == 0 || len >= sizeof(one)) {
      free(out);
      return ncclxSetError(ncclxInvalidArgument, "bootstrap: entry %d of the id list \"%s\" is %s", i, list,
                           len ? "too long" : "empty");
    }
    memcpy(one, p, len);
    one[len] = '\0';
    ncclxResult_t res = bootstrapIdFromString(one, &out[i]);
    if (res != ncclxSuccess) {
      free(out);
      return res;
    }
    p = comma ? comma + 1 : p + len;
  }
  *ids = out;
  *nIds = n;
  return ncclxSuccess;
}
