/* The transports of a communicator: the network from the plugin loader, and the built-in
 * shared-memory transport for peers on the same host. */
#ifndef NCCLX_TRANSPORT_H
#define NCCLX_TRANSPORT_H

#include "comm/comm.h"
#include "transport/socket/net_socket.h"

/* Acquire the network (and shared memory unless [core] shm = false), pick the device. */
ncclxResult_t transportsOpen(struct ncclxComm* comm);
void transportsClose(struct ncclxComm* comm);
/* Which transport carries traffic to `peer`: shared memory when both ranks enabled it and
 * run on the same host, else the network. Both ranks compute the same answer. */
int transportFor(const struct ncclxComm* comm, int peer);
#endif
