/* Memory registration for providers that need it (FI_MR_LOCAL), with a per-device cache
 * keyed by page-aligned address range and reference counted: regMr of a range already
 * covered is cheap, and an operation on host memory the core did not register (mhandle
 * NULL) registers it for the duration of the operation only. Nothing is kept registered
 * once no handle and no operation refers to it, so memory freed and reused by the
 * application is never matched against a stale registration. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ofi_internal.h"

/* regMr's answer when the provider needs no registration. */
static char ofiMrNone;

static ofiDevice* commDevice(void* comm) {
  const ofiObj* o = comm;
  if (!o || (o->kind != OFI_OBJ_SEND && o->kind != OFI_OBJ_RECV)) return NULL;
  return o->dev;
}

static ofiMrEntry* mrFind(ofiDevice* d, uintptr_t a, size_t size) {
  for (int i = 0; i < d->nmrs; i++) {
    ofiMrEntry* e = d->mrs[i];
    if (a >= e->base && a - e->base <= e->len && size <= e->len - (a - e->base)) return e;
  }
  return NULL;
}

/* A reference to a registration covering [data, data+size). Lock held. */
static ncclxResult_t mrGet(ofiDevice* d, void* data, size_t size, ofiMrEntry** out) {
  uintptr_t a = (uintptr_t)data;
  ofiMrEntry* e = mrFind(d, a, size);
  if (e) {
    e->refs++;
    *out = e;
    return ncclxSuccess;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t base = a & ~(uintptr_t)(page - 1);
  size_t len = ((a + size + page - 1) & ~(uintptr_t)(page - 1)) - base;
  if (d->nmrs == d->capMrs) {
    int cap = d->capMrs ? 2 * d->capMrs : 16;
    ofiMrEntry** n = realloc(d->mrs, (size_t)cap * sizeof(*n));
    if (!n) return ncclxSystemError;
    d->mrs = n;
    d->capMrs = cap;
  }
  e = calloc(1, sizeof(*e));
  if (!e) return ncclxSystemError;
  e->base = base;
  e->len = len;
  uint64_t key = d->mrProvKey ? 0 : d->nextMrKey++;
  int ret = fi_mr_reg(d->domain, (void*)base, len, FI_SEND | FI_RECV, 0, key, 0, &e->mr, NULL);
  if (ret == 0 && d->mrEndpoint) {
    ret = fi_mr_bind(e->mr, &d->eps[0]->fid, 0); /* one endpoint then (ofi_device.c) */
    if (ret == 0) ret = fi_mr_enable(e->mr);
  }
  if (ret != 0) {
    OFI_WARN(d->ctx, "%s: registering %zu bytes at %p failed: %s", d->name, len, (void*)base,
             fi_strerror(-ret));
    if (e->mr) fi_close(&e->mr->fid);
    free(e);
    return ncclxSystemError;
  }
  e->desc = fi_mr_desc(e->mr);
  e->refs = 1;
  d->mrs[d->nmrs++] = e;
  OFI_TRACE(d->ctx, "%s: registered %zu bytes at %p (%d registrations)", d->name, len, (void*)base,
            d->nmrs);
  *out = e;
  return ncclxSuccess;
}

void ofiMrPut(ofiDevice* d, ofiMrEntry* e) {
  if (!e || --e->refs > 0) return;
  for (int i = 0; i < d->nmrs; i++)
    if (d->mrs[i] == e) {
      d->mrs[i] = d->mrs[--d->nmrs];
      break;
    }
  int ret = fi_close(&e->mr->fid);
  if (ret != 0)
    OFI_WARN(d->ctx, "%s: deregistering %p failed: %s", d->name, (void*)e->base, fi_strerror(-ret));
  free(e);
}

void ofiMrCloseAll(ofiDevice* d) {
  for (int i = 0; i < d->nmrs; i++) {
    fi_close(&d->mrs[i]->mr->fid);
    free(d->mrs[i]);
  }
  free(d->mrs);
  d->mrs = NULL;
  d->nmrs = d->capMrs = 0;
}

ncclxResult_t ofiMrDesc(ofiDevice* d, void* mhandle, void* data, size_t size, void** desc,
                        ofiMrEntry** held) {
  *desc = NULL;
  *held = NULL;
  if (!d->mrLocal || size == 0) return ncclxSuccess;
  if (mhandle && mhandle != &ofiMrNone) {
    ofiMrEntry* e = mhandle;
    uintptr_t a = (uintptr_t)data;
    if (a < e->base || a - e->base > e->len || size > e->len - (a - e->base)) {
      OFI_WARN(d->ctx,
               "%s: buffer %p (%zu bytes) is outside the registration it was given "
               "(%p, %zu bytes)",
               d->name, data, size, (void*)e->base, e->len);
      return ncclxInternalError;
    }
    *desc = e->desc;
    return ncclxSuccess;
  }
  ncclxResult_t res = mrGet(d, data, size, held);
  if (res == ncclxSuccess) *desc = (*held)->desc;
  return res;
}

ncclxResult_t ofiRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  ofiDevice* d = commDevice(comm);
  if (!d || !mhandle) return ncclxInternalError;
  *mhandle = NULL;
  if (type != NCCLX_PTR_HOST) {
    OFI_WARN(d->ctx,
             "regMr: pointer type %d of %p (%zu bytes) is not supported: this plugin "
             "moves host memory only",
             type, data, size);
    return ncclxInvalidArgument;
  }
  if (!d->mrLocal || size == 0) {
    *mhandle = &ofiMrNone;
    return ncclxSuccess;
  }
  if (!data) return ncclxInvalidArgument;
  pthread_mutex_lock(&d->lock);
  ofiMrEntry* e = NULL;
  ncclxResult_t res = mrGet(d, data, size, &e);
  pthread_mutex_unlock(&d->lock);
  if (res == ncclxSuccess) *mhandle = e;
  return res;
}

ncclxResult_t ofiDeregMr(void* comm, void* mhandle) {
  ofiDevice* d = commDevice(comm);
  if (!d) return ncclxInternalError;
  if (!mhandle || mhandle == &ofiMrNone) return ncclxSuccess;
  if (!d->mrLocal) return ncclxInternalError;
  pthread_mutex_lock(&d->lock);
  int known = 0;
  for (int i = 0; i < d->nmrs && !known; i++) known = d->mrs[i] == mhandle;
  if (known) ofiMrPut(d, mhandle);
  pthread_mutex_unlock(&d->lock);
  if (!known) OFI_WARN(d->ctx, "deregMr: %p is not a registration of device %s", mhandle, d->name);
  return known ? ncclxSuccess : ncclxInternalError;
}
