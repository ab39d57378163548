/* bootstrapInit: the rendezvous at the unique id's root address, then the address all-gather.
 *
 * Multi-root (several ids, ncclxCommInitRankScalable): the ranks are cut into nIds contiguous
 * groups; group g says hello at id g, whose root is the group's first rank. Each root also
 * sends its bootstrap address to the roots g + 2^k (mod nIds) and gets those of g - 2^k on
 * the same rendezvous listener, then the roots all-gather their groups' addresses (a Bruck
 * all-gather over a view of the roots, ceil(log2 nIds) rounds) and answer their members.
 * A group's failure (a missing rank) rides along in that all-gather, so every root names it.
 *
 * Rendezvous: every rank sends one constant-size hello {rank, listener address, secret} to
 * the root (rank 0); when all have arrived the root answers each with the addresses of the
 * O(log n) ranks it sends to in a Bruck all-gather, never the whole table (that was O(n^2)
 * bytes at the root). A first contact per rank at the root is unavoidable with a single
 * rendezvous address; everything after it is O(log n) rounds, messages and connections per
 * rank (docs/init.md). A rank that never arrives is named by the root to every other rank.
 *
 * Direct answers: when the largest group's replies of the whole table fit DIRECT_MAX_BYTES,
 * members send their payload with the hello and the root's reply is the whole table (every
 * rank's address and payload): members skip the all-gather, 2 messages each. */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bootstrap_rdv.h"
#include "util/debug.h"

#define SWEEP_SEC 0.2 /* how often the root checks that joined ranks are still there */
/* Direct answers: when a root's group is small enough that sending each member the whole
 * table costs at most this many bytes (group size x nranks x slot), members send their
 * payload with the hello and get every rank's address and payload in the reply: no
 * all-gather rounds at all for members. Bigger groups use the Bruck all-gather, so no root
 * ever sends more than this (docs/init.md). */
#define DIRECT_MAX_BYTES ((size_t)4 << 20)

/* Multi-root: tell root g + 2^k our bootstrap address (it sends to us in the roots'
 * all-gather). One quick attempt; the caller retries while that root is not listening yet. */
static int sendRootHello(struct bootstrapRoot* r, const struct rdvPlan* p, int k) {
  int q = (p->group + (1 << k)) % p->nIds, err = 0;
  int fd = bsConnectWithin(&p->ids[q].root, bsNow() + 0.05, 0, NULL, &err);
  if (fd < 0) return err ? err : ECONNREFUSED;
  struct helloMsg m;
  memset(&m, 0, sizeof(m));
  m.magic = ROOT_HELLO_MAGIC;
  m.rank = r->rank;
  m.secret = r->secret;
  m.nranks = r->nranks;
  m.reserved = (uint32_t)p->group;
  m.listenAddr = r->addrs[r->rank];
  int e = bsSendAll(fd, &m, sizeof(m), bsNow() + 1.0);
  close(fd);
  if (e == 0) {
    r->stats.rdvMsgs++;
    r->stats.rdvBytes += sizeof(m);
    r->stats.rdvConns++;
  }
  return e < 0 ? ECONNRESET : e;
}

/* One root's part of the roots' all-gather: status, and its group's addresses. */
struct groupSlot {
  int32_t status;
  uint32_t count;
  char text[248];
  /* then count entries: an address (direct mode: the table's slots, address + payload) */
};

/* Multi-root: all-gather the groups' addresses among the roots (ceil(log2 nIds) rounds).
 * msg: in, this group's failure ("" if none); out, the first failure of any group. */
