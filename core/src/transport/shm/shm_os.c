/* Operating-system helpers of the shared-memory transport: segments, doorbell FIFOs, peer
 * liveness, stale-object cleanup and cross-memory reads. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "transport/shm/net_shm.h"
#include "transport/shm/shm_internal.h"

uint64_t shmNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t shmRandom64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) return v;
  /* No entropy yet (early boot): time and pid still make names unique on this host. */
  static _Atomic uint64_t counter;
  v = shmNowNs() ^ ((uint64_t)getpid() << 32) ^ atomic_fetch_add(&counter, 0x9e3779b97f4a7c15ull);
  v ^= v >> 31;
  v *= 0xbf58476d1ce4e5b9ull;
  return v ^ (v >> 29);
}

void shmNewName(char name[SHM_NAME_MAX]) {
  snprintf(name, SHM_NAME_MAX, "/" SHM_PREFIX "%d-%016llx", (int)getpid(), (unsigned long long)shmRandom64());
}

int shmSegCreate(const char* name, size_t bytes, void** ptr) {
  *ptr = NULL;
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  int err = 0;
  if (ftruncate(fd, (off_t)bytes) != 0) err = errno;
  /* Take the pages now: a full /dev/shm is then ENOSPC here, not SIGBUS at a first touch. */
  if (!err) err = posix_fallocate(fd, 0, (off_t)bytes);
  void* p = MAP_FAILED;
  if (!err) {
    /* Page tables filled now: a first copy into a slot would otherwise take a fault per
     * page and look slow to copyToSlot. (Only the creator, the sender, copies into slots;
     * an opened segment's size is not checked yet when it is mapped.) */
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) err = errno;
  }
  close(fd);
  if (err) {
    shm_unlink(name);
    return err;
  }
  *ptr = p;
  return 0;
}

int shmSegOpen(const char* name, size_t minBytes, void** ptr, size_t* bytes) {
  *ptr = NULL;
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return errno;
  struct stat st;
  int err = fstat(fd, &st) != 0 ? errno : 0;
  if (!err && (st.st_size < 0 || (size_t)st.st_size < minBytes)) err = EPROTO;
  void* p = MAP_FAILED;
  if (!err) {
    p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) err = errno;
  }
  close(fd);
  if (err) return err;
  *ptr = p;
  *bytes = (size_t)st.st_size;
  return 0;
}

int shmBellCreate(const char* path, int* fd) {
  *fd = -1;
  if (mkfifo(path, 0600) != 0) return errno;
  int err = shmBellOpen(path, fd);
  if (err) unlink(path);
  return err;
}

int shmBellOpen(const char* path, int* fd) {
  /* O_RDWR on a FIFO (Linux) opens without waiting for the other end and never sees EOF. */
  *fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (*fd < 0) return errno;
  struct stat st;
  if (fstat(*fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    close(*fd);
    *fd = -1;
    return EPROTO;
  }
  return 0;
}

void shmBellRing(int fd) {
  char b = 1;
  /* EAGAIN: the FIFO is full of rings already, which wakes the peer just as well. */
  ssize_t r = write(fd, &b, 1);
  (void)r;
}

void shmBellDrain(int fd) {
  char buf[64];
  while (read(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf)) {
  }
}

int shmPidOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    return (int)fd;
  }
#endif
  (void)pid;
  return -1;
}

/* Without a pidfd: kill(pid, 0) still succeeds on a zombie, so look at its state too. */
static int pidRunning(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "r");
  if (!f) return 1; /* no /proc: trust kill() */
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')'); /* the name may contain spaces and parentheses */
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

int shmPeerAlive(pid_t pid, int pidfd) {
  if (pidfd >= 0) {
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) == 0; /* readable once the process has exited */
  }
  return pidRunning(pid);
}

/* "ncclx-<pid>-<16 hex>" with an optional ".r"/".s" suffix: *pid, else 0. */
static int parseOurName(const char* n, pid_t* pid) {
  size_t plen = strlen(SHM_PREFIX);
  if (strncmp(n, SHM_PREFIX, plen) != 0) return 0;
  const char* p = n + plen;
  char* end = NULL;
  long v = strtol(p, &end, 10);
  if (end == p || *end != '-' || v <= 0) return 0;
  const char* h = end + 1;
  for (int i = 0; i < 16; i++)
    if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f'))) return 0;
  const char* rest = h + 16;
  if (*rest && strcmp(rest, ".r") != 0 && strcmp(rest, ".s") != 0) return 0;
  *pid = (pid_t)v;
  return 1;
}

int shmCleanStale(shmCtx* ctx) {
  DIR* d = opendir(SHM_DIR);
  if (!d) return 0;
  int removed = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    pid_t pid = 0;
    if (!parseOurName(e->d_name, &pid) || pid == getpid()) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
      removed++;
      SHM_TRACE(ctx, "removed stale " SHM_DIR "/%s (pid %d is gone)", e->d_name, (int)pid);
    }
  }
  closedir(d);
  if (removed) SHM_INFO(ctx, "removed %d stale object(s) of exited processes from " SHM_DIR, removed);
  return removed;
}

/* process_vm_readv against memcpy on 1 MiB of ordinary private memory (what an
 * application's buffers are), best of five of each, alternated; once per process. */
#define SHM_SPEED_BYTES ((size_t)1 << 20)
#define SHM_SPEED_REPS 5
static pthread_once_t speedOnce = PTHREAD_ONCE_INIT;
static double speedCma, speedCopy; /* GB/s; speedCma 0: process_vm_readv refused */

static void speedMeasure(void) {
  char* src = aligned_alloc(4096, SHM_SPEED_BYTES);
  char* dst = aligned_alloc(4096, SHM_SPEED_BYTES);
  double bestCma = 0, bestCopy = 0;
  if (src && dst) {
    memset(src, 1, SHM_SPEED_BYTES);
    memset(dst, 2, SHM_SPEED_BYTES);
    for (int i = 0; i <= SHM_SPEED_REPS; i++) { /* round 0 warms up */
      uint64_t t0 = shmNowNs();
      memcpy(dst, src, SHM_SPEED_BYTES);
      uint64_t t1 = shmNowNs();
      ssize_t n = shmCmaRead(getpid(), dst, (uint64_t)(uintptr_t)src, SHM_SPEED_BYTES);
      uint64_t t2 = shmNowNs();
      if (n != (ssize_t)SHM_SPEED_BYTES) {
        bestCma = 0;
        break;
      }
      if (i == 0 || t1 <= t0 || t2 <= t1) continue;
      double copy = (double)SHM_SPEED_BYTES / (double)(t1 - t0), cma = (double)SHM_SPEED_BYTES / (double)(t2 - t1);
      if (copy > bestCopy) bestCopy = copy;
      if (cma > bestCma) bestCma = cma;
    }
  }
  free(src);
  free(dst);
  speedCma = bestCma, speedCopy = bestCopy;
}

int ncclxShmCmaSpeed(double* cmaGBps, double* copyGBps) {
  pthread_once(&speedOnce, speedMeasure);
  *cmaGBps = speedCma, *copyGBps = speedCopy;
  return speedCma > 0 && speedCopy > 0 ? 0 : -1;
}

ssize_t shmCmaRead(pid_t pid, void* local, uint64_t remote, size_t len) {
  struct iovec l = {.iov_base = local, .iov_len = len};
  struct iovec r = {.iov_base = (void*)(uintptr_t)remote, .iov_len = len};
  ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
  return n < 0 ? -errno : n;
}
