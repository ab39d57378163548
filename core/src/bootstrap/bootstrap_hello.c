/* The root's side of the rendezvous, one hello at a time: read it (in pieces, without
 * blocking), check it (job secret, duplicates, nranks, rank range), register the rank or
 * refuse it with a sentence, and drop connections that never say hello (flood protection). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bootstrap_rdv.h"
#include "util/debug.h"

/* Where a pending connection comes from, looked up only when a message needs it: the root
 * handles one hello per rank, so its per-hello work is kept to the bare minimum. */
const char* helloName(struct helloConn* h) {
  if (!h->name[0]) bsPeerString(h->fd, h->name, sizeof(h->name));
  return h->name;
}

/* Tell a rank why the root refused it (best effort; the rank is waiting for a reply). */
void sendTableError(int fd, uint64_t secret, ncclxResult_t status, const char* text) {
  struct tableHeader h = {TABLE_MAGIC, (int32_t)status, secret, 0, (uint32_t)strlen(text), 0, 0};
  double deadline = bsNow() + 1.0;
  if (bsSendAll(fd, &h, sizeof(h), deadline) == 0) bsSendAll(fd, text, h.textLen, deadline);
}

/* "rank 3" / "ranks 3,5,7" listing the group's ranks whose fd is -1 (except its root). */
int describeMissing(const int* fds, int first, int end, char* buf, size_t size) {
  int missing = 0;
  for (int i = first + 1; i < end; i++) missing += fds[i] < 0;
  size_t off = (size_t)snprintf(buf, size, "rank%s ", missing == 1 ? "" : "s");
  int listed = 0;
  for (int i = first + 1; i < end && off < size; i++) {
    if (fds[i] >= 0) continue;
    if (listed == 16) {
      snprintf(buf + off, size - off, ",... (%d in total)", missing);
      break;
    }
    off += (size_t)snprintf(buf + off, size - off, "%s%d", listed ? "," : "", i);
    listed++;
  }
  return missing;
}

/* Remember why a rank is missing, for the final error ("; "-separated, bounded). */
void rdvNote(struct bootstrapRoot* r, const char* note) {
  size_t len = strlen(r->rdvNotes);
  if (len + 8 >= sizeof(r->rdvNotes)) return;
  snprintf(r->rdvNotes + len, sizeof(r->rdvNotes) - len, "%s%s", len ? "; " : "", note);
}