static ncclxResult_t exchangeAmongRoots(struct bootstrap* b, const struct rdvPlan* p, char* msg, size_t msgSize) {
  struct bootstrapRoot* r = b->root;
  int n = r->nranks, m = p->nIds, maxGroup = (n + m - 1) / m;
  size_t entry = p->direct ? p->slot : sizeof(struct wireAddr);
  size_t slot = sizeof(struct groupSlot) + entry * (size_t)maxGroup;
  char* all = calloc((size_t)m, slot);
  int* roots = malloc(sizeof(int) * (size_t)m);
  if (!all || !roots) {
    free(all);
    free(roots);
    snprintf(msg, msgSize, "root rank %d: out of memory for the roots' exchange", r->rank);
    return ncclxSetError(ncclxSystemError, "bootstrap: %s", msg);
  }
  for (int g = 0; g < m; g++) roots[g] = bootstrapIdRoot(g, m, n);
  struct groupSlot* mine = (struct groupSlot*)(all + slot * (size_t)p->group);
  mine->status = msg[0] ? ncclxRemoteError : ncclxSuccess;
  snprintf(mine->text, sizeof(mine->text), "%s", msg);
  mine->count = (uint32_t)(p->end - p->first);
  char* mineEntries = (char*)(mine + 1);
  if (p->direct)
    memcpy(mineEntries, p->table + p->slot * (size_t)p->first, p->slot * mine->count);
  else
    memcpy(mineEntries, &r->addrs[p->first], sizeof(struct wireAddr) * mine->count);

  struct bootstrap* v = NULL;
  ncclxResult_t res = bootstrapView(b, roots, m, p->group, ROOTS_TAG_SPACE, &v);
  /* A root that waited its whole timeout for a missing member still has to reach the others
   * with that news: give the exchange part of the grace the members wait for the verdict. */
  double saved = r->timeoutSec;
  if (r->timeoutSec > 0) r->timeoutSec += JOIN_GRACE_SEC / 2;
  if (res == ncclxSuccess) res = bootstrapAllGather(v, all, slot, TAG_ROOT_EXCHANGE);
  r->timeoutSec = saved;
  if (v) bootstrapRelease(v);
  if (res != ncclxSuccess) {
    if (!msg[0])
      snprintf(msg, msgSize, "the roots' exchange failed at root rank %d (ranks there are unique-id indices): %s",
               r->rank, ncclxThreadLastError());
    res = ncclxRemoteError;
  }
  for (int g = 0; g < m && res == ncclxSuccess; g++) {
    struct groupSlot* s = (struct groupSlot*)(all + slot * (size_t)g);
    int first = roots[g], end = g + 1 < m ? roots[g + 1] : n;
    s->text[sizeof(s->text) - 1] = '\0';
    if (s->status != ncclxSuccess) {
      if (!msg[0]) snprintf(msg, msgSize, "%s", s->text);
      res = ncclxRemoteError;
    } else if (s->count != (uint32_t)(end - first)) {
      snprintf(msg, msgSize, "root rank %d of unique id %d sent %u addresses for its %d ranks", first, g, s->count,
               end - first);
      res = ncclxRemoteError;
    } else if (g != p->group) {
      const char* entries = (const char*)(s + 1);
      for (int i = first; i < end; i++) {
        const char* e = entries + entry * (size_t)(i - first);
        memcpy(&r->addrs[i], e, sizeof(struct wireAddr));
        if (p->direct) memcpy(p->table + p->slot * (size_t)i, e, p->slot);
      }
    }
  }
  if (res == ncclxSuccess && msg[0]) res = ncclxRemoteError; /* our own group failed */
  free(all);
  free(roots);
  return res;
}

/* Rank 0 of an anonymous id whose address is taken: most likely the root of another job
 * started on the same NCCLX_COMM_ID. Tell that root (a hello as rank 0), so it admits
 * neither job's ranks, and fail. */
static ncclxResult_t announceSecondRoot(struct bootstrapRoot* r, const struct rdvPlan* p, const char* rootName) {
  int err = 0;
  int fd = bsConnectWithin(&p->ids[0].root, bsNow() + 1.0, 0, NULL, &err);
  if (fd >= 0) {
    struct helloMsg m;
    memset(&m, 0, sizeof(m));
    m.magic = HELLO_MAGIC;
    m.rank = 0;
    m.secret = r->secret;
    m.nranks = r->nranks;
    m.listenAddr = r->addrs[r->rank];
    (void)bsSendAll(fd, &m, sizeof(m), bsNow() + 1.0);
    close(fd);
  }
  return ncclxSetError(ncclxInvalidUsage,
                       "bootstrap: rank 0 cannot listen on the root address %s: another process holds it "
                       "(another job using the same NCCLX_COMM_ID?%s); give each job NCCLX_JOB_SECRET or "
                       "NCCLX_JOB_ID, or another address",
                       rootName, fd >= 0 ? " it was told, so it admits no rank of either job" : "");
}

