/* A listener of the ofi plugin refuses senders that do not hold its handle.
 *
 *   ofi_stranger PLUGIN.so PROVIDER rdm|msg [DOMAIN]
 *
 * One process listens, then connects to itself: with a handle whose nonce is wrong (a
 * stranger, or a sender holding a stale handle: the listener must log a refusal and the
 * sender must get ncclxRemoteError, without any accepted comm), with a handle whose magic is
 * wrong (refused at once, no crash), with a closed listener's handle and one whose listener id
 * the process never had (both refused within 5 s), and with the real handle (must work end to
 * end).
 * Between the last two, a bare libfabric endpoint of this test (ofi_raw.c) sends the listener
 * connect messages no ncclx peer sends (0 or 9 endpoints, addresses cut short, another address
 * length, bytes of noise): nothing may be accepted, nothing may crash. In connected mode
 * (msg: the plugin's `endpoint_type`) those are connection requests from a bare FI_EP_MSG
 * endpoint (no, short, wrong-magic or noisy connection data: each must be rejected) and
 * bytes of noise written to the listener's port by a plain TCP socket. In both modes a
 * connect to a listener that was closed, or to a listener id the process never had, must be
 * refused (before, a reliable-datagram listener left such a message unanswered and the sender
 * waited until the core's timeout).
 * Exit 0 on success, 1 on failure, 77 when the provider is not available. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "netcheck_env.h"
#include "netcheck_util.h"
#include "ofi_internal.h"
#include "ofi_raw.h"

static const ncclxNet_v1_t* net;
static int failures;

static void check(int ok, const char* what) {
  printf("%s  %s\n", ok ? "PASS" : "FAIL", what);
  failures += !ok;
}

/* Drive connect (and accept, so the listener makes progress) until the connect finishes,
 * fails or 10 s pass. *accepted counts comms accept() handed out meanwhile. */
static ncclxResult_t connectLoop(void* ctx, void* lc, const void* handle, void** sc, int* accepted,
                                 void** rcOut) {
  double deadline = ncNow() + 10;
  *sc = NULL;
  while (ncNow() < deadline) {
    ncclxResult_t res = net->connect(ctx, 0, handle, sc);
    void* rc = NULL;
    if (net->accept(lc, &rc) != ncclxSuccess) return ncclxInternalError;
    if (rc) {
      (*accepted)++;
      if (rcOut)
        *rcOut = rc;
      else
        net->closeRecv(rc);
    }
    if (res != ncclxSuccess || *sc) return res;
    usleep(100);
  }
  return ncclxInProgress; /* still pending: not what any caller expects */
}

/* The listener makes progress only inside the plugin's calls: accept() drives it. */
typedef struct {
  void* lc;
  int accepted;
} listenerDrive;

static void driveListener(void* arg) {
  listenerDrive* l = arg;
  void* rc = NULL;
  if (net->accept(l->lc, &rc) == ncclxSuccess && rc) {
    l->accepted++;
    net->closeRecv(rc);
  }
}

