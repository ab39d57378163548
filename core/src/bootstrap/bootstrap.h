/* Bootstrap: rendezvous at the unique id's address, then out-of-band point-to-point
 * messages between ranks over TCP. Every connection starts with a magic number and the
 * job secret from the unique id; anything else is refused with a log line.
 *
 * Scaling (docs/init.md): the root handles one constant-size hello and one reply of
 * O(log n) addresses per rank; every other bootstrap exchange is O(log n) rounds, and no
 * rank opens more than O(log n) connections during init. Small groups (a root's replies of
 * the whole table within 4 MiB) get the whole table in the reply instead: no rounds.
 *
 * A bootstrap is shared by a communicator and the communicators split from it: a child
 * uses a view with its own rank map and tag space (bootstrapView). */
#ifndef NCCLX_BOOTSTRAP_H
#define NCCLX_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "ncclx.h"

struct bootstrap;

/* Fill an id: random 64-bit secret, and the root address (NCCLX_COMM_ID=host:port if set,
 * else this host's first non-loopback IPv4 address, or 127.0.0.1, on a free port that the
 * process keeps listening on until the root rank of that id initializes). */
ncclxResult_t bootstrapGetUniqueId(ncclxUniqueId* id);
/* Parse "host:port" (also "[v6]:port") into an id with a secret derived from the string,
 * so every rank computes the same id without communicating. */
ncclxResult_t bootstrapIdFromString(const char* hostport, ncclxUniqueId* id);
/* Secret carried in an id (the communicator hash of the root communicator derives from it). */
uint64_t bootstrapIdSecret(const ncclxUniqueId* id);

/* Collective over all nranks: rank 0 serves the id's address. Fails within timeoutSec
 * naming the ranks that never arrived (on rank 0) or the unreachable root (others). */
ncclxResult_t bootstrapInit(const ncclxUniqueId* id, int rank, int nranks, double timeoutSec,
                            struct bootstrap** out);
/* bootstrapInit that also all-gathers `size` bytes per rank (slot `rank` of `all` is this
 * rank's input) inside the address all-gather it does anyway: one O(log n) exchange instead
 * of two at communicator init. all may be NULL when size is 0. */
ncclxResult_t bootstrapInitGather(const ncclxUniqueId* id, int rank, int nranks, double timeoutSec, void* all,
                                  size_t size, struct bootstrap** out);
/* Multi-root init (ncclxCommInitRankScalable): ids[0..nIds-1], 1 <= nIds <= nranks, the
 * same on every rank. Rank r says hello only at ids[bootstrapIdGroup(r)]; the root of id g
 * is rank bootstrapIdRoot(g) (the first rank of group g) and must run where id g's address
 * is (for ids from ncclxGetUniqueId: in the process that created it). The roots exchange
 * their groups' addresses in ceil(log2 nIds) rounds, then answer their members as the single
 * root does. Busiest rank: O(nranks/nIds + log nranks) messages. nIds == 1 is bootstrapInitGather. */
ncclxResult_t bootstrapInitScalable(const ncclxUniqueId* ids, int nIds, int rank, int nranks, double timeoutSec,
                                    void* all, size_t size, struct bootstrap** out);
int bootstrapIdGroup(int rank, int nIds, int nranks); /* floor(rank * nIds / nranks) */
int bootstrapIdRoot(int g, int nIds, int nranks);     /* first rank of group g: ceil(g * nranks / nIds) */
/* Job secret of a list of ids (that of ids[0] when nIds == 1); 0 if one is invalid. */
uint64_t bootstrapIdsSecret(const ncclxUniqueId* ids, int nIds);
/* Parse "host:port,host:port,..." into *ids (malloc'ed, caller frees) and *nIds. */
ncclxResult_t bootstrapIdsFromString(const char* list, ncclxUniqueId** ids, int* nIds);
/* A child view over the ranks parentRanks[0..nranks-1] (indices in `parent`'s numbering);
 * `tagSpace` must be the same on all members and unique among views of the same root. */
ncclxResult_t bootstrapView(struct bootstrap* parent, const int* parentRanks, int nranks,
                            int myRank, uint64_t tagSpace, struct bootstrap** out);
void bootstrapRelease(struct bootstrap* b); /* views and root are reference counted */

int bootstrapRank(const struct bootstrap* b);
int bootstrapNranks(const struct bootstrap* b);

/* Reliable, ordered per (peer, tag). Send returns once the bytes are handed to the kernel;
 * recv waits for the matching (peer, tag), keeping other messages for later. Both give up
 * after the bootstrap's timeout or when *abortFlag (may be NULL) becomes non-zero. */
ncclxResult_t bootstrapSend(struct bootstrap* b, int peer, uint32_t tag, const void* data,
                            size_t size);
ncclxResult_t bootstrapRecv(struct bootstrap* b, int peer, uint32_t tag, void* data,
                            size_t size, volatile int* abortFlag);
/* all holds nranks slots of `size` bytes; slot `rank` is this rank's input. O(log n) rounds.
 * Tags 0xfffff000 and above are reserved for the bootstrap itself. */
ncclxResult_t bootstrapAllGather(struct bootstrap* b, void* all, size_t size, uint32_t tag);
ncclxResult_t bootstrapBarrier(struct bootstrap* b, uint32_t tag);

/* Fault path: tell every rank of this view that we are failing, with a message
 * (best effort, bounded by a short timeout). */
void bootstrapBroadcastAbort(struct bootstrap* b, const char* message);
/* Non-blocking: if an abort notice for this view has arrived, copy its text (from the
 * failing rank) into msg and return 1. Safe to call often from progress loops. */
int bootstrapPollAbort(struct bootstrap* b, char* msg, size_t msgSize);
/* Wait notes (waitnote.c): a small record for one peer, sent unordered; the peer keeps only
 * the latest from each rank. Send: 0 or an errno value, never an error recorded, at most
 * withinSec spent. Read: the bytes copied of the latest note from peer (0: none yet), and how
 * long ago it arrived. Read only sees what bootstrapPollAbort's progress took in. */
#define BOOTSTRAP_NOTE_MAX 256
int bootstrapSendNote(struct bootstrap* b, int peer, const void* note, size_t size, double withinSec);
size_t bootstrapReadNote(struct bootstrap* b, int peer, void* note, size_t size, double* ageSec);
/* File descriptor of the bootstrap listener, for poll() in the progress engine. */
int bootstrapPollFd(const struct bootstrap* b);

/* What this process's bootstrap did so far (all views of one bootstrapInit together), for
 * init benchmarks and the INFO line at init. "rdv" counts the rendezvous alone: on the root
 * it grows with n (one hello and one reply per rank), everywhere else it is 2. */
struct bootstrapStats {
  uint64_t msgsSent, msgsRecv;   /* point-to-point messages (abort notices included) */
  uint64_t bytesSent, bytesRecv; /* headers included */
  uint64_t connsOpened, connsAccepted;
  uint64_t rdvMsgs, rdvBytes, rdvConns; /* rendezvous: hellos + replies handled */
  double rendezvousSec, addrGatherSec; /* time in the rendezvous, then in the address all-gather */
  /* Phase timestamps (CLOCK_MONOTONIC seconds, system wide: comparable across processes and
   * network namespaces) for init benchmarks: bootstrap entered, connected to the root (on a
   * root: last member's hello in), partner list received (root: replies sent), all-gather done. */
  double tStart, tRootContact, tReply, tReady;
};
void bootstrapGetStats(struct bootstrap* b, struct bootstrapStats* out);

/* Host identity of this process, for peer info. */
const char* bootstrapHostname(void);
#endif
