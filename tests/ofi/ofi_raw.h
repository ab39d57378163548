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

/* Connected mode: open a bare FI_EP_MSG endpoint of provider (and domain) and fi_connect to
 * addr with len bytes of connection data. Returns 1 when the listener rejected it, 0 when it
 * was accepted, -1 on another error or after timeoutSec (drive(arg) runs between polls). */
int ofiRawConnect(const char* provider, const char* domain, const void* addr, const void* data,
                  size_t len, double timeoutSec, void (*drive)(void*), void* arg);
/* Plain TCP: connect to the socket address addr, write len bytes, close. 0 on success. */
int ofiRawTcpNoise(const void* addr, size_t addrLen, const void* buf, size_t len);

#endif
