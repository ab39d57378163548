/* Peer-mapped ncclxMemAlloc allocations (shm_mem.c): what a reader needs to find, map and
 * keep mapped another process's allocation. Used by the shared-memory transport's mapped
 * messages (shm_data.c) and by the LL board's mapped broadcast rounds (coll_ll.c). */
#ifndef NCCLX_SHM_MEM_H
#define NCCLX_SHM_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_MEM_NAME "ncclx-mem-"

/* An allocation of the owner process, as a reader is told of it. */
typedef struct {
  uint64_t id;     /* unique in the owner's process; its memfd is named SHM_MEM_NAME<id> */
  uint64_t bytes;  /* the allocation's size */
  uint64_t offset; /* of the message in it */
  int32_t fd;      /* the memfd's number in the owner */
  uint32_t pad;
} shmMemRef;

/* Does [p, p + len) lie in one of this process's shared allocations? Fills *ref. */
int shmMemFind(const void* p, size_t len, shmMemRef* ref);
/* This process's probe allocation (SHM_MEM_PROBE_BYTES, made once): what a reader maps to
 * find out whether it can map this process's allocations; its fd and id; 0, or -1 if none. */
#define SHM_MEM_PROBE_BYTES ((size_t)4096)
int shmMemProbe(int32_t* fd, uint64_t* id);
/* Maps ref's allocation of process pid read-only; 0, or an errno (ESTALE: the fd no longer
 * names that allocation). */
int shmMemMapPeer(pid_t pid, const shmMemRef* ref, char** base);

/* A reader's allocations of one owner mapped so far (least recently used evicted): each
 * keeps its pages alive until evicted or cleared. Zero-initialised is empty. */
#define SHM_MAP_CACHE 8
typedef struct {
  struct {
    uint64_t id;
    size_t bytes;
    char* base; /* NULL: unused */
    uint64_t lastUse;
  } e[SHM_MAP_CACHE];
  uint64_t clock;
} shmMapCache;

/* *base = ref's allocation of process pid, mapped through the cache; 0, or an errno. */
int shmMapCacheGet(shmMapCache* cache, pid_t pid, const shmMemRef* ref, char** base);
void shmMapCacheClear(shmMapCache* cache);

#endif
