/* A bare libfabric endpoint for ofi_stranger: the bytes a stranger could send to a listener. */
#include "ofi_raw.h"

#include <stdio.h>
#include <string.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "netcheck_util.h" /* ncNow */

static int fail(ofiRaw* r, const char* what, int ret) {
  fprintf(stderr, "ofi_raw: %s failed: %s\n", what, fi_strerror(ret < 0 ? -ret : ret));
  ofiRawClose(r);
  return -1;
}

int ofiRawOpen(ofiRaw* r, const char* provider, const char* domain) {
  memset(r, 0, sizeof(*r));
  struct fi_info* hints = fi_allocinfo();
  if (!hints) return -1;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(provider);
  if (domain) hints->domain_attr->name = strdup(domain);
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints, &r->info);
  fi_freeinfo(hints);
  if (ret) return fail(r, "fi_getinfo", ret);
  if ((ret = fi_fabric(r->info->fabric_attr, &r->fabric, NULL))) return fail(r, "fi_fabric", ret);
  if ((ret = fi_domain(r->fabric, r->info, &r->domain, NULL))) return fail(r, "fi_domain", ret);
  struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE};
  if ((ret = fi_cq_open(r->domain, &cqa, &r->cq, NULL))) return fail(r, "fi_cq_open", ret);
  struct fi_av_attr ava = {.type = FI_AV_TABLE};
  if ((ret = fi_av_open(r->domain, &ava, &r->av, NULL))) return fail(r, "fi_av_open", ret);
  if ((ret = fi_endpoint(r->domain, r->info, &r->ep, NULL))) return fail(r, "fi_endpoint", ret);
  if ((ret = fi_ep_bind(r->ep, &r->av->fid, 0))) return fail(r, "binding the av", ret);
  if ((ret = fi_ep_bind(r->ep, &r->cq->fid, FI_TRANSMIT | FI_RECV))) return fail(r, "binding the cq", ret);
  if ((ret = fi_enable(r->ep))) return fail(r, "fi_enable", ret);
  return 0;
}

int ofiRawSend(ofiRaw* r, const void* addr, const void* buf, size_t len, uint64_t tag,
               double timeoutSec, void (*drive)(void*), void* arg) {
  fi_addr_t to = FI_ADDR_NOTAVAIL;
  if (fi_av_insert(r->av, addr, 1, &to, 0, NULL) != 1) return -1;
  struct fi_context2 ctx;
  double deadline = ncNow() + timeoutSec;
  ssize_t ret;
  while ((ret = fi_tsend(r->ep, buf, len, NULL, to, tag, &ctx)) == -FI_EAGAIN) {
    struct fi_cq_tagged_entry e;
    (void)fi_cq_read(r->cq, &e, 1);
    drive(arg);
    if (ncNow() > deadline) return -1;
  }
  if (ret) return -1;
  while (ncNow() < deadline) {
    struct fi_cq_tagged_entry e;
    ssize_t n = fi_cq_read(r->cq, &e, 1);
    if (n == 1) return 0;
    if (n != -FI_EAGAIN) return -1;
    drive(arg);
  }
  return -1;
}

void ofiRawClose(ofiRaw* r) {
  if (r->ep) fi_close(&r->ep->fid);
  if (r->av) fi_close(&r->av->fid);
  if (r->cq) fi_close(&r->cq->fid);
  if (r->domain) fi_close(&r->domain->fid);
  if (r->fabric) fi_close(&r->fabric->fid);
  if (r->info) fi_freeinfo(r->info);
  memset(r, 0, sizeof(*r));
}