/* Connect messages with the right listener id and nonce but a broken body. */
static void sendMalformed(const char* provider, const char* domain, void* lc, const char* handle) {
  ofiRaw raw;
  if (ofiRawOpen(&raw, provider, domain) != 0) {
    check(0, "a bare endpoint of the provider opens (for the malformed connect messages)");
    return;
  }
  ofiHandle h;
  memcpy(&h, handle, sizeof(h));
  uint64_t tag = OFI_CTRL_TAG(OFI_KIND_CONNECT, h.listenId);
  size_t head = offsetof(ofiConnectMsg, addr);
  listenerDrive l = {lc, 0};
  int sent = 0;
  for (int c = 0; c < 5; c++) {
    ofiConnectMsg m;
    memset(&m, 0, sizeof(m));
    m.magic = OFI_CONNECT_MAGIC;
    m.listenId = h.listenId;
    m.nonce = h.nonce;
    m.pendingId = 0x51000 + (uint32_t)c;
    m.addrLen = h.addrLen;
    m.neps = 1;
    memcpy(m.addr, h.addr, h.addrLen);
    size_t len = head + h.addrLen;
    if (c == 0) m.neps = 0;                             /* no endpoint */
    if (c == 1) m.neps = OFI_MAX_EPS + 1, len = sizeof(m); /* more than there can be */
    if (c == 2) m.neps = 3;                             /* says 3, carries 1 */
    if (c == 3) m.addrLen = (uint16_t)(h.addrLen + 8), len = head + m.addrLen;
    if (c == 4) memset(&m, 0xa5, sizeof(m)), len = sizeof(m); /* noise */
    sent += ofiRawSend(&raw, h.addr, &m, len, tag, 5.0, driveListener, &l) == 0;
  }
  double until = ncNow() + 0.5; /* let the listener read them all */
  while (ncNow() < until) driveListener(&l);
  ofiRawClose(&raw);
  check(sent == 5, "5 malformed connect messages reached the listener");
  check(l.accepted == 0, "malformed connect messages (0 or 9 endpoints, cut short, another "
                         "address length, noise) are refused: nothing accepted");
}

/* Connected mode: connection requests no ncclx peer makes, and TCP noise on the port. */
static void connectMalformed(const char* provider, const char* domain, void* lc, const char* handle) {
  ofiHandle h;
  memcpy(&h, handle, sizeof(h));
  listenerDrive l = {lc, 0};
  int rejected = 0;
  for (int c = 0; c < 4; c++) {
    ofiMsgConnData m = {.magic = OFI_MSG_CONNECT_MAGIC, .listenId = h.listenId, .nonce = h.nonce};
    size_t len = sizeof(m);
    if (c == 0) len = 0;                                   /* no connection data */
    if (c == 1) len = sizeof(m) - 4;                       /* cut short */
    if (c == 2) m.magic ^= 0x01010101u;                    /* not ours */
    if (c == 3) memset(&m, 0xa5, sizeof(m));               /* noise */
    rejected += ofiRawConnect(provider, domain, h.addr, &m, len, 5.0, driveListener, &l) == 1;
  }
  char noise[512];
  memset(noise, 0x5a, sizeof(noise));
  int wrote = ofiRawTcpNoise(h.addr, h.addrLen, noise, sizeof(noise)) == 0;
  double until = ncNow() + 0.5;
  while (ncNow() < until) driveListener(&l);
  check(rejected == 4, "4 malformed connection requests (no, short, wrong-magic, noisy data) "
                       "are rejected");
  check(wrote, "noise written to the listener's port by a plain TCP socket");
  check(l.accepted == 0, "nothing accepted for them");
}