/* Validate a complete hello; register the rank or refuse the connection. Returns 1 if kept. */
static int acceptHello(struct bootstrapRoot* r, const struct rdvPlan* p, struct helloConn* h, int* fds,
                       int* registered) {
  const struct helloMsg* m = &h->msg;
  char why[256];
  ncclxResult_t status = ncclxInvalidUsage;
  if (m->secret != r->secret) {
    WARN("bootstrap: root refused connection from %s: wrong job secret (a rank of another job, a stale unique id, "
         "or ranks that disagree on NCCLX_JOB_SECRET or the launcher's job identity); it gets no rank",
         helloName(h));
    /* Its own secret on the reply, so it reads the reason; ours stays ours. */
    sendTableError(h->fd, m->secret, ncclxInvalidUsage,
                   "this root belongs to another job (the job secrets differ: another job on the same "
                   "address, or ranks that disagree on NCCLX_JOB_SECRET or the launcher's job identity)");
    return 0;
  }
  /* The rendezvous has failed: ranks still arriving learn why now, not at their timeout. */
  if (r->conflict[0]) {
    char why[400];
    snprintf(why, sizeof(why), "the root refused rank %d: %s", m->rank, r->conflict);
    sendTableError(h->fd, r->secret, ncclxInvalidUsage, why);
    r->rdvConflictTold++;
    return 0;
  }
  /* Every rank of a job passes the same nranks: a rank that does not dooms the rendezvous
   * (or is another job's, at an anonymous address). Fail every rank now, naming both numbers. */
  if (m->nranks != r->nranks) {
    snprintf(r->conflict, sizeof(r->conflict),
             "rank %d from %s says nranks=%d but the root has nranks=%d: every rank of a job must pass the same "
             "nranks%s", m->rank, helloName(h), m->nranks, r->nranks,
             p->anonymous ? " (or another job is using the same NCCLX_COMM_ID address)" : "");
    WARN("bootstrap: root refused a rank: %s", r->conflict);
    sendTableError(h->fd, r->secret, ncclxInvalidUsage, r->conflict);
    r->rdvConflictTold++;
    return 0;
  }
  /* An anonymous id's secret is the address's: a second rank 0, or a rank joining twice,
   * means two jobs meet here. Admitting either would mix them: fail the rendezvous. */
  if (p->anonymous && !r->conflict[0] && (m->rank == p->first || (m->rank > p->first && m->rank < p->end &&
                                                                   fds[m->rank] >= 0))) {
    snprintf(r->conflict, sizeof(r->conflict),
             "%s from %s: another job seems to be using the same NCCLX_COMM_ID address; no rank of "
             "either is admitted (give each job NCCLX_JOB_SECRET or NCCLX_JOB_ID)",
             m->rank == p->first ? "a second rank 0 announced itself" : "a rank joined twice", helloName(h));
    char why[400];
    snprintf(why, sizeof(why), "rank %d is a duplicate: %s", m->rank, r->conflict);
    WARN("bootstrap: root refused a rank: %s", why);
    sendTableError(h->fd, r->secret, ncclxInvalidUsage, why);
    r->rdvConflictTold++;
    return 0;
  }
  if (m->rank <= p->first || m->rank >= p->end)
    snprintf(why, sizeof(why), "connection from %s claims rank %d, outside %d..%d (the ranks of unique id %d of %d)",
             helloName(h), m->rank, p->first + 1, p->end - 1, p->group, p->nIds);
  else if (fds[m->rank] >= 0)
    snprintf(why, sizeof(why), "rank %d from %s is a duplicate: that rank already joined", m->rank, helloName(h));
  else if (m->listenAddr.family != AF_INET && m->listenAddr.family != AF_INET6)
    snprintf(why, sizeof(why), "rank %d from %s sent a listener address of unknown family %u", m->rank, helloName(h),
             (unsigned)m->listenAddr.family);
  else {
    fds[m->rank] = h->fd;
    r->addrs[m->rank] = m->listenAddr;
    if (p->direct) {
      char* slot = p->table + p->slot * (size_t)m->rank;
      memcpy(slot, &m->listenAddr, sizeof(m->listenAddr));
      if (p->payload) memcpy(slot + sizeof(m->listenAddr), h->payload, p->payload);
    }
    (*registered)++;
    r->stats.rdvMsgs++;
    r->stats.rdvBytes += sizeof(*m) + (p->direct ? p->payload : 0);
    return 1;
  }
  WARN("bootstrap: root refused a rank: %s", why);
  rdvNote(r, why);
  sendTableError(h->fd, r->secret, status, why);
  return 0;
}

/* Multi-root: another root's bootstrap address. Only roots g - 2^k send us one. */
static void acceptRootHello(struct bootstrapRoot* r, const struct rdvPlan* p, struct helloConn* h, char* rootSeen,
                            int* rootIn) {
  const struct helloMsg* m = &h->msg;
  int q = (int)m->reserved, d = (p->group - q + p->nIds) % p->nIds, k = 0;
  while (k < 31 && (1 << k) < d) k++;
  if (m->secret != r->secret) {
    WARN("bootstrap: root refused a root hello from %s: wrong job secret (another job, or different id lists)",
         helloName(h));
  } else if (m->nranks != r->nranks || q < 0 || q >= p->nIds || m->rank != bootstrapIdRoot(q, p->nIds, r->nranks) ||
             d == 0 || (1 << k) != d || rootSeen[k] ||
             (m->listenAddr.family != AF_INET && m->listenAddr.family != AF_INET6)) {
    WARN("bootstrap: root rank %d refused a root hello from %s: rank %d, unique id %d, nranks %d (expected roots of "
         "ids %d - 2^k among %d ids, nranks %d, once each)",
         r->rank, helloName(h), m->rank, q, m->nranks, p->group, p->nIds, r->nranks);
  } else {
    r->addrs[m->rank] = m->listenAddr;
    rootSeen[k] = 1;
    (*rootIn)++;
    r->stats.rdvMsgs++;
    r->stats.rdvBytes += sizeof(*m);
  }
}