/* The root of a group (rank 0 with a single id): collect the group's listener addresses on
 * the id's address, exchange with the other roots, then send each member the addresses of
 * its all-gather partners. */
static ncclxResult_t rendezvousServe(struct bootstrap* b, const struct rdvPlan* p, double deadline) {
  struct bootstrapRoot* r = b->root;
  const struct idLayout* id = &p->ids[p->group];
  char rootName[80];
  bsAddrString(&id->root, rootName, sizeof(rootName));
  int lfd = bsTakeKeptListener(id);
  int groupSize = p->end - p->first;
  if (groupSize == 1 && p->nIds == 1) {
    if (lfd >= 0) close(lfd);
    return ncclxSuccess;
  }
  if (lfd < 0) lfd = bsOpenListener(&id->root, 1, NULL);
  if (lfd < 0 && errno == EADDRINUSE && p->anonymous) return announceSecondRoot(r, p, rootName);
  if (lfd < 0 && errno == EADDRINUSE)
    return ncclxSetError(ncclxSystemError,
                         "bootstrap: rank %d cannot listen on the root address %s of unique id %d: another process "
                         "holds it (another job on the same NCCLX_COMM_ID, or a process left from an earlier run)",
                         r->rank, rootName, p->group);
  if (lfd < 0)
    return ncclxSetError(ncclxSystemError,
                         "bootstrap: rank %d cannot listen on the root address %s of unique id %d: %s (the root "
                         "rank of an id must run on the host it names / in the process that created it)",
                         r->rank, rootName, p->group, strerror(errno));
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: root rank %d listening at %s for ranks %d..%d (unique id %d of %d)", r->rank,
       rootName, p->first, p->end - 1, p->group, p->nIds);

  double start = bsNow();
  int* fds = malloc(sizeof(int) * (size_t)r->nranks);
  struct helloConn* pending = calloc(MAX_PENDING_HELLOS, sizeof(*pending));
  struct pollfd* pfds = calloc((size_t)groupSize + MAX_PENDING_HELLOS + 1, sizeof(*pfds));
  char rootSeen[32] = {0}, rootSent[32] = {0};
  int rootSendErr[32] = {0};
  if (!fds || !pending || !pfds) {
    free(fds);
    free(pending);
    free(pfds);
    close(lfd);
    return ncclxSetError(ncclxSystemError, "bootstrap: out of memory at the root");
  }
  for (int i = 0; i < r->nranks; i++) fds[i] = -1;
  int nPending = 0, registered = 1, rootIn = 0, rootOut = 0;

  double nextSweep = 0, graceEnd = 0, conflictEnd = 0;
  for (;;) {
    int complete = registered == groupSize && rootIn == p->nRootPeers && rootOut == p->nRootPeers;
    /* Anonymous ids: a complete group waits a moment more for a duplicate of another job. */
    if (complete && p->anonymous && graceEnd == 0) graceEnd = bsNow() + ANON_GRACE_SEC;
    /* After a conflict, linger a moment answering ranks still arriving (they fail at once
     * instead of at their timeout), until every member has heard. */
    if (r->conflict[0] && conflictEnd == 0) conflictEnd = bsNow() + CONFLICT_LINGER_SEC;
    int allTold = registered + r->rdvConflictTold >= groupSize;
    if (r->conflict[0] && (allTold || bsNow() >= conflictEnd)) break;
    if (bsNow() >= deadline || (!r->conflict[0] && complete && (!p->anonymous || bsNow() >= graceEnd))) break;
    for (int k = 0; k < p->nRootPeers; k++) {
      if (rootSent[k]) continue;
      rootSendErr[k] = sendRootHello(r, p, k);
      if (rootSendErr[k] == 0) rootSent[k] = 1, rootOut++;
    }
    /* Joined ranks are only watched (for departures) every SWEEP_SEC: polling all of them on
     * every wakeup would make the root's work per hello O(n), O(n^2) in total. */
    int sweep = bsNow() >= nextSweep;
    if (sweep) nextSweep = bsNow() + SWEEP_SEC;
    int np = 0;
    pfds[np++] = (struct pollfd){lfd, POLLIN, 0};
    for (int i = 0; i < nPending; i++) pfds[np++] = (struct pollfd){pending[i].fd, POLLIN, 0};
    for (int i = p->first + 1; sweep && i < p->end; i++)
      if (fds[i] >= 0) pfds[np++] = (struct pollfd){fds[i], POLLIN, 0};
    int slice = rootOut < p->nRootPeers ? POLL_SLICE_MS : POLL_SLICE_MS * 5;
    int ready = poll(pfds, (nfds_t)np, bsSliceUntil(deadline, slice));
    if (ready <= 0) {
      for (int i = 0; i < nPending; i++) pfds[1 + i].revents = 0;
      dropSilentPending(r, pending, pfds, &nPending);
      continue;
    }

    /* A joined rank must stay silent until it gets its reply: anything else means it left. */
    for (int i = p->first + 1, k = 1 + nPending; sweep && i < p->end; i++) {
      if (fds[i] < 0) continue;
      if (pfds[k++].revents) {
        char c;
        ssize_t n = recv(fds[i], &c, 1, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        char who[80];
        char note[160];
        snprintf(note, sizeof(note), "rank %d (%s) connected, then left before init completed (killed or exited?)",
                 i, bsAddrString(&r->addrs[i], who, sizeof(who)));
        WARN("bootstrap: %s", note);
        rdvNote(r, note);
        close(fds[i]);
        fds[i] = -1;
        registered--;
      }
    }
    dropSilentPending(r, pending, pfds, &nPending);
    for (int i = 0; i < nPending;) {
      if (pfds[1 + i].revents && !progressHello(r, p, &pending[i], fds, &registered, rootSeen, &rootIn)) {
        /* Handled: keep pfds aligned with pending by moving the tail entries down. */
        memmove(&pending[i], &pending[i + 1], sizeof(*pending) * (size_t)(nPending - i - 1));
        memmove(&pfds[1 + i], &pfds[2 + i], sizeof(*pfds) * (size_t)(nPending - i - 1));
        nPending--;
        continue;
      }
      i++;
    }
    if (pfds[0].revents) {
      for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(lfd, (struct sockaddr*)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        r->stats.rdvConns++;
        struct helloConn h = {.fd = fd, .since = bsNow()};
        if (nPending == MAX_PENDING_HELLOS) {
          /* Full of connections that say nothing: make room by dropping the oldest, so a
           * flood cannot keep a genuine rank (which says hello at once) out. */
          dropSilent(r, &pending[0], "it was the oldest of too many unidentified connections");
          memmove(&pending[0], &pending[1], sizeof(*pending) * (size_t)(nPending - 1));
          nPending--;
        }
        /* Read right away: a well-behaved rank has usually sent its hello already. */
        if (progressHello(r, p, &h, fds, &registered, rootSeen, &rootIn)) pending[nPending++] = h;
      }
    }
  }
  r->stats.tRootContact = bsNow();
  for (int i = 0; i < nPending; i++) {
    WARN("bootstrap: root dropped connection from %s: it never sent a complete hello (%zu of %zu bytes)",
         helloName(&pending[i]), pending[i].got, sizeof(pending[i].msg));
    dropHello(&pending[i]);
  }
  free(pending);
  free(pfds);
  close(lfd); /* the rendezvous is over: nothing may join this id any more */

  char msg[1024] = "";
  if (r->conflict[0]) {
    snprintf(msg, sizeof(msg), "%s", r->conflict);
  } else if (registered < groupSize) {
    char missing[256];
    describeMissing(fds, p->first, p->end, missing, sizeof(missing));
    if (r->rdvDroppedSilent) {
      char note[160];
      snprintf(note, sizeof(note), "the root dropped %d connections that sent no hello (flooded by something that "
               "is not a rank?)", r->rdvDroppedSilent);
      rdvNote(r, note);
    }
    if (p->nIds == 1 && r->rdvNotes[0])
      snprintf(msg, sizeof(msg), "%s did not join at the root %s within %g s: %s", missing, rootName, r->timeoutSec,
               r->rdvNotes);
    else if (p->nIds == 1)
      snprintf(msg, sizeof(msg), "%s never connected to the root %s within %g s%s", missing, rootName, r->timeoutSec,
               p->anonymous ? " (with no job identity, another job on this address may have met them)" : "");
    else
      snprintf(msg, sizeof(msg), "%s never connected to root rank %d (unique id %d of %d) at %s within %g s", missing,
               r->rank, p->group, p->nIds, rootName, r->timeoutSec);
  }
  for (int k = 0; k < p->nRootPeers && !msg[0]; k++) {
    int q = (p->group - (1 << k) + p->nIds) % p->nIds, to = (p->group + (1 << k)) % p->nIds;
    char addr[80];
    if (!rootSeen[k])
      snprintf(msg, sizeof(msg), "root rank %d (of unique id %d) never contacted root rank %d within %g s",
               bootstrapIdRoot(q, p->nIds, r->nranks), q, r->rank, r->timeoutSec);
    else if (!rootSent[k])
      snprintf(msg, sizeof(msg), "root rank %d could not reach root rank %d (of unique id %d) at %s within %g s: %s",
               r->rank, bootstrapIdRoot(to, p->nIds, r->nranks), to,
               bsAddrString(&p->ids[to].root, addr, sizeof(addr)), r->timeoutSec, strerror(rootSendErr[k]));
  }
  ncclxResult_t res = ncclxSuccess;
  /* Without every partner root's address the exchange cannot run: fail now, the others
   * time out in it and name us. */
  if (p->nIds > 1 && rootIn == p->nRootPeers && rootOut == p->nRootPeers)
    res = exchangeAmongRoots(b, p, msg, sizeof(msg));
  else if (msg[0])
    res = ncclxRemoteError;
  if (res != ncclxSuccess) {
    for (int i = p->first + 1; i < p->end; i++)
      if (fds[i] >= 0) sendTableError(fds[i], r->secret, ncclxRemoteError, msg);
    res = ncclxSetError(ncclxRemoteError, "bootstrap: %s", msg);
  } else {
    double sendDeadline = bsNow() + (r->timeoutSec > 0 ? r->timeoutSec : 30.0);
    for (int i = p->first + 1; i < p->end && res == ncclxSuccess; i++) {
      int e = p->direct ? sendTable(r, p, fds[i], sendDeadline) : sendPartners(r, fds[i], i, sendDeadline);
      if (e != 0)
        res = ncclxSetError(ncclxRemoteError, "bootstrap: root %s could not send rank %d its partner addresses: %s",
                            rootName, i, strerror(e));
    }
    r->stats.tReply = bsNow();
    if (res == ncclxSuccess)
      INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: ranks %d..%d joined at the root %s in %.3f s", p->first, p->end - 1,
           rootName, bsNow() - start);
  }
  for (int i = p->first + 1; i < p->end; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  return res;
}

