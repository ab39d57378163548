/* Network connections between ranks, made on first use (or all at init when eager). */
#ifndef NCCLX_PEERS_H
#define NCCLX_PEERS_H

#include "comm.h"

/* Listen on the comm's net device and fill comm->peerInfo[rank].netHandle. */
ncclxResult_t peersListen(struct ncclxComm* comm);
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
#endif
