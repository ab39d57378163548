/* Listen handle, connection info and ready word: round trips, and refusal of truncated,
 * corrupted and out-of-range records (forged with a valid checksum, so the field checks and
 * not only the checksum are exercised). */
#include <string.h>

#include "ib_handle.h"
#include "ib_test.h"

static uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

/* Re-seal a record after editing it, as a buggy or hostile peer would. */
static void reseal(uint8_t* p, size_t bytes) {
  uint32_t h = fnv1a(p, bytes - 4);
  for (int i = 0; i < 4; i++) p[bytes - 4 + i] = (uint8_t)(h >> (8 * i));
}

static ibListenInfo sampleListen(void) {
  ibListenInfo li;
  memset(&li, 0, sizeof(li));
  li.nonce = 0x0123456789abcdefull;
  li.family = 4;
  li.addr[0] = 10, li.addr[1] = 1, li.addr[2] = 2, li.addr[3] = 3;
  li.tcpPort = 40000;
  li.lid = 17;
  for (int i = 0; i < 16; i++) li.gid[i] = (uint8_t)(0xf0 + i);
  li.linkLayer = IB_LINK_ETH;
  li.ibPort = 1;
  li.mtu = 5;
  li.nqps = 4;
  return li;
}

static ibConnInfo sampleConn(int kind) {
  ibConnInfo ci;
  memset(&ci, 0, sizeof(ci));
  ci.kind = kind;
  ci.nonce = 42;
  ci.linkLayer = IB_LINK_IB;
  ci.mtu = 4;
  ci.nqps = 3;
  ci.lid = 0x1234;
  for (int i = 0; i < 16; i++) ci.gid[i] = (uint8_t)i;
  for (int i = 0; i < 3; i++) {
    ci.qpn[i] = 0x100 + (uint32_t)i;
    ci.psn[i] = 0xabcde0 + (uint32_t)i;
  }
  ci.depth = IB_QUEUE;
  return ci;
}

static void testListenHandle(void) {
  uint8_t buf[NCCLX_NET_HANDLE_MAXSIZE];
  ibListenInfo in = sampleListen(), out;
  CHECK(ibHandleEncode(&in, buf, 10) == 0); /* too small */
  CHECK(ibHandleEncode(&in, buf, sizeof(buf)) == IB_HANDLE_BYTES);
  memset(&out, 0, sizeof(out));
  const char* why = ibHandleDecode(buf, sizeof(buf), &out);
  CHECK_MSG(why == NULL, "%s", why);
  CHECK(memcmp(&in, &out, sizeof(in)) == 0);

  /* Truncated at every length. */
  for (size_t len = 0; len < IB_HANDLE_BYTES; len++) CHECK(ibHandleDecode(buf, len, NULL) != NULL);
  CHECK(ibHandleDecode(NULL, sizeof(buf), NULL) != NULL);
  /* Any flipped bit is caught. */
  for (size_t i = 0; i < IB_HANDLE_BYTES; i++) {
    for (int bit = 0; bit < 8; bit++) {
      uint8_t copy[NCCLX_NET_HANDLE_MAXSIZE];
      memcpy(copy, buf, sizeof(copy));
      copy[i] ^= (uint8_t)(1u << bit);
      CHECK_MSG(ibHandleDecode(copy, sizeof(copy), NULL) != NULL, "byte %zu bit %d", i, bit);
    }
  }
  /* Garbage: all zero, all 0xff, a connection-info record in place of a handle. */
  uint8_t junk[NCCLX_NET_HANDLE_MAXSIZE];
  memset(junk, 0, sizeof(junk));
  CHECK(ibHandleDecode(junk, sizeof(junk), NULL) != NULL);
  memset(junk, 0xff, sizeof(junk));
  CHECK(ibHandleDecode(junk, sizeof(junk), NULL) != NULL);
  uint8_t ci[IB_CONNINFO_BYTES];
  ibConnInfo c = sampleConn(IB_KIND_SENDER);
  CHECK(ibConnInfoEncode(&c, ci, sizeof(ci)) == IB_CONNINFO_BYTES);
  CHECK(ibHandleDecode(ci, sizeof(ci), NULL) != NULL);

  /* Forged records with a valid checksum but bad fields. */
  struct {
    size_t off;
    uint8_t value;
    const char* what;
  } forged[] = {{4, 2, "version"},  {5, IB_KIND_SENDER, "kind"}, {16, 5, "family"},
                {17, 9, "link layer"}, {18, 0, "port"},        {19, 0, "mtu low"},
                {19, 6, "mtu high"},    {56, 0, "nqps 0"},      {56, IB_MAX_QPS + 1, "nqps high"},
                {57, 1, "reserved"},    {30, 1, "IPv4 stray byte"}};
  for (size_t k = 0; k < sizeof(forged) / sizeof(forged[0]); k++) {
    uint8_t copy[NCCLX_NET_HANDLE_MAXSIZE];
    memcpy(copy, buf, sizeof(copy));
    copy[forged[k].off] = forged[k].value;
    reseal(copy, IB_HANDLE_BYTES);
    CHECK_MSG(ibHandleDecode(copy, sizeof(copy), NULL) != NULL, "forged %s accepted", forged[k].what);
  }
  uint8_t copy[NCCLX_NET_HANDLE_MAXSIZE];
  memcpy(copy, buf, sizeof(copy));
  copy[20] = copy[21] = 0; /* TCP port 0 */
  reseal(copy, IB_HANDLE_BYTES);
  CHECK(ibHandleDecode(copy, sizeof(copy), NULL) != NULL);

  /* Encoder refuses what the decoder would refuse. */
  ibListenInfo bad = in;
  bad.nqps = 0;
  CHECK(ibHandleEncode(&bad, buf, sizeof(buf)) == 0);
  bad = in;
  bad.family = 5;
  CHECK(ibHandleEncode(&bad, buf, sizeof(buf)) == 0);
  bad = in;
  bad.tcpPort = 0;
  CHECK(ibHandleEncode(&bad, buf, sizeof(buf)) == 0);

  /* IPv6 round trip. */
  in.family = 6;
  for (int i = 0; i < 16; i++) in.addr[i] = (uint8_t)(0x20 + i);
  CHECK(ibHandleEncode(&in, buf, sizeof(buf)) == IB_HANDLE_BYTES);
  CHECK(ibHandleDecode(buf, sizeof(buf), &out) == NULL && memcmp(&in, &out, sizeof(in)) == 0);
}

