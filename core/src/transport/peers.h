/* Network connections between ranks, made on first use (or all at init when eager). */
#ifndef NCCLX_PEERS_H
#define NCCLX_PEERS_H

#include "comm/comm.h"

/* Listen on the comm's transports and fill this rank's handles in comm->peerInfo. comm->commHash
 * must be set: incoming connections are filed by the hash their hello names. */
ncclxResult_t peersListen(struct ncclxComm* comm);
/* A split child: share the parent's listeners (same handles, no new listening sockets or shm
 * listeners) when both use the same transports, else listen anew. The listeners live until
 * the last communicator sharing them is closed, so the parent may be destroyed first. */
ncclxResult_t peersListenShared(struct ncclxComm* child, struct ncclxComm* parent);
/* Process-wide: listener sets opened so far, and still open (tests of the sharing). */
int peersListenersOpened(void);
int peersListenersLive(void);
/* Make sure send connections to sendPeers and receive connections from recvPeers exist.
 * Progresses connects and accepts together (none blocks), so two ranks that connect to
 * each other at the same time cannot deadlock. Bounded by comm->timeoutSec and abortFlag. */
ncclxResult_t peersEnsure(struct ncclxComm* comm, const int* sendPeers, int nsend,
                          const int* recvPeers, int nrecv);
/* Every peer in both directions (eager mode). */
ncclxResult_t peersConnectAll(struct ncclxComm* comm);
/* Close every connection and the listener. */
void peersClose(struct ncclxComm* comm);
/* Connections opened so far by this rank (both directions), for init benchmarks. */
int peersOpenCount(const struct ncclxComm* comm);

/* Whether this rank may read other ranks' memory directly: [net.shm] single_copy is not
 * "none" (the transport's mapped and CMA paths, the LL board's mapped broadcasts). */
int peersSingleCopyAllowed(void);
#endif
