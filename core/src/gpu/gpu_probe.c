/* Pointer classification through the CUDA driver the application already loaded.
 *
 * Used by every build: a build without CUDA must still recognise a device pointer to refuse
 * it, and a CUDA build must not initialize CUDA (a context per rank, hundreds of MiB of
 * device memory) just to learn that a CPU job's buffers are host memory.
 *
 * Device memory only exists once libcuda.so.1 is loaded, so the probe looks for it among the
 * loaded objects (dlopen RTLD_NOLOAD: loads nothing) and asks cuPointerGetAttribute. That
 * lookup costs ~20 us, so it is redone only when an object was loaded since the last one.
 * Every call asks that question, so it must be cheap and take no lock: the loader appends
 * each new object to the end of its list, so we keep a reference to the list's last object
 * at the lookup (the anchor) and an object loaded since is linked after it. Taking
 * dl_iterate_phdr's load counter instead costs the loader's lock, two atomic instructions
 * that wait for the caller's pending stores to other cores: 20% of a 2-rank 8-byte
 * broadcast. That counter stays the fallback when the anchor cannot be pinned.
 * References to anchors are never dropped: a thread may still be reading an old anchor when
 * a lookup replaces it, so it must stay mapped. The side effect: an object that was last in
 * the list at a lookup stays loaded if the application dlcloses it (and a later dlopen
 * gets the same copy, its constructors not run again). Lookups happen only after an object
 * was loaded, and a pinned object cannot be loaded anew, so there are at most as many pins
 * as distinct objects. Once found, the driver stays loaded (we keep the reference), so the
 * function pointer is cached for good. */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu/gpu.h"

/* Driver API values (cuda.h), stable since CUDA 9.2; checked against the header when it is
 * available. */
enum {
  CU_SUCCESS_ = 0,
  ATTR_MEMORY_TYPE = 2,     /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
  ATTR_IS_MANAGED = 8,      /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
  ATTR_DEVICE_ORDINAL = 9,  /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
  MEMTYPE_DEVICE = 2,       /* CU_MEMORYTYPE_DEVICE */
  MEMTYPE_UNIFIED = 4       /* CU_MEMORYTYPE_UNIFIED */
};
#if defined(NCCLX_HAVE_CUDA) && defined(__has_include)
#if __has_include(<cuda.h>)
#include <cuda.h>
_Static_assert((int)CU_POINTER_ATTRIBUTE_MEMORY_TYPE == (int)ATTR_MEMORY_TYPE, "cuda.h changed");
_Static_assert((int)CU_POINTER_ATTRIBUTE_IS_MANAGED == (int)ATTR_IS_MANAGED, "cuda.h changed");
_Static_assert((int)CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == (int)ATTR_DEVICE_ORDINAL, "cuda.h changed");
_Static_assert((int)CU_MEMORYTYPE_DEVICE == (int)MEMTYPE_DEVICE &&
                   (int)CU_MEMORYTYPE_UNIFIED == (int)MEMTYPE_UNIFIED, "cuda.h changed");
#endif
#endif

/* CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) */
typedef int (*pointerGetAttributeFn)(void* data, int attribute, unsigned long long ptr);

static _Atomic(pointerGetAttributeFn) driverFn;
static _Atomic(struct link_map*) anchor; /* last loaded object at the last lookup, pinned */
static atomic_ullong checkedAtLoads = ULLONG_MAX; /* load counter of the last lookup */
static pthread_mutex_t lookupLock = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
  unsigned long long loads;
  struct link_map* last;
  char name[PATH_MAX];
} loaderState;

static int readLoads(struct dl_phdr_info* info, size_t size, void* out) {
  (void)size;
  *(unsigned long long*)out = info->dlpi_adds;
  return 1; /* the counter is the same on every object: stop at the first */
}

/* Runs under the loader's lock, which guards its list of objects: safe to walk here. */
static int readLoaderState(struct dl_phdr_info* info, size_t size, void* out) {
  (void)size;
  loaderState* st = out;
  st->loads = info->dlpi_adds;
  struct link_map* m = _r_debug.r_map;
  while (m && m->l_next) m = m->l_next;
  st->last = m;
  snprintf(st->name, sizeof st->name, "%s", m && m->l_name ? m->l_name : "");
  return 1; /* the counter is the same on every object: stop at the first */
}

