/* A bare libfabric endpoint of the test's own, to send what no ncclx peer would send. */
#ifndef NCCLX_TEST_OFI_RAW_H
#define NCCLX_TEST_OFI_RAW_H

#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

typedef struct {
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_cq* cq;
  struct fid_av* av;
  struct fid_ep* ep;
} ofiRaw;

/* An RDM endpoint with tagged messages of provider (and domain, if not NULL). 0 on success,
 * -1 with a message on stderr. */
int ofiRawOpen(ofiRaw* r, const char* provider, const char* domain);
/* Send len bytes of buf with tag to the endpoint address addr; 0 once the send completed,
 * -1 on an error or after timeoutSec. drive(arg) runs between polls: a receiver in the same
 * process must make progress for the send to complete. */
int ofiRawSend(ofiRaw* r, const void* addr, const void* buf, size_t len, uint64_t tag,
               double timeoutSec, void (*drive)(void*), void* arg);
void ofiRawClose(ofiRaw* r);

#endif
