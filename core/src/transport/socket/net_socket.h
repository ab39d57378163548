/* The built-in socket network ([net] plugin = socket): the net ABI over TCP, built into the
 * core from these files (or, with NCCLX_NET_SOCKET_STANDALONE, as a plugin). */
#ifndef NCCLX_NET_SOCKET_H
#define NCCLX_NET_SOCKET_H

#include "ncclx/net.h"

extern const ncclxNet_v1_t ncclxNetSocket;

#endif