/* A reference to st->last, or NULL if it went away (or was replaced) before we got one. */
static void* pinLast(const loaderState* st) {
  if (!st->last) return NULL;
  void* h = dlopen(st->name[0] ? st->name : NULL, RTLD_LAZY | RTLD_NOLOAD);
  struct link_map* m = NULL;
  if (h && (dlinfo(h, RTLD_DI_LINKMAP, &m) != 0 || m != st->last)) {
    dlclose(h);
    h = NULL;
  }
  return h;
}

/* Whether no object was loaded since the last lookup (which found no driver), without an
 * anchor: the loader's count of loads. */
__attribute__((noinline, cold)) static int nothingLoadedByCount(void) {
  unsigned long long loads = 0;
  dl_iterate_phdr(readLoads, &loads);
  return atomic_load_explicit(&checkedAtLoads, memory_order_relaxed) == loads;
}

/* Whether no object was loaded since the last lookup (which found no driver). */
static inline int nothingLoadedSince(void) {
  struct link_map* a = atomic_load_explicit(&anchor, memory_order_acquire);
  if (a) return __atomic_load_n(&a->l_next, __ATOMIC_ACQUIRE) == NULL;
  return nothingLoadedByCount();
}

static pointerGetAttributeFn driverLookup(void);

/* Every collective asks (through gpuDriverLoaded): the answer from two loads, the lookup out
 * of line. */
static inline pointerGetAttributeFn driver(void) {
  pointerGetAttributeFn fn = atomic_load_explicit(&driverFn, memory_order_acquire);
  if (fn || nothingLoadedSince()) return fn;
  return driverLookup();
}

__attribute__((noinline)) static pointerGetAttributeFn driverLookup(void) {
  pointerGetAttributeFn fn;
  pthread_mutex_lock(&lookupLock);
  fn = atomic_load(&driverFn);
  if (!fn) {
    /* The anchor first, the lookup second: a driver loaded in between is found by the
     * lookup, one loaded after it is linked after the anchor. */
    loaderState st = {0};
    dl_iterate_phdr(readLoaderState, &st);
    void* pin = pinLast(&st);
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h) {
      void* sym = dlsym(h, "cuPointerGetAttribute");
      if (sym) fn = (pointerGetAttributeFn)sym; /* keep h: the driver stays loaded */
      else dlclose(h);
    }
    if (fn) atomic_store_explicit(&driverFn, fn, memory_order_release);
    atomic_store(&checkedAtLoads, st.loads);
    /* A pin already held for this object is released (the object stays pinned once). */
    if (pin && st.last == atomic_load_explicit(&anchor, memory_order_relaxed)) dlclose(pin);
    else if (pin) atomic_store_explicit(&anchor, st.last, memory_order_release);
    else atomic_store_explicit(&anchor, NULL, memory_order_release);
  }
  pthread_mutex_unlock(&lookupLock);
  return fn;
}

int gpuDriverLoaded(void) { return driver() != NULL; }

gpuMemKind gpuProbePointer(const void* p, int* device) {
  if (device) *device = -1;
  pointerGetAttributeFn fn = p ? driver() : NULL;
  if (!fn) return GPU_MEM_HOST;
  unsigned long long addr = (unsigned long long)(uintptr_t)p;
  unsigned int memType = 0, managed = 0;
  /* Host memory the driver does not know fails with CUDA_ERROR_INVALID_VALUE; an
   * uninitialized driver with CUDA_ERROR_NOT_INITIALIZED: host either way. */
  if (fn(&memType, ATTR_MEMORY_TYPE, addr) != CU_SUCCESS_) return GPU_MEM_HOST;
  if (fn(&managed, ATTR_IS_MANAGED, addr) != CU_SUCCESS_) managed = 0;
  if (!managed && memType != MEMTYPE_DEVICE && memType != MEMTYPE_UNIFIED) return GPU_MEM_HOST;
  int ordinal = -1;
  if (device && fn(&ordinal, ATTR_DEVICE_ORDINAL, addr) == CU_SUCCESS_) *device = ordinal;
  return managed ? GPU_MEM_MANAGED : GPU_MEM_DEVICE;
}
