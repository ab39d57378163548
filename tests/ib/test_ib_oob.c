/* The TCP side channel on 127.0.0.1: address choice, non-blocking connect/accept, exact-size
 * transfers that resume after partial progress, peer-closed detection, wire addresses. */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "ib_oob.h"
#include "ib_test.h"

#define DEADLINE_NS (10ull * 1000000000ull)

static void testPickAddr(void) {
  ibSockAddr a;
  char ifname[64], why[256];
  CHECK_MSG(ibOobPickAddr("lo", &a, ifname, sizeof(ifname), why, sizeof(why)) == 0, "%s", why);
  CHECK(a.sa.sa_family == AF_INET && strcmp(ifname, "lo") == 0);
  CHECK(ibOobPickAddr("no-such-if0", &a, ifname, sizeof(ifname), why, sizeof(why)) == -1);
  CHECK_MSG(strstr(why, "no-such-if0") != NULL, "%s", why);
  CHECK(ibOobPickAddr("", &a, ifname, sizeof(ifname), why, sizeof(why)) == 0);
  CHECK(ibOobPickAddr(NULL, &a, ifname, sizeof(ifname), why, sizeof(why)) == 0);
}

static void testWire(void) {
  ibSockAddr a, b;
  memset(&a, 0, sizeof(a));
  a.in4.sin_family = AF_INET;
  a.in4.sin_addr.s_addr = htonl(0x7f000001);
  a.in4.sin_port = htons(1234);
  int family;
  uint8_t raw[16];
  uint16_t port;
  ibOobToWire(&a, &family, raw, &port);
  CHECK(family == 4 && port == 1234 && raw[0] == 127 && raw[3] == 1 && raw[4] == 0);
  CHECK(ibOobFromWire(family, raw, port, &b) == 0 && memcmp(&a.in4, &b.in4, sizeof(a.in4)) == 0);
  char text[64];
  ibOobFormat(&b, text, sizeof(text));
  CHECK_MSG(strcmp(text, "127.0.0.1:1234") == 0, "%s", text);
  CHECK(ibOobFromWire(5, raw, port, &b) == -1 && ibOobFromWire(4, raw, 0, &b) == -1);
}

static void testExchange(void) {
  ibSockAddr local, bound;
  char ifname[64], why[256];
  CHECK(ibOobPickAddr("lo", &local, ifname, sizeof(ifname), why, sizeof(why)) == 0);
  int lfd = ibOobListen(&local, &bound);
  CHECK(lfd >= 0 && ntohs(bound.in4.sin_port) != 0);
  ibSockAddr peer;
  CHECK(ibOobAccept(lfd, &peer) == -1 && errno == EAGAIN); /* nobody yet, no blocking */

  int cfd = ibOobConnectStart(&bound);
  CHECK(cfd >= 0);
  int afd = -1, connected = 0;
  uint64_t t0 = ibNowNs();
  while ((afd < 0 || !connected) && ibNowNs() - t0 < DEADLINE_NS) {
    if (!connected) {
      int rc = ibOobConnectCheck(cfd);
      CHECK(rc >= 0);
      connected = rc == 1;
    }
    if (afd < 0) afd = ibOobAccept(lfd, &peer);
    poll(NULL, 0, 1);
  }
  CHECK(connected && afd >= 0);

  /* A message much larger than the socket buffers: both sides make partial progress in turn. */
  size_t len = 8 << 20;
  uint8_t* out = malloc(len);
  uint8_t* in = calloc(1, len);
  for (size_t i = 0; i < len; i++) out[i] = (uint8_t)(i * 131 + 7);
  size_t offOut = 0, offIn = 0;
  int sent = 0, recvd = 0, partial = 0;
  t0 = ibNowNs();
  while ((!sent || !recvd) && ibNowNs() - t0 < DEADLINE_NS) {
    if (!sent) {
      int rc = ibOobSend(cfd, out, len, &offOut);
      CHECK(rc >= 0);
      sent = rc == 1;
      partial += rc == 0;
    }
    if (!recvd) {
      int rc = ibOobRecv(afd, in, len, &offIn);
      CHECK(rc >= 0);
      recvd = rc == 1;
    }
  }
  CHECK(sent && recvd && offOut == len && offIn == len && memcmp(out, in, len) == 0);
  CHECK(partial > 0); /* the resume path was really taken */

  /* Idle and alive, then unexpected bytes, then closed. */
  CHECK(ibOobPeerState(afd) == 0);
  size_t off = 0;
  CHECK(ibOobSend(cfd, "x", 1, &off) == 1);
  t0 = ibNowNs();
  int st = 0;
  while ((st = ibOobPeerState(afd)) == 0 && ibNowNs() - t0 < DEADLINE_NS) poll(NULL, 0, 1);
  CHECK(st == 2);
  char x;
  off = 0;
  CHECK(ibOobRecv(afd, &x, 1, &off) == 1 && x == 'x');
  close(cfd);
  t0 = ibNowNs();
  while ((st = ibOobPeerState(afd)) == 0 && ibNowNs() - t0 < DEADLINE_NS) poll(NULL, 0, 1);
  CHECK(st == 1);
  off = 0;
  CHECK(ibOobRecv(afd, &x, 1, &off) == -1 && errno == ECONNRESET);
  off = 0;
  /* Writing to a closed peer fails instead of raising SIGPIPE. */
  int rc = 1;
  t0 = ibNowNs();
  while (rc >= 0 && ibNowNs() - t0 < DEADLINE_NS) {
    off = 0;
    rc = ibOobSend(afd, out, 65536, &off);
  }
  CHECK(rc == -1);
  close(afd);
  close(lfd);
  free(out);
  free(in);
}

static void testRefusedConnect(void) {
  /* A port nobody listens on: the connect fails without blocking. */
  ibSockAddr local, bound;
  char ifname[64], why[256];
  CHECK(ibOobPickAddr("lo", &local, ifname, sizeof(ifname), why, sizeof(why)) == 0);
  int lfd = ibOobListen(&local, &bound);
  close(lfd); /* the port is free again */
  int fd = ibOobConnectStart(&bound);
  int rc = fd < 0 ? -1 : 0;
  uint64_t t0 = ibNowNs();
  while (rc == 0 && ibNowNs() - t0 < DEADLINE_NS) {
    rc = ibOobConnectCheck(fd);
    if (rc == 0) poll(NULL, 0, 1);
  }
  CHECK(rc == -1);
  if (fd >= 0) close(fd);
}

static void testRandom(void) {
  uint64_t a = ibRandom64(), b = ibRandom64();
  CHECK(a != b);
  uint64_t t = ibNowNs();
  CHECK(t > 0 && ibNowNs() >= t);
}

int main(void) {
  testPickAddr();
  testWire();
  testExchange();
  testRefusedConnect();
  testRandom();
  return ibTestResult("test_ib_oob");
}