/* Ranks > 0: say hello to the root and wait for the addresses of our all-gather partners. */
static ncclxResult_t rendezvousJoin(struct bootstrapRoot* r, const struct rdvPlan* p, double deadline) {
  const struct idLayout* id = &p->ids[p->group];
  char rootName[80];
  bsAddrString(&id->root, rootName, sizeof(rootName));
  int err = 0, attempts = 0;
  int fd = bsConnectWithin(&id->root, deadline, 1, &attempts, &err);
  if (fd < 0)
    return ncclxSetError(ncclxRemoteError,
                         "bootstrap: rank %d could not reach the root (rank %d, unique id %d of %d) at %s within %g s: %s",
                         r->rank, p->first, p->group, p->nIds, rootName, r->timeoutSec, strerror(err));
  r->stats.tRootContact = bsNow();
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: rank %d connected to the root %s (%d attempt%s)", r->rank, rootName,
       attempts, attempts == 1 ? "" : "s");

  struct helloMsg hello;
  memset(&hello, 0, sizeof(hello));
  hello.magic = HELLO_MAGIC;
  hello.rank = r->rank;
  hello.secret = r->secret;
  hello.nranks = r->nranks;
  hello.listenAddr = r->addrs[r->rank];
  ncclxResult_t res = ncclxSuccess;
  struct tableHeader h;
  int e = bsSendAll(fd, &hello, sizeof(hello), deadline);
  if (e == 0 && p->direct && p->payload)
    e = bsSendAll(fd, p->all + p->payload * (size_t)r->rank, p->payload, deadline);
  /* The root's verdict (e.g. which ranks are missing) is the better message: wait a bit for it. */
  double replyDeadline = deadline + JOIN_GRACE_SEC;
  if (e == 0) e = bsRecvAll(fd, &h, sizeof(h), replyDeadline);
  if (e == ETIMEDOUT) {
    res = ncclxSetError(ncclxRemoteError,
                        "bootstrap: rank %d got no reply from the root (rank %d) at %s within %g s (the root or "
                        "other ranks missing?)",
                        r->rank, p->first, rootName, r->timeoutSec);
  } else if (e != 0) {
    res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d lost the connection to the root at %s during init: %s",
                        r->rank, rootName, e < 0 ? "closed by the root" : strerror(e));
  } else if (h.magic != TABLE_MAGIC || h.secret != r->secret) {
    res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d got a reply from %s that is not from this job's root",
                        r->rank, rootName);
  } else if (h.status != ncclxSuccess) {
    char text[1024];
    size_t n = h.textLen < sizeof(text) - 1 ? h.textLen : sizeof(text) - 1;
    if (bsRecvAll(fd, text, n, bsNow() + 1.0) != 0) n = 0;
    text[n] = '\0';
    ncclxResult_t status = h.status > 0 && h.status < ncclxNumResults ? (ncclxResult_t)h.status : ncclxRemoteError;
    res = ncclxSetError(status, "bootstrap: rank %d: init failed at the root %s: %s", r->rank, rootName,
                        n ? text : "(no reason given)");
  } else if (p->direct && (h.nranks != r->nranks || h.count != (uint32_t)r->nranks || h.reserved != p->slot)) {
    res = ncclxSetError(ncclxInternalError,
                        "bootstrap: rank %d: root %s sent a table of %u slots of %u bytes for %d ranks, expected %d of %zu",
                        r->rank, rootName, h.count, h.reserved, h.nranks, r->nranks, p->slot);
  } else if (!p->direct && (h.nranks != r->nranks || h.count != (uint32_t)partnerCount(r->nranks))) {
    res = ncclxSetError(ncclxInternalError,
                        "bootstrap: rank %d: root %s sent %u partners for %d ranks, expected %d partners for %d ranks",
                        r->rank, rootName, h.count, h.nranks, partnerCount(r->nranks), r->nranks);
  } else {
    res = p->direct ? recvTable(r, p, fd, rootName, replyDeadline) : recvPartners(r, fd, h.count, rootName, replyDeadline);
    r->stats.tReply = bsNow();
  }
  r->stats.rdvMsgs += 2;
  r->stats.rdvBytes += sizeof(hello) + sizeof(h) +
                       (p->direct ? p->payload + (res == ncclxSuccess ? p->slot * (size_t)r->nranks : 0)
                                  : (res == ncclxSuccess ? h.count * sizeof(struct partnerEntry) : 0));
  r->stats.rdvConns++;
  close(fd);
  return res;
}

