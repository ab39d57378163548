/* Byte layouts of the listen handle, connection info and ready word (see ib_handle.h).
 *
 * Every record starts with {u32 magic, u8 version, u8 kind, u16 length} and ends with a
 * 32-bit FNV-1a checksum of everything before it. Reserved bytes must be zero. */
#include "ib_handle.h"

#include <string.h>

#define IB_WIRE_MAGIC 0x4249584eu /* "NXIB" */
#define IB_WIRE_VERSION 1

static void put16(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

static void putHeader(uint8_t* p, int kind, size_t bytes) {
  memset(p, 0, bytes);
  put32(p, IB_WIRE_MAGIC);
  p[4] = IB_WIRE_VERSION;
  p[5] = (uint8_t)kind;
  put16(p + 6, (uint16_t)bytes);
}

static void sealRecord(uint8_t* p, size_t bytes) { put32(p + bytes - 4, fnv1a(p, bytes - 4)); }

/* Checks the frame of a record of `bytes` bytes and kind `kind`. */
static const char* checkFrame(const uint8_t* p, size_t len, int kind, size_t bytes) {
  if (p == NULL) return "no data";
  if (len < 8) return "truncated (shorter than the record header)";
  if (get32(p) != IB_WIRE_MAGIC) return "bad magic (not a net_ib record)";
  if (p[4] != IB_WIRE_VERSION) return "unsupported version (a different ncclx net_ib build)";
  if (p[5] != kind) return "unexpected record kind";
  if (get16(p + 6) != bytes) return "unexpected record length";
  if (len < bytes) return "truncated";
  if (get32(p + bytes - 4) != fnv1a(p, bytes - 4)) return "checksum mismatch (corrupted)";
  return NULL;
}

static int allZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

static int linkOk(int ll) { return ll == IB_LINK_IB || ll == IB_LINK_ETH; }
static int mtuOk(int mtu) { return mtu >= IB_MTU_MIN && mtu <= IB_MTU_MAX; }
static int nqpsOk(int n) { return n >= 1 && n <= IB_MAX_QPS; }

/* Listen handle, 64 bytes:
 *  0 header | 8 nonce | 16 family, linkLayer, ibPort, mtu | 20 tcpPort | 22 lid
 * 24 addr[16] | 40 gid[16] | 56 nqps | 57..59 reserved | 60 checksum */
size_t ibHandleEncode(const ibListenInfo* in, void* buf, size_t len) {
  if (!in || !buf || len < IB_HANDLE_BYTES) return 0;
  if ((in->family != 4 && in->family != 6) || in->tcpPort == 0 || !linkOk(in->linkLayer) ||
      in->ibPort < 1 || in->ibPort > 255 || !mtuOk(in->mtu) || !nqpsOk(in->nqps))
    return 0;
  uint8_t* p = buf;
  putHeader(p, IB_KIND_LISTEN, IB_HANDLE_BYTES);
  put64(p + 8, in->nonce);
  p[16] = (uint8_t)in->family;
  p[17] = (uint8_t)in->linkLayer;
  p[18] = (uint8_t)in->ibPort;
  p[19] = (uint8_t)in->mtu;
  put16(p + 20, in->tcpPort);
  put16(p + 22, in->lid);
  memcpy(p + 24, in->addr, 16);
  memcpy(p + 40, in->gid, 16);
  p[56] = (uint8_t)in->nqps;
  sealRecord(p, IB_HANDLE_BYTES);
  return IB_HANDLE_BYTES;
}

const char* ibHandleDecode(const void* buf, size_t len, ibListenInfo* out) {
  const uint8_t* p = buf;
  const char* why = checkFrame(p, len, IB_KIND_LISTEN, IB_HANDLE_BYTES);
  if (why) return why;
  if (!allZero(p + 57, 3)) return "reserved bytes are not zero";
  ibListenInfo v;
  memset(&v, 0, sizeof(v));
  v.nonce = get64(p + 8);
  v.family = p[16];
  v.linkLayer = p[17];
  v.ibPort = p[18];
  v.mtu = p[19];
  v.tcpPort = get16(p + 20);
  v.lid = get16(p + 22);
  memcpy(v.addr, p + 24, 16);
  memcpy(v.gid, p + 40, 16);
  v.nqps = p[56];
  if (v.family != 4 && v.family != 6) return "bad address family";
  if (v.family == 4 && !allZero(v.addr + 4, 12)) return "IPv4 address with stray bytes";
  if (v.tcpPort == 0) return "TCP port 0";
  if (!linkOk(v.linkLayer)) return "unknown link layer";
  if (v.ibPort < 1) return "port 0";
  if (!mtuOk(v.mtu)) return "MTU out of range";
  if (!nqpsOk(v.nqps)) return "queue pair count out of range";
  if (out) *out = v;
  return NULL;
}

/* Connection info, 128 bytes:
 *  0 header | 8 nonce | 16 linkLayer, mtu, nqps, reserved | 20 lid | 22 reserved(2)
 * 24 gid[16] | 40 qpn[8] | 72 psn[8] | 104 depth | 108..123 reserved | 124 checksum */
size_t ibConnInfoEncode(const ibConnInfo* in, void* buf, size_t len) {
  if (!in || !buf || len < IB_CONNINFO_BYTES) return 0;
  if ((in->kind != IB_KIND_SENDER && in->kind != IB_KIND_RECEIVER) || !linkOk(in->linkLayer) ||
      !mtuOk(in->mtu) || !nqpsOk(in->nqps))
    return 0;
  uint8_t* p = buf;
  putHeader(p, in->kind, IB_CONNINFO_BYTES);
  put64(p + 8, in->nonce);
  p[16] = (uint8_t)in->linkLayer;
  p[17] = (uint8_t)in->mtu;
  p[18] = (uint8_t)in->nqps;
  put16(p + 20, in->lid);
  memcpy(p + 24, in->gid, 16);
  for (int i = 0; i < in->nqps; i++) {
    if (in->qpn[i] > 0xffffffu || in->psn[i] > 0xffffffu) return 0;
    put32(p + 40 + 4 * i, in->qpn[i]);
    put32(p + 72 + 4 * i, in->psn[i]);
  }
  put32(p + 104, in->depth);
  sealRecord(p, IB_CONNINFO_BYTES);
  return IB_CONNINFO_BYTES;
}

const char* ibConnInfoDecode(const void* buf, size_t len, int expectKind, ibConnInfo* out) {
  const uint8_t* p = buf;
  const char* why = checkFrame(p, len, expectKind, IB_CONNINFO_BYTES);
  if (why) return why;
  if (p[19] || p[22] || p[23] || !allZero(p + 108, 16)) return "reserved bytes are not zero";
  ibConnInfo v;
  memset(&v, 0, sizeof(v));
  v.kind = expectKind;
  v.nonce = get64(p + 8);
  v.linkLayer = p[16];
  v.mtu = p[17];
  v.nqps = p[18];
  v.lid = get16(p + 20);
  memcpy(v.gid, p + 24, 16);
  v.depth = get32(p + 104);
  if (!linkOk(v.linkLayer)) return "unknown link layer";
  if (!mtuOk(v.mtu)) return "MTU out of range";
  if (!nqpsOk(v.nqps)) return "queue pair count out of range";
  if (v.depth != IB_QUEUE) return "request queue depth differs (a different ncclx build)";
  for (int i = 0; i < IB_MAX_QPS; i++) {
    uint32_t qpn = get32(p + 40 + 4 * i), psn = get32(p + 72 + 4 * i);
    if (i >= v.nqps) {
      if (qpn || psn) return "data in unused queue pair entries";
      continue;
    }
    /* QPs 0 and 1 are the special management QPs; a data QP is never one of them. */
    if (qpn < 2 || qpn > 0xffffffu) return "queue pair number out of range";
    if (psn > 0xffffffu) return "packet sequence number out of range";
    v.qpn[i] = qpn;
    v.psn[i] = psn;
  }
  if (out) *out = v;
  return NULL;
}

/* Ready word, 16 bytes: 0 header | 8 low 32 bits of the nonce | 12 checksum. */
size_t ibReadyEncode(uint64_t nonce, void* buf, size_t len) {
  if (!buf || len < IB_READY_BYTES) return 0;
  uint8_t* p = buf;
  putHeader(p, IB_KIND_READY, IB_READY_BYTES);
  put32(p + 8, (uint32_t)nonce);
  sealRecord(p, IB_READY_BYTES);
  return IB_READY_BYTES;
}

const char* ibReadyDecode(const void* buf, size_t len, uint64_t nonce) {
  const uint8_t* p = buf;
  const char* why = checkFrame(p, len, IB_KIND_READY, IB_READY_BYTES);
  if (why) return why;
  if (get32(p + 8) != (uint32_t)nonce) return "wrong nonce";
  return NULL;
}