int main(int argc, char** argv) {
  if (argc < 4 || (strcmp(argv[3], "rdm") != 0 && strcmp(argv[3], "msg") != 0)) {
    fprintf(stderr, "usage: %s PLUGIN.so PROVIDER rdm|msg [DOMAIN]\n", argv[0]);
    return 2;
  }
  int msg = strcmp(argv[3], "msg") == 0;
  const char* domain = argc > 4 ? argv[4] : NULL;
  char opt[256];
  snprintf(opt, sizeof(opt), "provider=%s", argv[2]);
  if (netcheckAddOption(opt) != 0) return 2;
  snprintf(opt, sizeof(opt), "endpoint_type=%s", argv[3]);
  if (netcheckAddOption(opt) != 0) return 2;
  if (domain) {
    snprintf(opt, sizeof(opt), "domain=%s", domain);
    if (netcheckAddOption(opt) != 0) return 2;
  }
  void* dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  net = dl ? dlsym(dl, NCCLX_NET_PLUGIN_SYMBOL) : NULL;
  if (!net) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  ncclxPluginEnv_t env;
  netcheckEnvFill(&env);
  void* ctx = NULL;
  if (net->init(&ctx, &env) != ncclxSuccess) {
    printf("SKIP: provider %s not available\n", argv[2]);
    return 77;
  }
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  check(net->listen(ctx, 0, handle, &lc) == ncclxSuccess && lc, "listen");

  /* A stranger: the right address and listener, the wrong nonce. */
  char bad[NCCLX_NET_HANDLE_MAXSIZE];
  memcpy(bad, handle, sizeof(bad));
  bad[offsetof(ofiHandle, nonce)] ^= 0x5a;
  void* sc = NULL;
  int accepted = 0;
  ncclxResult_t res = connectLoop(ctx, lc, bad, &sc, &accepted, NULL);
  check(res == ncclxRemoteError && !sc, "a wrong nonce is refused with ncclxRemoteError");
  check(accepted == 0, "the listener accepted nothing for it");
  if (sc) net->closeSend(sc);

  /* Not an ofi handle at all. */
  memcpy(bad, handle, sizeof(bad));
  bad[offsetof(ofiHandle, magic)] ^= 0x01;
  sc = NULL;
  res = net->connect(ctx, 0, bad, &sc);
  check(res == ncclxInternalError && !sc, "a handle with a wrong magic is refused at once");

  if (msg)
    connectMalformed(argv[2], domain, lc, handle);
  else
    sendMalformed(argv[2], domain, lc, handle);

  /* A closed listener's handle, and a listener id this process never had (the right
   * address and nonce): refused, not left waiting unanswered. */
  char closedHandle[NCCLX_NET_HANDLE_MAXSIZE];
  void* lc2 = NULL;
  check(net->listen(ctx, 0, closedHandle, &lc2) == ncclxSuccess && lc2, "a second listener");
  if (lc2) net->closeListen(lc2);
  ofiHandle unknown;
  memcpy(&unknown, handle, sizeof(unknown));
  unknown.listenId += 1000;
  memcpy(bad, handle, sizeof(bad));
  memcpy(bad, &unknown, sizeof(unknown));
  const struct {
    const char* h;
    const char* what;
  } gone[2] = {
      {closedHandle, "a connect to a closed listener is refused with ncclxRemoteError within 5 s"},
      {bad, "a connect to a listener id nobody has is refused with ncclxRemoteError within 5 s"}};
  for (int i = 0; i < 2; i++) {
    sc = NULL;
    accepted = 0;
    double t0 = ncNow();
    res = connectLoop(ctx, lc, gone[i].h, &sc, &accepted, NULL);
    check(res == ncclxRemoteError && !sc && accepted == 0 && ncNow() - t0 < 5.0, gone[i].what);
    if (sc) net->closeSend(sc);
  }

  /* The real handle still works, and the data arrives. */
  void* rc = NULL;
  accepted = 0;
  res = connectLoop(ctx, lc, handle, &sc, &accepted, &rc);
  double deadline = ncNow() + 10;
  while (res == ncclxSuccess && !rc && ncNow() < deadline) {
    if (net->accept(lc, &rc) != ncclxSuccess) break;
  }
  check(res == ncclxSuccess && sc && rc, "the real handle connects and is accepted");
  if (sc && rc) {
    char out[64] = "hello from the right sender", in[64] = "";
    void *sreq = NULL, *rreq = NULL, *buf = in;
    size_t size = sizeof(in), got = 0;
    int tag = 0, sdone = 0, rdone = 0;
    while (!rreq && ncNow() < deadline) net->irecv(rc, 1, &buf, &size, &tag, NULL, NULL, &rreq);
    while (!sreq && ncNow() < deadline) net->isend(sc, out, strlen(out) + 1, 0, NULL, NULL, &sreq);
    while ((!sdone || !rdone) && ncNow() < deadline) {
      if (!sdone && net->test(sreq, &sdone, NULL) != ncclxSuccess) break;
      if (!rdone && net->test(rreq, &rdone, &got) != ncclxSuccess) break;
    }
    check(sdone && rdone && got == strlen(out) + 1 && strcmp(in, out) == 0,
          "a message on the accepted connection arrives intact");
    net->closeSend(sc);
    net->closeRecv(rc);
  }
  net->closeListen(lc);
  check(net->finalize(ctx) == ncclxSuccess, "finalize");
  printf("ofi_stranger: %s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