void dropHello(struct helloConn* h) {
  close(h->fd);
  free(h->payload);
  h->payload = NULL;
}

/* A connection that never identified itself; counted for the error if ranks are missing. */
void dropSilent(struct bootstrapRoot* r, struct helloConn* h, const char* why) {
  if (r->rdvDroppedSilent++ < 3)
    WARN("bootstrap: root dropped connection from %s: %s%s", helloName(h), why,
         r->rdvDroppedSilent == 3 ? " (further ones are counted, not logged)" : "");
  dropHello(h);
}

/* Read what a pending connection sent. Returns 1 to keep it pending, 0 when it was handled. */
/* A rank sends its hello as soon as it connects: one silent for HELLO_WAIT_SEC is not a
 * rank. pfds[1 + i] belongs to pending[i] and moves with it. */
void dropSilentPending(struct bootstrapRoot* r, struct helloConn* pending, struct pollfd* pfds, int* nPending) {
  double now = bsNow();
  for (int i = 0; i < *nPending;) {
    if (now - pending[i].since > HELLO_WAIT_SEC && !pfds[1 + i].revents) {
      dropSilent(r, &pending[i], "no hello within " HELLO_WAIT_TEXT);
      memmove(&pending[i], &pending[i + 1], sizeof(*pending) * (size_t)(*nPending - i - 1));
      memmove(&pfds[1 + i], &pfds[2 + i], sizeof(*pfds) * (size_t)(*nPending - i - 1));
      (*nPending)--;
      continue;
    }
    i++;
  }
}

int progressHello(struct bootstrapRoot* r, const struct rdvPlan* p, struct helloConn* h, int* fds,
                         int* registered, char* rootSeen, int* rootIn) {
  for (;;) {
    /* Direct mode: a member's payload follows its hello on the same connection. */
    int inPayload = h->got == sizeof(h->msg);
    if (inPayload && !h->payload && !(h->payload = malloc(p->payload))) {
      WARN("bootstrap: root dropped connection from %s: no memory for its %zu-byte payload", helloName(h), p->payload);
      dropHello(h);
      return 0;
    }
    char* dst = inPayload ? h->payload + h->payloadGot : (char*)&h->msg + h->got;
    size_t want = inPayload ? p->payload - h->payloadGot : sizeof(h->msg) - h->got;
    ssize_t n = recv(h->fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
    if (n <= 0) {
      if (h->got == 0)
        WARN("bootstrap: root: connection from %s closed without a hello", helloName(h));
      else
        WARN("bootstrap: root refused connection from %s: truncated hello (%zu of %zu bytes%s%s)", helloName(h),
             h->got + h->payloadGot, sizeof(h->msg) + (p->direct ? p->payload : 0), n < 0 ? ", " : "",
             n < 0 ? strerror(errno) : "");
      dropHello(h);
      return 0;
    }
    if (inPayload) {
      h->payloadGot += (size_t)n;
      if (h->payloadGot < p->payload) continue;
      if (!acceptHello(r, p, h, fds, registered)) close(h->fd);
      free(h->payload);
      h->payload = NULL;
      return 0;
    }
    h->got += (size_t)n;
    if (h->got >= sizeof(uint32_t) && h->msg.magic != HELLO_MAGIC && h->msg.magic != ROOT_HELLO_MAGIC) {
      WARN("bootstrap: root refused connection from %s: not an ncclx bootstrap hello (first bytes 0x%08x)",
           helloName(h), (unsigned)h->msg.magic);
      close(h->fd);
      return 0;
    }
    if (h->got == sizeof(h->msg)) {
      if (h->msg.magic == ROOT_HELLO_MAGIC) {
        acceptRootHello(r, p, h, rootSeen, rootIn);
        close(h->fd);
      } else if (p->direct && p->payload > 0) {
        continue; /* the payload comes next */
      } else if (!acceptHello(r, p, h, fds, registered)) {
        close(h->fd);
      }
      return 0;
    }
  }
}
