/* Peer-mapped memory of the shared-memory transport.
 *
 * ncclxMemAlloc gives allocations of NCCLX_SHM_MAPPED_MIN bytes or more a memfd behind them
 * (ncclxShmMemAlloc). When a large message lies in one, the sender names the allocation in
 * its slot (SHM_MSG_MAPPED, shm_data.c); the receiver maps the memfd once, through
 * /proc/<pid>/fd/<fd>, and copies the message out with one memcpy. On this VM that copy ran
 * at 12.6 GB/s for 16 MiB against 5.5-7 GB/s for process_vm_readv, and where two copies
 * through the slots cost each side a copy, it costs the receiver one.
 *
 * The memfd is named SHM_MEM_NAME<id>, id unique in the process: the receiver checks the
 * name of what it opened, so a reused fd number never maps the wrong memory. Its size is
 * sealed (F_SEAL_SHRINK | F_SEAL_GROW) and checked, so a mapping never reaches past the
 * file's end (SIGBUS). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "transport/shm/net_shm.h"
#include "transport/shm/shm_internal.h"
#include "transport/shm/shm_mem.h"

#define SHM_MEM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

typedef struct {
  uintptr_t base;
  size_t bytes;
  int fd;
  uint64_t id;
} shmMemEntry;

static pthread_mutex_t memLock = PTHREAD_MUTEX_INITIALIZER;
static shmMemEntry* memTab;
static size_t memCount, memCap;
/* Ids carry 32 random bits per process (memIdReseed): a reader that reaches another process
 * through a pid (another pid namespace, a recycled pid) finds no memfd of the expected name. */
static uint64_t memNextId = 1;

/* Each allocation holds a descriptor open for the peers to reach it by: at most a quarter of
 * the process's limit, so the library's own sockets and segments never run short, and at most
 * SHM_MEM_MAX_ALLOCS; allocations under SHM_MEM_SMALL_BYTES may take only half of that, so
 * that many small buffers cannot leave the large ones, where mapping matters most, without.
 * Beyond that, ncclxMemAlloc gives ordinary memory. */
#define SHM_MEM_MAX_ALLOCS ((size_t)4096)
#define SHM_MEM_SMALL_BYTES ((size_t)64 << 10)
static size_t memFdBudget(size_t bytes) {
  struct rlimit rl;
  size_t b = getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ? 1024 : (size_t)rl.rlim_cur / 4;
  if (b > SHM_MEM_MAX_ALLOCS) b = SHM_MEM_MAX_ALLOCS;
  return bytes < SHM_MEM_SMALL_BYTES ? b / 2 : b;
}