ncclxResult_t bootstrapInit(const ncclxUniqueId* id, int rank, int nranks, double timeoutSec,
                            struct bootstrap** out) {
  return bootstrapInitGather(id, rank, nranks, timeoutSec, NULL, 0, out);
}

/* The address all-gather, with the caller's payload riding along: slot = address + payload. */
static ncclxResult_t gatherAddresses(struct bootstrap* b, void* all, size_t size) {
  struct bootstrapRoot* r = b->root;
  size_t slot = sizeof(struct wireAddr) + size;
  if (size > (SIZE_MAX - sizeof(struct wireAddr)) / 2 || (size_t)r->nranks > SIZE_MAX / slot)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: %zu bytes x %d ranks overflows", size, r->nranks);
  char* buf = malloc(slot * (size_t)r->nranks);
  if (!buf) return ncclxSetError(ncclxSystemError, "bootstrap: out of memory for the address all-gather");
  char* mine = buf + slot * (size_t)r->rank;
  memcpy(mine, &r->addrs[r->rank], sizeof(struct wireAddr));
  if (size) memcpy(mine + sizeof(struct wireAddr), (char*)all + size * (size_t)r->rank, size);
  ncclxResult_t res = bootstrapAllGather(b, buf, slot, TAG_ADDR_GATHER);
  for (int i = 0; res == ncclxSuccess && i < r->nranks; i++) {
    const char* s = buf + slot * (size_t)i;
    struct wireAddr a;
    memcpy(&a, s, sizeof(a));
    if (a.family != AF_INET && a.family != AF_INET6)
      res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d: the address all-gather gave no address for rank %d",
                          r->rank, i);
    r->addrs[i] = a;
    if (size) memcpy((char*)all + size * (size_t)i, s + sizeof(a), size);
  }
  free(buf);
  return res;
}

