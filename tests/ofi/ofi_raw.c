/* A bare libfabric endpoint for ofi_stranger: the bytes a stranger could send to a listener. */
#include "ofi_raw.h"

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
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

int ofiRawConnect(const char* provider, const char* domain, const void* addr, const void* data,
                  size_t len, double timeoutSec, void (*drive)(void*), void* arg) {
  struct fi_info *hints = fi_allocinfo(), *info = NULL;
  if (!hints) return -1;
  hints->caps = FI_MSG;
  hints->ep_attr->type = FI_EP_MSG;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(provider);
  if (domain) hints->domain_attr->name = strdup(domain);
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints, &info);
  fi_freeinfo(hints);
  if (ret) return -1;
  struct fid_fabric* fabric = NULL;
  struct fid_domain* dom = NULL;
  struct fid_eq* eq = NULL;
  struct fid_cq* cq = NULL;
  struct fid_ep* ep = NULL;
  struct fi_eq_attr eqa = {.wait_obj = FI_WAIT_NONE};
  struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
  int result = -1;
  if (fi_fabric(info->fabric_attr, &fabric, NULL) || fi_domain(fabric, info, &dom, NULL) ||
      fi_eq_open(fabric, &eqa, &eq, NULL) || fi_cq_open(dom, &cqa, &cq, NULL) ||
      fi_endpoint(dom, info, &ep, NULL) || fi_ep_bind(ep, &eq->fid, 0) ||
      fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) || fi_enable(ep) ||
      fi_connect(ep, addr, len ? data : NULL, len))
    goto out;
  double deadline = ncNow() + timeoutSec;
  while (result < 0 && ncNow() < deadline) {
    struct {
      struct fi_eq_cm_entry e;
      uint8_t data[256];
    } ev;
    uint32_t event = 0;
    ssize_t n = fi_eq_read(eq, &event, &ev, sizeof(ev), 0);
    if (n == -FI_EAVAIL) {
      struct fi_eq_err_entry err;
      memset(&err, 0, sizeof(err));
      fi_eq_readerr(eq, &err, 0);
      result = err.err == FI_ECONNREFUSED ? 1 : -1;
      break;
    }
    if (n > 0 && event == FI_CONNECTED) result = 0;
    if (n > 0 && event == FI_SHUTDOWN) result = 1;
    struct fi_cq_entry ce;
    (void)fi_cq_read(cq, &ce, 1); /* progress */
    drive(arg);
  }
out:
  if (ep) fi_close(&ep->fid);
  if (cq) fi_close(&cq->fid);
  if (eq) fi_close(&eq->fid);
  if (dom) fi_close(&dom->fid);
  if (fabric) fi_close(&fabric->fid);
  fi_freeinfo(info);
  return result;
}

int ofiRawTcpNoise(const void* addr, size_t addrLen, const void* buf, size_t len) {
  struct sockaddr_storage ss;
  if (addrLen > sizeof(ss)) return -1;
  memcpy(&ss, addr, addrLen);
  int fd = socket(ss.ss_family, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  int ok = connect(fd, (struct sockaddr*)&ss, (socklen_t)addrLen) == 0 &&
           write(fd, buf, len) == (ssize_t)len;
  close(fd);
  return ok ? 0 : -1;
}