/* The index of the first entry of memTab (sorted by base) whose base is above a. */
static size_t memUpper(uintptr_t a) {
  size_t lo = 0, hi = memCount;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (memTab[mid].base <= a) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void memIdReseed(void) {
  uint64_t r = 0;
  if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
    r = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull;
  memNextId = (r & ~(uint64_t)0xffffffffu) | 1;
}

/* A fork while another thread holds memLock would leave the child's lock held for ever; the
 * child also takes ids of its own. */
static void memForkPrepare(void) { pthread_mutex_lock(&memLock); }
static void memForkParent(void) { pthread_mutex_unlock(&memLock); }
static void memForkChild(void) {
  memIdReseed();
  pthread_mutex_unlock(&memLock);
}
__attribute__((constructor)) static void memForkInit(void) {
  memIdReseed();
  pthread_atfork(memForkPrepare, memForkParent, memForkChild);
}

/* A sealed memfd of bytes, mapped read-write; NULL (errno set) on failure. */
static void* memCreate(size_t bytes, uint64_t id, int* fdOut) {
  char name[48];
  snprintf(name, sizeof(name), SHM_MEM_NAME "%llu", (unsigned long long)id);
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return NULL;
  void* p = MAP_FAILED;
  if (ftruncate(fd, (off_t)bytes) == 0 && fcntl(fd, F_ADD_SEALS, SHM_MEM_SEALS) == 0)
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  *fdOut = fd;
  return p;
}

static int memAdd(void* p, size_t bytes, int fd, uint64_t id) {
  if (memCount == memCap) {
    size_t cap = memCap ? 2 * memCap : 16;
    shmMemEntry* t = realloc(memTab, cap * sizeof(*t));
    if (!t) return -1;
    memTab = t, memCap = cap;
  }
  size_t at = memUpper((uintptr_t)p);
  memmove(&memTab[at + 1], &memTab[at], (memCount - at) * sizeof(*memTab));
  memTab[at] = (shmMemEntry){(uintptr_t)p, bytes, fd, id};
  memCount++;
  return 0;
}

static size_t memPending; /* allocations being made: counted against the budget */

/* A tracked allocation of at least size bytes; its fd and id through the pointers. The probe
 * page is outside the descriptor budget: buffers allocated before the first connection must
 * not turn mapping off for the process's life. */
static void* memAlloc(size_t size, int isProbe, int32_t* fdOut, uint64_t* idOut) {
  if (size == 0 || size > SHM_MAX_MAPPED) return NULL;
  size_t bytes = (size + SHM_PAGE - 1) & ~(size_t)(SHM_PAGE - 1);
  size_t budget = memFdBudget(bytes);
  pthread_mutex_lock(&memLock);
  uint64_t id = memNextId++;
  int full = !isProbe && memCount + memPending >= budget;
  memPending += !full;
  pthread_mutex_unlock(&memLock);
  if (full) return NULL;
  int fd = -1;
  void* p = memCreate(bytes, id, &fd);
  pthread_mutex_lock(&memLock);
  memPending--;
  int bad = p && memAdd(p, bytes, fd, id);
  pthread_mutex_unlock(&memLock);
  if (!p) return NULL;
  if (bad) {
    munmap(p, bytes);
    close(fd);
    return NULL;
  }
  *fdOut = fd, *idOut = id;
  return p;
}

void* ncclxShmMemAlloc(size_t size) {
  int32_t fd;
  uint64_t id;
  return memAlloc(size, 0, &fd, &id);
}

int ncclxShmMemFree(void* p) {
  if (!p) return 0;
  shmMemEntry e = {0};
  int found = 0;
  pthread_mutex_lock(&memLock);
  size_t i = memUpper((uintptr_t)p);
  if (i > 0 && memTab[i - 1].base == (uintptr_t)p) {
    e = memTab[i - 1];
    memmove(&memTab[i - 1], &memTab[i], (memCount - i) * sizeof(*memTab));
    memCount--;
    found = 1;
  }
  pthread_mutex_unlock(&memLock);
  if (!found) return 0;
  munmap(p, e.bytes);
  close(e.fd);
  return 1;
}

int shmMemFind(const void* p, size_t len, shmMemRef* ref) {
  uintptr_t a = (uintptr_t)p;
  int found = 0;
  pthread_mutex_lock(&memLock);
  size_t i = memUpper(a); /* allocations do not overlap: only the one below a can hold it */
  if (i > 0) {
    const shmMemEntry* e = &memTab[i - 1];
    if (a - e->base <= e->bytes && len <= e->bytes - (a - e->base)) {
      *ref = (shmMemRef){.id = e->id, .bytes = e->bytes, .offset = a - e->base, .fd = e->fd};
      found = 1;
    }
  }
  pthread_mutex_unlock(&memLock);
  return found;
}

/* One page, made at the first connection and kept for the process's life: what a receiver
 * maps at accept to find out whether it can map this process's allocations at all. */
static pthread_once_t probeOnce = PTHREAD_ONCE_INIT;
static int32_t probeFd = -1;
static uint64_t probeId;
static void probeCreate(void) {
  if (!memAlloc(SHM_MEM_PROBE_BYTES, 1, &probeFd, &probeId)) probeFd = -1;
}

int shmMemProbe(int32_t* fd, uint64_t* id) {
  pthread_once(&probeOnce, probeCreate);
  *fd = probeFd, *id = probeId;
  return probeFd >= 0 ? 0 : -1;
}

/* Is what f refers to the allocation SHM_MEM_NAME<id>? Its link reads
 * "/memfd:ncclx-mem-<id> (deleted)". */
static int linkIsAllocation(const char* linkPath, uint64_t id) {
  char link[96], want[48];
  ssize_t n = readlink(linkPath, link, sizeof(link) - 1);
  if (n <= 0) return 0;
  link[n] = '\0';
  int w = snprintf(want, sizeof(want), "/memfd:" SHM_MEM_NAME "%llu", (unsigned long long)id);
  return strncmp(link, want, (size_t)w) == 0 && (link[w] == '\0' || link[w] == ' ');
}

int shmMemMapPeer(pid_t pid, const shmMemRef* ref, char** base) {
  if (ref->fd < 0 || ref->bytes == 0 || ref->bytes > SHM_MAX_MAPPED) return EINVAL;
  char path[64], self[48];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)ref->fd);
  /* Really opening whatever a reused fd number holds now (a FIFO, a device) could block or
   * have effects: take a path-only handle, check its name and that it is a regular file,
   * and only then open it for reading (through our own handle, so it is that same file). */
  if (!linkIsAllocation(path, ref->id)) return access(path, F_OK) == 0 ? ESTALE : ENOENT;
  int h = open(path, O_PATH | O_CLOEXEC);
  if (h < 0) return errno;
  snprintf(self, sizeof(self), "/proc/self/fd/%d", h);
  struct stat st;
  int err = 0, seals = 0, f = -1;
  if (!linkIsAllocation(self, ref->id)) err = ESTALE;
  else if (fstat(h, &st) != 0) err = errno;
  else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < ref->bytes) err = ERANGE;
  else if ((f = open(self, O_RDONLY | O_CLOEXEC)) < 0) err = errno;
  else if ((seals = fcntl(f, F_GET_SEALS)) < 0 || (seals & F_SEAL_SHRINK) == 0)
    err = EPERM; /* could shrink under our mapping: SIGBUS */
  close(h);
  void* m = MAP_FAILED;
  if (!err) {
    m = mmap(NULL, (size_t)ref->bytes, PROT_READ, MAP_SHARED, f, 0);
    if (m == MAP_FAILED) err = errno;
  }
  if (f >= 0) close(f);
  if (err) return err;
  *base = m;
  return 0;
}

int shmMapCacheGet(shmMapCache* cache, pid_t pid, const shmMemRef* ref, char** base) {
  int victim = 0;
  for (int i = 0; i < SHM_MAP_CACHE; i++) {
    if (cache->e[i].base && cache->e[i].id == ref->id && cache->e[i].bytes == ref->bytes) {
      cache->e[i].lastUse = ++cache->clock;
      *base = cache->e[i].base;
      return 0;
    }
    if (!cache->e[i].base || (cache->e[victim].base && cache->e[i].lastUse < cache->e[victim].lastUse))
      victim = i;
  }
  int err = shmMemMapPeer(pid, ref, base);
  if (err) return err;
  if (cache->e[victim].base) munmap(cache->e[victim].base, cache->e[victim].bytes);
  cache->e[victim].id = ref->id;
  cache->e[victim].bytes = (size_t)ref->bytes;
  cache->e[victim].base = *base;
  cache->e[victim].lastUse = ++cache->clock;
  return 0;
}

void shmMapCacheClear(shmMapCache* cache) {
  for (int i = 0; i < SHM_MAP_CACHE; i++)
    if (cache->e[i].base) munmap(cache->e[i].base, cache->e[i].bytes);
  *cache = (shmMapCache){0};
}
