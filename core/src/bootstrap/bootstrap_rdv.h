/* The rendezvous shared by bootstrap_root.c (the protocol: plan, serve, join) and
 * bootstrap_hello.c (the root's handling of each rank's hello). */
#ifndef NCCLX_BOOTSTRAP_RDV_H
#define NCCLX_BOOTSTRAP_RDV_H

#include <poll.h>

#include "bootstrap/bootstrap_internal.h"

/* Who this rank meets at the rendezvous. */
struct rdvPlan {
  int nIds, group;            /* ids in the job, and the one this rank says hello at */
  int anonymous;              /* a single id with no job identity (ID_FLAG_ANONYMOUS) */
  int first, end;             /* the group's ranks [first, end); first is its root */
  int nRootPeers;             /* ceil(log2 nIds): root hellos sent and received by a root */
  const struct idLayout* ids; /* nIds ids, the same list on every rank */
  int direct;                 /* members get the whole table from their root (DIRECT_MAX_BYTES) */
  size_t payload, slot;       /* the caller's bytes per rank; slot = address + payload */
  char* all;                  /* the caller's nranks x payload buffer */
  char* table;                /* direct, on a root: nranks slots of address + payload */
};

struct helloConn {
  int fd;
  double since; /* accepted at (bsNow) */
  char name[64];
  size_t got;
  struct helloMsg msg;
  char* payload; /* direct mode: the member's payload, read after the hello */
  size_t payloadGot;
};

/* ---------------- bootstrap_reply.c ---------------- */

int partnerCount(int nranks);
int sendPartners(struct bootstrapRoot* r, int fd, int rank, double deadline);
ncclxResult_t recvPartners(struct bootstrapRoot* r, int fd, uint32_t count, const char* rootName,
                                  double deadline);
int sendTable(struct bootstrapRoot* r, const struct rdvPlan* p, int fd, double deadline);
ncclxResult_t recvTable(struct bootstrapRoot* r, const struct rdvPlan* p, int fd, const char* rootName,
                               double deadline);

/* ---------------- bootstrap_hello.c ---------------- */

const char* helloName(struct helloConn* h);
void sendTableError(int fd, uint64_t secret, ncclxResult_t status, const char* text);
int describeMissing(const int* fds, int first, int end, char* buf, size_t size);
void rdvNote(struct bootstrapRoot* r, const char* note);
void dropHello(struct helloConn* h);
void dropSilent(struct bootstrapRoot* r, struct helloConn* h, const char* why);
void dropSilentPending(struct bootstrapRoot* r, struct helloConn* pending, struct pollfd* pfds, int* nPending);
int progressHello(struct bootstrapRoot* r, const struct rdvPlan* p, struct helloConn* h, int* fds,
                         int* registered, char* rootSeen, int* rootIn);

#endif
