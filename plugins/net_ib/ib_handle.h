/* What two net_ib endpoints tell each other before any RDMA traffic, as fixed-size
 * little-endian byte layouts with a checksum:
 *
 * - the listen handle (receiver -> core -> sender): nonce, the receiver's TCP side-channel
 *   address, and its port's identity (LID, GID, link layer, MTU) plus the QP count it wants;
 * - connection info (both ways over the side channel): nonce, LID/GID, QP numbers and PSNs;
 * - the ready word (sender -> receiver): the sender's QPs are ready to receive.
 *
 * Decoders reject anything truncated, corrupted, from another version or out of range, and
 * say why: a handle is bytes from elsewhere, never trusted as a struct. */
#ifndef NCCLX_IB_HANDLE_H
#define NCCLX_IB_HANDLE_H

#include "ib_common.h"

#define IB_HANDLE_BYTES 64
#define IB_CONNINFO_BYTES 128
#define IB_READY_BYTES 16
_Static_assert(IB_HANDLE_BYTES <= NCCLX_NET_HANDLE_MAXSIZE, "listen handle too large");

enum { IB_KIND_LISTEN = 1, IB_KIND_SENDER = 2, IB_KIND_RECEIVER = 3, IB_KIND_READY = 4 };

typedef struct {
  uint64_t nonce;
  int family;          /* 4 or 6: the side channel's address family */
  uint8_t addr[16];    /* IPv4 in the first 4 bytes, or IPv6; network order */
  uint16_t tcpPort;    /* host order */
  uint16_t lid;
  uint8_t gid[16];
  int linkLayer;       /* IB_LINK_IB or IB_LINK_ETH */
  int ibPort;          /* 1..255 */
  int mtu;             /* IB_MTU_MIN..IB_MTU_MAX */
  int nqps;            /* 1..IB_MAX_QPS: the receiver's qps_per_conn wins */
} ibListenInfo;

typedef struct {
  int kind;            /* IB_KIND_SENDER or IB_KIND_RECEIVER */
  uint64_t nonce;
  int linkLayer;
  int mtu;
  int nqps;
  uint16_t lid;
  uint8_t gid[16];
  uint32_t qpn[IB_MAX_QPS]; /* 24-bit */
  uint32_t psn[IB_MAX_QPS]; /* 24-bit */
  uint32_t depth;      /* requests in flight per comm; must be IB_QUEUE on both sides */
} ibConnInfo;

/* Encoders return the bytes written (fixed per kind), or 0 when len is too small or a field
 * is out of range. Decoders return NULL on success, else a reason for a log line. */
size_t ibHandleEncode(const ibListenInfo* in, void* buf, size_t len);
const char* ibHandleDecode(const void* buf, size_t len, ibListenInfo* out);

size_t ibConnInfoEncode(const ibConnInfo* in, void* buf, size_t len);
/* expectKind: the kind the caller waits for (a receiver reads IB_KIND_SENDER). */
const char* ibConnInfoDecode(const void* buf, size_t len, int expectKind, ibConnInfo* out);

size_t ibReadyEncode(uint64_t nonce, void* buf, size_t len);
const char* ibReadyDecode(const void* buf, size_t len, uint64_t nonce);

#endif
