/* A call's way in (enqueue.c): the entry check every public call on a communicator makes,
 * and the calling thread's group. */
#ifndef NCCLX_ENQUEUE_H
#define NCCLX_ENQUEUE_H

#include "comm/comm.h"

/* Entry check of a public call on comm and stream: a live, healthy communicator and a valid
 * stream (NULL is valid); the message is prefixed with the function name fn. */
ncclxResult_t commCheckCall(struct ncclxComm* comm, ncclxStream_t stream, const char* fn);
/* The calling thread's ncclxGroupStart nesting depth (feature modules refuse some calls in a
 * group). */
int enqueueGroupDepth(void);

#endif