static void testConnInfo(void) {
  uint8_t buf[IB_CONNINFO_BYTES];
  ibConnInfo in = sampleConn(IB_KIND_RECEIVER), out;
  CHECK(ibConnInfoEncode(&in, buf, sizeof(buf) - 1) == 0);
  CHECK(ibConnInfoEncode(&in, buf, sizeof(buf)) == IB_CONNINFO_BYTES);
  memset(&out, 0, sizeof(out));
  const char* why = ibConnInfoDecode(buf, sizeof(buf), IB_KIND_RECEIVER, &out);
  CHECK_MSG(why == NULL, "%s", why);
  CHECK(memcmp(&in, &out, sizeof(in)) == 0);
  /* The other kind is refused: a receiver must not take a receiver's record. */
  CHECK(ibConnInfoDecode(buf, sizeof(buf), IB_KIND_SENDER, NULL) != NULL);
  for (size_t len = 0; len < IB_CONNINFO_BYTES; len++)
    CHECK(ibConnInfoDecode(buf, len, IB_KIND_RECEIVER, NULL) != NULL);
  for (size_t i = 0; i < IB_CONNINFO_BYTES; i++) {
    uint8_t copy[IB_CONNINFO_BYTES];
    memcpy(copy, buf, sizeof(copy));
    copy[i] ^= 0x40;
    CHECK_MSG(ibConnInfoDecode(copy, sizeof(copy), IB_KIND_RECEIVER, NULL) != NULL, "byte %zu", i);
  }
  struct {
    size_t off;
    uint32_t value;
    const char* what;
  } forged[] = {{40, 1, "qpn 1 (special QP)"},     {40, 0x1000000, "qpn 25 bits"},
                {72, 0x1000000, "psn 25 bits"},     {52, 7, "qpn in an unused entry"},
                {104, 16, "queue depth"},           {18, 0, "nqps 0"},
                {16, 3, "link layer"},              {110, 1, "reserved"}};
  for (size_t k = 0; k < sizeof(forged) / sizeof(forged[0]); k++) {
    uint8_t copy[IB_CONNINFO_BYTES];
    memcpy(copy, buf, sizeof(copy));
    if (forged[k].off == 18 || forged[k].off == 16) {
      copy[forged[k].off] = (uint8_t)forged[k].value;
    } else {
      for (int b = 0; b < 4; b++) copy[forged[k].off + (size_t)b] = (uint8_t)(forged[k].value >> (8 * b));
    }
    reseal(copy, IB_CONNINFO_BYTES);
    CHECK_MSG(ibConnInfoDecode(copy, sizeof(copy), IB_KIND_RECEIVER, NULL) != NULL,
              "forged %s accepted", forged[k].what);
  }
  ibConnInfo bad = in;
  bad.psn[0] = 0x1000000;
  CHECK(ibConnInfoEncode(&bad, buf, sizeof(buf)) == 0);
  bad = in;
  bad.kind = IB_KIND_LISTEN;
  CHECK(ibConnInfoEncode(&bad, buf, sizeof(buf)) == 0);
  /* Full QP count round trips. */
  in.nqps = IB_MAX_QPS;
  for (int i = 0; i < IB_MAX_QPS; i++) in.qpn[i] = 0xffffff - (uint32_t)i, in.psn[i] = (uint32_t)i;
  CHECK(ibConnInfoEncode(&in, buf, sizeof(buf)) == IB_CONNINFO_BYTES);
  CHECK(ibConnInfoDecode(buf, sizeof(buf), IB_KIND_RECEIVER, &out) == NULL &&
        memcmp(&in, &out, sizeof(in)) == 0);
}

static void testReady(void) {
  uint8_t buf[IB_READY_BYTES];
  CHECK(ibReadyEncode(0x1122334455667788ull, buf, sizeof(buf) - 1) == 0);
  CHECK(ibReadyEncode(0x1122334455667788ull, buf, sizeof(buf)) == IB_READY_BYTES);
  CHECK(ibReadyDecode(buf, sizeof(buf), 0x1122334455667788ull) == NULL);
  CHECK(ibReadyDecode(buf, sizeof(buf), 0x1122334455667789ull) != NULL); /* wrong nonce */
  CHECK(ibReadyDecode(buf, sizeof(buf) - 1, 0x1122334455667788ull) != NULL);
  buf[9] ^= 1;
  CHECK(ibReadyDecode(buf, sizeof(buf), 0x1122334455667788ull) != NULL);
}

int main(void) {
  testListenHandle();
  testConnInfo();
  testReady();
  return ibTestResult("test_ib_handle");
}
