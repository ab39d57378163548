/* Wait notes: ranks that disagree on a call in a way no message shows (one takes the LL board,
 * the other messages; one runs an all-reduce, the other a broadcast) each wait for the other.
 * Without notes both fail at the timeout blaming a live rank. A rank that has waited a while
 * tells the ranks it waits for which call it is in; a waiting rank compares the notes it has
 * with its own call and, when the same call differs, fails at once naming both calls. Nothing
 * is sent until a wait is long, so calls that progress pay nothing. */
#ifndef NCCLX_WAITNOTE_H
#define NCCLX_WAITNOTE_H

#include <stddef.h>

#include "comm/comm.h"

/* From a wait loop of comm's running call that has waited waitedSec for the ranks in
 * peers[0..n): sends notes once per call and peer, then compares the notes received. An error
 * (the comm failed) when a rank runs a different call under the same sequence number. */
ncclxResult_t waitNoteCheck(struct ncclxComm* comm, const int* peers, int n, double waitedSec);
/* Appends to buf (at len) what peer's latest note says, e.g. "; rank 1 said 3 s ago: in
 * broadcast #51 (4096 bytes per rank, ring/simple), waiting for rank 0". Returns the new length. */
size_t waitNoteDescribe(struct ncclxComm* comm, int peer, char* buf, size_t len, size_t size);
void waitNoteFree(struct ncclxComm* comm);

#endif
