/* Constants shared by the parts of the ibverbs network (net_ib). The files named ib_*.c other
 * than ib_verbs.c, ib_conn.c, ib_data.c and ib_plugin.c never include <infiniband/verbs.h>:
 * they are the hardware-free logic that tests/ib checks on machines without an RDMA device. */
#ifndef NCCLX_IB_COMMON_H
#define NCCLX_IB_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "ncclx/net.h"

#define IB_MAX_QPS 8                       /* queue pairs per connection, upper bound */
#define IB_QUEUE NCCLX_NET_MAX_REQUESTS    /* requests in flight per comm = CTS ring depth */
#define IB_MAX_MESSAGE ((size_t)1 << 30)   /* one isend/irecv; must fit the 31-bit immediate */
#define IB_NAME_MAX 64

/* Link layers (ibv_port_attr.link_layer values mapped to our own, so logic stays verbs-free). */
enum { IB_LINK_UNKNOWN = 0, IB_LINK_IB = 1, IB_LINK_ETH = 2 };

/* Path MTU as the verbs enum (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5). */
enum { IB_MTU_MIN = 1, IB_MTU_MAX = 5 };

#endif
