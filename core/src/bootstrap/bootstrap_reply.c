/* The root's replies of the rendezvous: a member's Bruck partners (their addresses), or in
 * direct mode the whole table of addresses and payloads; and the member's side of reading them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap_rdv.h"
#include "util/debug.h"

/* Ranks this rank sends to in a Bruck all-gather: rank - 2^k for every 2^k < nranks. */
int partnerCount(int nranks) {
  int k = 0;
  for (long d = 1; d < nranks; d <<= 1) k++;
  return k;
}

/* Root: one reply to `rank` with its partners' addresses (O(log n) entries, not the table). */
struct partnerReply {
  struct tableHeader h;
  struct partnerEntry entries[64];
};
_Static_assert(offsetof(struct partnerReply, entries) == sizeof(struct tableHeader),
               "the reply is sent as one buffer: no padding between header and entries");

int sendPartners(struct bootstrapRoot* r, int fd, int rank, double deadline) {
  struct partnerReply reply;
  int n = r->nranks, count = 0;
  for (long d = 1; d < n; d <<= 1) {
    int p = (int)((rank - d % n + n) % n);
    reply.entries[count++] = (struct partnerEntry){p, 0, r->addrs[p]};
  }
  reply.h = (struct tableHeader){TABLE_MAGIC, ncclxSuccess, r->secret, n, 0, (uint32_t)count, 0};
  size_t bytes = sizeof(reply.h) + sizeof(reply.entries[0]) * (size_t)count;
  int e = bsSendAll(fd, &reply, bytes, deadline); /* one send: header and entries together */
  if (e == 0) {
    r->stats.rdvMsgs++;
    r->stats.rdvBytes += bytes;
  }
  return e;
}

/* Rank: read and check the partner list, filling those entries of the address table. */
ncclxResult_t recvPartners(struct bootstrapRoot* r, int fd, uint32_t count, const char* rootName,
                                  double deadline) {
  struct partnerEntry entries[64];
  if (count > 64) return ncclxSetError(ncclxInternalError, "bootstrap: root %s sent %u partners", rootName, count);
  int e = bsRecvAll(fd, entries, sizeof(*entries) * count, deadline);
  if (e != 0)
    return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d: truncated partner list from the root %s: %s",
                         r->rank, rootName, e < 0 ? "connection closed" : strerror(e));
  for (uint32_t i = 0; i < count; i++) {
    const struct partnerEntry* p = &entries[i];
    if (p->rank < 0 || p->rank >= r->nranks || (p->addr.family != AF_INET && p->addr.family != AF_INET6))
      return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d: partner entry %u from the root %s is malformed",
                           r->rank, i, rootName);
    r->addrs[p->rank] = p->addr;
  }
  return ncclxSuccess;
}


/* Root, direct mode: the whole table (every rank's address and payload) in one reply. */
int sendTable(struct bootstrapRoot* r, const struct rdvPlan* p, int fd, double deadline) {
  int n = r->nranks;
  /* The header sits right before the table (see bootstrapInitScalable): one send, so the
   * member wakes up once for the whole reply. */
  struct tableHeader h = {TABLE_MAGIC, ncclxSuccess, r->secret, n, 0, (uint32_t)n, (uint32_t)p->slot};
  char* reply = p->table - sizeof(h);
  memcpy(reply, &h, sizeof(h));
  size_t bytes = sizeof(h) + p->slot * (size_t)n;
  int e = bsSendAll(fd, reply, bytes, deadline);
  if (e == 0) {
    r->stats.rdvMsgs++;
    r->stats.rdvBytes += bytes;
  }
  return e;
}

/* Rank, direct mode: read the whole table into the address table and the caller's buffer. */
ncclxResult_t recvTable(struct bootstrapRoot* r, const struct rdvPlan* p, int fd, const char* rootName,
                               double deadline) {
  size_t bytes = p->slot * (size_t)r->nranks;
  char* t = malloc(bytes);
  if (!t) return ncclxSetError(ncclxSystemError, "bootstrap: rank %d: out of memory for the %zu-byte table", r->rank, bytes);
  int e = bsRecvAll(fd, t, bytes, deadline);
  ncclxResult_t res = ncclxSuccess;
  if (e != 0)
    res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d: truncated table from the root %s: %s", r->rank,
                        rootName, e < 0 ? "connection closed" : strerror(e));
  for (int i = 0; res == ncclxSuccess && i < r->nranks; i++) {
    const char* s = t + p->slot * (size_t)i;
    struct wireAddr a;
    memcpy(&a, s, sizeof(a));
    if (a.family != AF_INET && a.family != AF_INET6)
      res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d: the table from the root %s has no address for rank %d",
                          r->rank, rootName, i);
    else if (i != r->rank)
      r->addrs[i] = a;
    if (res == ncclxSuccess && p->payload && i != r->rank)
      memcpy(p->all + p->payload * (size_t)i, s + sizeof(a), p->payload);
  }
  free(t);
  return res;
}