ncclxResult_t bootstrapInitGather(const ncclxUniqueId* id, int rank, int nranks, double timeoutSec, void* all,
                                  size_t size, struct bootstrap** out) {
  return bootstrapInitScalable(id, 1, rank, nranks, timeoutSec, all, size, out);
}

ncclxResult_t bootstrapInitScalable(const ncclxUniqueId* ids, int nIds, int rank, int nranks, double timeoutSec,
                                    void* all, size_t size, struct bootstrap** out) {
  if (out == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap: output pointer is NULL");
  *out = NULL;
  if (ids == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap: unique id is NULL");
  if (all == NULL && size > 0) return ncclxSetError(ncclxInvalidArgument, "bootstrap: NULL all-gather buffer");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: rank %d is not in 0..%d (nranks %d)", rank, nranks - 1,
                         nranks);
  if (nIds < 1 || nIds > nranks)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: %d unique ids for %d ranks (need 1..nranks)", nIds, nranks);
  struct idLayout* l = calloc((size_t)nIds, sizeof(*l));
  if (!l) return ncclxSetError(ncclxSystemError, "bootstrap: out of memory for %d ids", nIds);
  for (int i = 0; i < nIds; i++)
    if (bsLoadId(&ids[i], &l[i]) != 0) {
      free(l);
      return ncclxSetError(ncclxInvalidArgument,
                           "bootstrap: unique id %d of %d is not valid (not made by ncclxGetUniqueId, or corrupted)",
                           i, nIds);
    }
  struct rdvPlan plan = {.nIds = nIds, .group = bootstrapIdGroup(rank, nIds, nranks), .ids = l, .payload = size,
                         .all = all, .anonymous = nIds == 1 && (l[0].flags & ID_FLAG_ANONYMOUS)};
  plan.first = bootstrapIdRoot(plan.group, nIds, nranks);
  plan.end = plan.group + 1 < nIds ? bootstrapIdRoot(plan.group + 1, nIds, nranks) : nranks;
  for (long d = 1; d < nIds; d <<= 1) plan.nRootPeers++;
  /* Every rank decides alike from (nranks, nIds, size): the largest group's table bytes. */
  plan.slot = sizeof(struct wireAddr) + size;
  size_t maxGroup = (size_t)(nranks + nIds - 1) / (size_t)nIds;
  plan.direct = size <= DIRECT_MAX_BYTES && (size_t)nranks <= DIRECT_MAX_BYTES / plan.slot / maxGroup;
  char* reply = NULL; /* a direct-mode root's reply: header, then the table */
  if (plan.direct && rank == plan.first) {
    if (!(reply = calloc(1, sizeof(struct tableHeader) + plan.slot * (size_t)nranks))) {
      free(l);
      return ncclxSetError(ncclxSystemError, "bootstrap: out of memory for the %d-rank table", nranks);
    }
    plan.table = reply + sizeof(struct tableHeader);
  }
  const struct idLayout* myId = &l[plan.group];
  uint64_t secret = nIds == 1 ? l[0].secret : bootstrapIdsSecret(ids, nIds);
  double start = bsNow(), deadline = bsDeadlineAfter(timeoutSec);
  char name[80];

  struct bootstrapRoot* r = bsRootCreate(rank, nranks, secret, timeoutSec);
  struct bootstrap* b = r ? bsViewAlloc(r, rank, nranks, ROOT_TAG_SPACE) : NULL;
  if (!b) {
    bsRootFree(r);
    free(l);
    free(reply);
    return ncclxSetError(ncclxSystemError, "bootstrap: out of memory for %d ranks", nranks);
  }
  /* Registered before the rendezvous: roots run their exchange over a view of this one. */
  for (int i = 0; i < nranks; i++) b->rootRanks[i] = i;
  r->refs = 1;
  r->views = b;
  r->stats.tStart = start;
  /* Listen where the others can reach us: on the interface that routes to our root. */
  struct wireAddr local;
  ncclxResult_t res = ncclxSuccess;
  if (bsIsLoopback(&myId->root)) {
    local = myId->root; /* a single-host job: stay on loopback */
    local.port = 0;
    if (local.family == AF_INET) memcpy(local.ip, (const uint8_t[4]){127, 0, 0, 1}, 4);
  } else if (bsLocalAddressToward(&myId->root, &local) != 0) {
    res = ncclxSetError(ncclxSystemError, "bootstrap: rank %d has no route to the root %s: %s", rank,
                        bsAddrString(&myId->root, name, sizeof(name)), strerror(errno));
  }
  if (res == ncclxSuccess) {
    r->listenFd = bsOpenListener(&local, 0, &r->addrs[rank]);
    if (r->listenFd < 0) {
      res = ncclxSetError(ncclxSystemError, "bootstrap: rank %d cannot listen on %s: %s", rank,
                          bsAddrString(&local, name, sizeof(name)), strerror(errno));
    } else {
      if (plan.table) { /* the root's own slot */
        memcpy(plan.table + plan.slot * (size_t)rank, &r->addrs[rank], sizeof(struct wireAddr));
        if (size) memcpy(plan.table + plan.slot * (size_t)rank + sizeof(struct wireAddr), (char*)all + size * (size_t)rank, size);
      }
      res = rank == plan.first ? rendezvousServe(b, &plan, deadline) : rendezvousJoin(r, &plan, deadline);
    }
  }
  char rootName[80];
  bsAddrString(&myId->root, rootName, sizeof(rootName));
  free(l);
  /* A direct-mode root now holds the whole table: hand the payloads to the caller. */
  for (int i = 0; res == ncclxSuccess && plan.table && size && i < nranks; i++)
    memcpy((char*)all + size * (size_t)i, plan.table + plan.slot * (size_t)i + sizeof(struct wireAddr), size);
  free(reply);
  if (res != ncclxSuccess) {
    bootstrapRelease(b);
    return res;
  }
  double gatherStart = bsNow();
  r->stats.rendezvousSec = gatherStart - start;
  /* Everyone now knows the ranks it sends to in a Bruck all-gather; one all-gather of the
   * addresses (O(log n) rounds and connections per rank) gives every rank the whole table.
   * Direct mode: the root's reply was the whole table already. */
  if (!plan.direct || nranks == 1) res = gatherAddresses(b, all, size);
  if (res != ncclxSuccess) {
    bootstrapRelease(b);
    return res;
  }
  r->stats.tReady = bsNow();
  r->stats.addrGatherSec = r->stats.tReady - gatherStart;
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: rank %d of %d ready, listening at %s (root %s, unique id %d of %d)", rank,
       nranks, bsAddrString(&r->addrs[rank], name, sizeof(name)), rootName, plan.group, nIds);
  *out = b;
  return ncclxSuccess;
}
