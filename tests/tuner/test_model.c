/* Unit test of the default tuner's cost model (core/src/tune_model.c, tune.c): the
 * calibration file (good, partial, each kind of bad line, missing, empty), [tuner] model
 * through the config, which link the model charges, the choices it makes on one host with
 * shared memory, the tool hooks of ncclx-perf --tune, and a tuner that tries to revive an
 * excluded entry. Files go to a fresh directory under /tmp; WARN lines are captured by
 * pointing stderr at a file. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll_ll.h"
#include "config/config.h"
#include "perf_hooks.h" /* with tune.h: the compiler checks that the prototypes agree */
#include "tune/tune.h"
#include "tune/tune_model.h"
#include "exec/xfer.h"
#include "util/host.h"

static int failures;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                     \
    }                                                                 \
  } while (0)

static char dir[] = "/tmp/ncclx-test-model-XXXXXX";

static const char* writeFile(const char* name, const char* text) {
  static char paths[16][256];
  static int next;
  char* path = paths[next++ % 16];
  snprintf(path, 256, "%s/%s", dir, name);
  FILE* f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  return path;
}

/* ---- stderr capture: the WARN lines of one call ---- */
static char captured[8192];
static int savedStderr = -1;

static void captureStart(void) {
  fflush(stderr);
  char path[300];
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  savedStderr = dup(2);
  dup2(fd, 2);
  close(fd);
}

static const char* captureEnd(void) {
  fflush(stderr);
  dup2(savedStderr, 2);
  close(savedStderr);
  char path[300];
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(captured, 1, sizeof captured - 1, f) : 0;
  captured[n] = '\0';
  if (f) fclose(f);
  return captured;
}

#define CHECK_HAS(text, needle)                                                               \
  do {                                                                                        \
    if (!strstr((text), (needle))) {                                                          \
      fprintf(stderr, "FAIL %s:%d: '%s' not in:\n%s\n", __FILE__, __LINE__, (needle), (text)); \
      failures++;                                                                             \
    }                                                                                         \
  } while (0)

static int sameModel(const TuneModel* a, const TuneModel* b) {
  return a->link[NCCLX_TP_SHM].alphaUs == b->link[NCCLX_TP_SHM].alphaUs &&
         a->link[NCCLX_TP_SHM].betaUsPerByte == b->link[NCCLX_TP_SHM].betaUsPerByte &&
         a->link[NCCLX_TP_NET].alphaUs == b->link[NCCLX_TP_NET].alphaUs &&
         a->link[NCCLX_TP_NET].betaUsPerByte == b->link[NCCLX_TP_NET].betaUsPerByte &&
         a->gammaUsPerByte == b->gammaUsPerByte;
}

static void testDefaults(void) {
  TuneModel d;
  tuneModelDefaults(&d);
  CHECK(d.link[NCCLX_TP_SHM].alphaUs > 0 && d.link[NCCLX_TP_SHM].betaUsPerByte > 0);
  CHECK(d.link[NCCLX_TP_NET].alphaUs > 0 && d.link[NCCLX_TP_NET].betaUsPerByte > 0);
  CHECK(d.gammaUsPerByte > 0);
  /* Same-host messages start faster than network ones: the point of two links. */
  CHECK(d.link[NCCLX_TP_SHM].alphaUs < d.link[NCCLX_TP_NET].alphaUs);
  CHECK(strcmp(d.source, "built-in") == 0);
}

static void testGoodFile(void) {
  const char* path = writeFile("good.conf",
                               "# written by hand\n"
                               "\n"
                               "shm.alpha_us = 0.75      ; inline comment\n"
                               "  shm.beta_us_per_byte=1e-4\n"
                               "NET.alpha_us = 30\n"
                               "net.beta_us_per_byte = 0.001\n"
                               "gamma_us_per_byte = 2.5e-5\n");
  TuneModel m;
  captureStart();
  int rc = tuneModelRead(path, &m);
  const char* err = captureEnd();
  CHECK(rc == 0);
  CHECK(err[0] == '\0');
  CHECK(m.link[NCCLX_TP_SHM].alphaUs == 0.75 && m.link[NCCLX_TP_SHM].betaUsPerByte == 1e-4);
  CHECK(m.link[NCCLX_TP_NET].alphaUs == 30 && m.link[NCCLX_TP_NET].betaUsPerByte == 0.001);
  CHECK(m.gammaUsPerByte == 2.5e-5);
  CHECK(strcmp(m.source, path) == 0);

  /* A file with some keys: the others keep the built-in values. */
  path = writeFile("partial.conf", "net.alpha_us = 40\n");
  TuneModel d;
  tuneModelDefaults(&d);
  CHECK(tuneModelRead(path, &m) == 0);
  CHECK(m.link[NCCLX_TP_NET].alphaUs == 40);
  CHECK(m.link[NCCLX_TP_SHM].alphaUs == d.link[NCCLX_TP_SHM].alphaUs);
  CHECK(m.gammaUsPerByte == d.gammaUsPerByte);
}

/* One bad line (at line 3 after two good ones): rejected whole, WARN names path:3. */
static void expectBad(const char* badLine, const char* reason) {
  char text[512];
  snprintf(text, sizeof text, "shm.alpha_us = 1\n# comment\n%s\ngamma_us_per_byte = 1e-5\n", badLine);
  const char* path = writeFile("bad.conf", text);
  TuneModel m, d;
  tuneModelDefaults(&d);
  captureStart();
  int rc = tuneModelRead(path, &m);
  const char* err = captureEnd();
  CHECK(rc == -1);
  CHECK(sameModel(&m, &d));
  char where[300];
  snprintf(where, sizeof where, "WARN tuner model: %s:3: ", path);
  CHECK_HAS(err, where);
  CHECK_HAS(err, reason);
  CHECK_HAS(err, "using the built-in constants");
}

static void testBadLines(void) {
  expectBad("shm.alpha_us 3", "is not 'key = value'");
  expectBad("shm.latency = 3", "unknown key 'shm.latency'");
  expectBad("net.alpha_us = fast", "is not a number");
  expectBad("net.alpha_us = -2", "is not a number in [0, 1e+06]");
  expectBad("net.beta_us_per_byte = 5", "is not a number in [0, 1]");
  expectBad("net.alpha_us = 1e999", "is not a number");
  expectBad("net.alpha_us =", "is not a number");
  expectBad("shm.alpha_us = 2", "is set twice (first on line 1)");
}

static void testMissingAndEmpty(void) {
  TuneModel m, d;
  tuneModelDefaults(&d);
  char path[300];
  snprintf(path, sizeof path, "%s/does-not-exist.conf", dir);
  captureStart();
  int rc = tuneModelRead(path, &m);
  const char* err = captureEnd();
  CHECK(rc == -1 && sameModel(&m, &d));
  CHECK_HAS(err, "cannot open");
  CHECK_HAS(err, "using the built-in constants");

  const char* empty = writeFile("empty.conf", "# nothing here\n\n");
  captureStart();
  rc = tuneModelRead(empty, &m);
  err = captureEnd();
  CHECK(rc == -1 && sameModel(&m, &d));
  CHECK_HAS(err, "no constants in the file");
}

/* [tuner] model through the config (NCCLX_TUNER_MODEL overrides the file). */
static void testConfigKey(void) {
  const char* ini = writeFile("empty.ini", "");
  setenv("NCCLX_CONF_FILE", ini, 1);
  const char* good = writeFile("env.conf", "shm.alpha_us = 0.5\n");
  setenv("NCCLX_TUNER_MODEL", good, 1);
  ncclxConfigReset();
  CHECK(ncclxConfigLoad() == ncclxSuccess);
  tuneModelReset();
  const TuneModel* m = tuneModelGet();
  CHECK(m->link[NCCLX_TP_SHM].alphaUs == 0.5);
  CHECK(strcmp(m->source, good) == 0);

  char missing[300];
  snprintf(missing, sizeof missing, "%s/missing.conf", dir);
  setenv("NCCLX_TUNER_MODEL", missing, 1);
  tuneModelReset();
  captureStart();
  m = tuneModelGet();
  const char* err = captureEnd();
  CHECK(strcmp(m->source, "built-in") == 0);
  CHECK_HAS(err, "WARN tuner model: cannot open");

  /* The key is known to the config validator (no "unknown key" warning). */
  const char* ini2 = writeFile("model.ini", "[tuner]\nmodel = /nonexistent/model.conf\n");
  setenv("NCCLX_CONF_FILE", ini2, 1);
  unsetenv("NCCLX_TUNER_MODEL");
  ncclxConfigReset();
  captureStart();
  ncclxResult_t res = ncclxConfigLoad();
  err = captureEnd();
  CHECK(res == ncclxSuccess);
  CHECK(strstr(err, "unknown key") == NULL);
  setenv("NCCLX_CONF_FILE", ini, 1);
  ncclxConfigReset();
  tuneModelReset();
}

/* ---- a communicator as tune.c sees it ---- */
static const ncclxNet_t fakeShm = {.name = "shm"};

static void fakeComm(struct ncclxComm* c, int nranks, int nhosts, int shm) {
  memset(c, 0, sizeof(*c));
  c->magic = NCCLX_COMM_MAGIC;
  c->nranks = nranks;
  c->nhosts = nhosts;
  c->ranksPerHostMax = (nranks + nhosts - 1) / nhosts;
  c->hostCpusMin = hostCpus();
  c->chunkBytes = 512 * 1024;
  c->maxMessageBytes = (size_t)1 << 30;
  if (shm) c->tp[NCCLX_TP_SHM].net = &fakeShm;
}

static int choose(struct ncclxComm* c, ncclxCollType_t coll, size_t count) {
  ncclxCollArgs a;
  memset(&a, 0, sizeof a);
  a.coll = coll;
  a.count = count;
  a.datatype = ncclxFloat32;
  a.op = ncclxSum;
  tuneSelect(c, &a);
  CHECK(collAlgoSupportedOn(c, coll, a.algo));
  CHECK(a.proto == NCCLX_PROTO_SIMPLE);
  return a.algo;
}

static void testTransport(void) {
  struct ncclxComm c;
  fakeComm(&c, 4, 1, 1);
  CHECK(tuneModelTransport(&c) == NCCLX_TP_SHM);
  fakeComm(&c, 4, 1, 0); /* [core] shm = false */
  CHECK(tuneModelTransport(&c) == NCCLX_TP_NET);
  fakeComm(&c, 4, 2, 1); /* two hosts: inter-host steps set the pace */
  CHECK(tuneModelTransport(&c) == NCCLX_TP_NET);
}

/* First power-of-two size at which allreduce on comm leaves recursive doubling. */
static size_t allreduceCrossover(struct ncclxComm* c) {
  for (size_t bytes = 8; bytes <= ((size_t)64 << 20); bytes *= 2)
    if (choose(c, NCCLX_COLL_ALLREDUCE, bytes / 4) != NCCLX_ALGO_RECURSIVE_DOUBLING) return bytes;
  return 0;
}

static void testShmChoices(void) {
  const TuneModel* m = tuneModelGet();
  CHECK(strcmp(m->source, "built-in") == 0);
  struct ncclxComm shm, net;
  fakeComm(&shm, 4, 1, 1);
  fakeComm(&net, 4, 1, 0);
  /* Small sizes on one host: latency-bound, so log-step algorithms, never a ring's p-1 steps. */
  for (size_t bytes = 8; bytes <= 1024; bytes *= 4) {
    CHECK(choose(&shm, NCCLX_COLL_ALLREDUCE, bytes / 4) == NCCLX_ALGO_RECURSIVE_DOUBLING);
    int ag = choose(&shm, NCCLX_COLL_ALLGATHER, bytes / 16);
    CHECK(ag == NCCLX_ALGO_RECURSIVE_DOUBLING || ag == NCCLX_ALGO_BRUCK);
    CHECK(choose(&shm, NCCLX_COLL_BROADCAST, bytes / 4) == NCCLX_ALGO_TREE);
  }
  /* The choice is the cheapest entry of the shm link's model. */
  for (size_t bytes = 8; bytes <= ((size_t)16 << 20); bytes *= 8) {
    int best = -1;
    double bestCost = 0;
    for (int a = 0; a < NCCLX_NUM_ALGOS; a++) {
      if (!collAlgoSupportedOn(&shm, NCCLX_COLL_ALLREDUCE, a)) continue;
      double cost = tuneModelCost(m, NCCLX_TP_SHM, NCCLX_COLL_ALLREDUCE, a, 4, (double)bytes,
                                  512.0 * 1024, !commRanksOwnCpus(&shm));
      if (cost >= 0 && (best < 0 || cost < bestCost)) best = a, bestCost = cost;
    }
    CHECK(choose(&shm, NCCLX_COLL_ALLREDUCE, bytes / 4) == best);
  }
  /* Cheap shm messages make bandwidth-optimal algorithms pay off at smaller sizes. */
  size_t xShm = allreduceCrossover(&shm), xNet = allreduceCrossover(&net);
  printf("allreduce on 4 ranks leaves recursive doubling at %zu B (shm), %zu B (net)\n", xShm, xNet);
  CHECK(xShm > 0 && xNet > 0 && xShm < xNet);
}

/* At 2 ranks on one host, ring and Rabenseifner all-reduce pay for the lines the peer copied
 * in their allgather step (tune_model.c): recursive doubling up to 512 KiB, not from 1 MiB.
 * Over the network the term does not apply. */
static void testTwoRankShmAllreduce(void) {
  const TuneModel* m = tuneModelGet();
  struct ncclxComm shm;
  fakeComm(&shm, 2, 1, 1);
  for (size_t bytes = (size_t)64 << 10; bytes <= ((size_t)512 << 10); bytes *= 2)
    CHECK(choose(&shm, NCCLX_COLL_ALLREDUCE, bytes / 4) == NCCLX_ALGO_RECURSIVE_DOUBLING);
  CHECK(allreduceCrossover(&shm) == ((size_t)1 << 20));
  double S = 256.0 * 1024, chunk = 512.0 * 1024, g = m->gammaUsPerByte;
  for (int tp = 0; tp < NCCLX_NUM_TP; tp++) {
    double rab2 = tuneModelCost(m, tp, NCCLX_COLL_ALLREDUCE, NCCLX_ALGO_RABENSEIFNER, 2, S, chunk, 0);
    double rabNoTerm = 2 * m->link[tp].alphaUs + S * m->link[tp].betaUsPerByte + 0.5 * S * g;
    double extra = tp == NCCLX_TP_SHM ? S * g : 0;
    CHECK(fabs(rab2 - rabNoTerm - extra) < 1e-6 * rab2);
  }
}

/* The LL protocol enters the table as (linear, ll) where it can run: one host, shared memory
 * with every rank, at most ll_max_bytes (4096 by default) contributed per rank. */
static void testLLChoices(void) {
  struct ncclxPeerInfo info[4];
  memset(info, 0, sizeof info);
  for (int r = 0; r < 4; r++) info[r].shmEnabled = 1;
  struct ncclxComm c, twoHosts, noShm;
  fakeComm(&c, 4, 1, 1);
  fakeComm(&twoHosts, 4, 2, 1);
  fakeComm(&noShm, 4, 1, 1);
  c.peerInfo = twoHosts.peerInfo = noShm.peerInfo = info;
  CHECK(collLLMaxBytes() == 4096);
  CHECK(collLLRunnable(&c, NCCLX_COLL_ALLREDUCE, 4096));
  CHECK(!collLLRunnable(&c, NCCLX_COLL_ALLREDUCE, 4100));
  CHECK(collLLRunnable(&c, NCCLX_COLL_ALLGATHER, 4 * 4096)); /* 4096 per rank */
  CHECK(!collLLRunnable(&c, NCCLX_COLL_ALLTOALLV, 64));
  CHECK(collLLRunnable(&c, NCCLX_COLL_BARRIER, 0));
  CHECK(!collLLRunnable(&twoHosts, NCCLX_COLL_ALLREDUCE, 64));
  ncclxCollArgs a;
  memset(&a, 0, sizeof a);
  a.coll = NCCLX_COLL_ALLREDUCE, a.count = 2, a.datatype = ncclxFloat32, a.op = ncclxSum;
  tuneSelect(&c, &a);
  CHECK(a.algo == NCCLX_ALGO_LINEAR && a.proto == NCCLX_PROTO_LL);
  a.count = 1 << 20; /* 4 MiB: far beyond LL */
  tuneSelect(&c, &a);
  CHECK(a.proto == NCCLX_PROTO_SIMPLE && collAlgoSupportedOn(&c, a.coll, a.algo));
  info[2].shmEnabled = 0; /* one rank without shared memory: nobody uses the board */
  CHECK(!collLLRunnable(&noShm, NCCLX_COLL_ALLREDUCE, 64));
}

/* Peer info of up to 8 ranks that all have shared memory (the board can run). */
static struct ncclxPeerInfo* shmPeers(void) {
  static struct ncclxPeerInfo info[8];
  memset(info, 0, sizeof info);
  for (int r = 0; r < 8; r++) info[r].shmEnabled = 1;
  return info;
}

/* The call goes (linear, ll) on `ll` and the simple protocol on `simple`. */
static void checkLLThenSimple(struct ncclxComm* ll, struct ncclxComm* simple, ncclxCollArgs* a) {
  tuneSelect(ll, a);
  CHECK(a->algo == NCCLX_ALGO_LINEAR && a->proto == NCCLX_PROTO_LL);
  tuneSelect(simple, a);
  CHECK(a->proto == NCCLX_PROTO_SIMPLE);
}

/* Broadcasts beyond one round of the board's lines (a whole bank: 4 x 86 lines x 48 bytes at
 * 4 ranks) run at any size through the bulk area, in rounds of a whole bulk bank (4 x 256 KiB
 * at 4 ranks). Chosen when ranks share CPUs (n + 1 copies against 2 (n - 1) + 1), and with a
 * CPU per rank only from 1 MiB on. */
static void testLLBroadcastRounds(void) {
  struct ncclxPeerInfo* info = shmPeers();
  struct ncclxComm four, eightShared, eightOwn, fourShared, twoOwn;
  fakeComm(&four, 4, 1, 1);
  fakeComm(&fourShared, 4, 1, 1);
  fakeComm(&eightShared, 8, 1, 1);
  fakeComm(&eightOwn, 8, 1, 1);
  fakeComm(&twoOwn, 2, 1, 1);
  four.peerInfo = fourShared.peerInfo = eightShared.peerInfo = eightOwn.peerInfo = twoOwn.peerInfo = info;
  size_t lines = 4 * 86 * 48, bulk = (size_t)4 << 20;
  CHECK(collLLRunnable(&four, NCCLX_COLL_BROADCAST, (size_t)64 << 20));
  CHECK(collLLRounds(&four, NCCLX_COLL_BROADCAST, lines) == 1);
  CHECK(collLLLineRound(&four, NCCLX_COLL_BROADCAST, lines));
  CHECK(collLLRounds(&four, NCCLX_COLL_BROADCAST, lines + 1) == 1);
  CHECK(!collLLLineRound(&four, NCCLX_COLL_BROADCAST, lines + 1));
  CHECK(collLLRounds(&four, NCCLX_COLL_BROADCAST, bulk / 4) == 1);
  CHECK(collLLRounds(&four, NCCLX_COLL_BROADCAST, bulk / 4 + 1) == 2);
  CHECK(collLLRounds(&four, NCCLX_COLL_ALLREDUCE, 4096) == 1);
  int cpus = hostCpus();
  fourShared.ranksPerHostMax = eightShared.ranksPerHostMax = cpus + 1; /* more ranks than CPUs */
  eightOwn.ranksPerHostMax = twoOwn.ranksPerHostMax = 1;
  ncclxCollArgs a;
  memset(&a, 0, sizeof a);
  a.coll = NCCLX_COLL_BROADCAST, a.count = 1 << 17, a.datatype = ncclxFloat32; /* 512 KiB */
  checkLLThenSimple(&eightShared, &eightOwn, &a);
  checkLLThenSimple(&fourShared, &twoOwn, &a);
  a.count = 1 << 18; /* 1 MiB: the board from here on with a CPU per rank too */
  tuneSelect(&twoOwn, &a);
  CHECK(a.algo == NCCLX_ALGO_LINEAR && a.proto == NCCLX_PROTO_LL);
  tuneSelect(&eightOwn, &a);
  CHECK(a.algo == NCCLX_ALGO_LINEAR && a.proto == NCCLX_PROTO_LL);
}

/* All-gathers whose blocks outgrow a line region (4096 bytes by default) go through the
 * board's bulk regions (128 KiB per rank at 8 ranks) in rounds, at any size; chosen when
 * ranks share CPUs (n copies of every byte against the ring's 2 (n - 1)); the linear
 * all-gather takes over only up to 4 ranks (tune_model.c); left to the simple protocol with a
 * CPU per rank. */
static void testLLAllgatherBulk(void) {
  struct ncclxPeerInfo* info = shmPeers();
  struct ncclxComm shared, own, twoHosts;
  fakeComm(&shared, 8, 1, 1);
  fakeComm(&own, 8, 1, 1);
  fakeComm(&twoHosts, 8, 2, 1);
  shared.peerInfo = own.peerInfo = twoHosts.peerInfo = info;
  shared.ranksPerHostMax = hostCpus() + 1;
  own.ranksPerHostMax = 1;
  size_t bulk = (size_t)128 << 10;
  CHECK(collLLRunnable(&shared, NCCLX_COLL_ALLGATHER, (size_t)64 << 20));
  CHECK(!collLLRunnable(&twoHosts, NCCLX_COLL_ALLGATHER, (size_t)64 << 20));
  CHECK(collLLLineRound(&shared, NCCLX_COLL_ALLGATHER, 8 * 4096));
  CHECK(!collLLLineRound(&shared, NCCLX_COLL_ALLGATHER, 8 * 8192));
  CHECK(collLLRounds(&shared, NCCLX_COLL_ALLGATHER, 8 * 8192) == 1);
  CHECK(collLLRounds(&shared, NCCLX_COLL_ALLGATHER, 8 * bulk) == 1);
  CHECK(collLLRounds(&shared, NCCLX_COLL_ALLGATHER, 8 * (bulk + 4)) == 2);
  ncclxCollArgs a;
  memset(&a, 0, sizeof a);
  a.coll = NCCLX_COLL_ALLGATHER, a.datatype = ncclxFloat32;
  for (size_t count = 2048; count <= ((size_t)1 << 20); count *= 4) { /* 64 KiB .. 32 MiB */
    a.count = count;
    checkLLThenSimple(&shared, &own, &a);
  }
}

/* Whether ranks share CPUs comes from the communicator (the fewest CPUs of any rank, from the
 * peer info), not from this process's affinity: ranks pinned differently must still choose
 * the same protocol, or each waits for the other's. */
static void testSharedCpusFromComm(void) {
  struct ncclxPeerInfo* info = shmPeers();
  struct ncclxComm few, many;
  fakeComm(&few, 4, 1, 1);
  fakeComm(&many, 4, 1, 1);
  few.peerInfo = many.peerInfo = info;
  few.hostCpusMin = 2;    /* 4 ranks on 2 CPUs */
  many.hostCpusMin = 512; /* a CPU per rank, whatever this machine has */
  ncclxCollArgs a;
  memset(&a, 0, sizeof a);
  a.coll = NCCLX_COLL_ALLGATHER, a.count = 1 << 16, a.datatype = ncclxFloat32; /* 256 KiB per rank */
  tuneSelect(&few, &a); /* sharing CPUs: the linear all-gather */
  CHECK(a.algo == NCCLX_ALGO_LINEAR && a.proto == NCCLX_PROTO_SIMPLE);
  tuneSelect(&many, &a);
  CHECK(a.algo != NCCLX_ALGO_LINEAR && a.proto == NCCLX_PROTO_SIMPLE);
  /* All-to-all: linear's exchanges all stand open, so it wins when ranks share CPUs; with a
   * CPU each, pairwise's bytes are cheaper (tuneModelCost). */
  for (size_t count = 1 << 16; count <= (1 << 20); count *= 4) {
    CHECK(choose(&few, NCCLX_COLL_ALLTOALL, count) == NCCLX_ALGO_LINEAR);
    CHECK(choose(&many, NCCLX_COLL_ALLTOALL, count) == NCCLX_ALGO_PAIRWISE);
  }
}

static void testToolHooks(void) {
  struct ncclxComm c;
  fakeComm(&c, 3, 1, 1);
  CHECK(ncclxTuneToolAlgoSupported(&c, NCCLX_COLL_ALLREDUCE, NCCLX_ALGO_RING));
  CHECK(!ncclxTuneToolAlgoSupported(&c, NCCLX_COLL_ALLGATHER, NCCLX_ALGO_RECURSIVE_DOUBLING));
  CHECK(!ncclxTuneToolAlgoSupported(&c, NCCLX_COLL_ALLREDUCE, NCCLX_ALGO_HIERARCHICAL));
  CHECK(!ncclxTuneToolAlgoSupported(&c, 99, 0));
  CHECK(!ncclxTuneToolAlgoSupported(NULL, NCCLX_COLL_ALLREDUCE, NCCLX_ALGO_RING));
  CHECK(ncclxTuneToolForceAlgo(NCCLX_NUM_COLLS, 0) == -1);
  CHECK(ncclxTuneToolForceAlgo(NCCLX_COLL_ALLREDUCE, NCCLX_NUM_ALGOS) == -1);
  int before = choose(&c, NCCLX_COLL_ALLREDUCE, 2);
  int other = before == NCCLX_ALGO_RING ? NCCLX_ALGO_TREE : NCCLX_ALGO_RING;
  CHECK(ncclxTuneToolForceAlgo(NCCLX_COLL_ALLREDUCE, other) == 0);
  CHECK(choose(&c, NCCLX_COLL_ALLREDUCE, 2) == other);
  CHECK(choose(&c, NCCLX_COLL_ALLGATHER, 2) != -1); /* other collectives untouched */
  /* One that cannot run here is ignored, not obeyed. */
  CHECK(ncclxTuneToolForceAlgo(NCCLX_COLL_ALLGATHER, NCCLX_ALGO_RECURSIVE_DOUBLING) == 0);
  CHECK(choose(&c, NCCLX_COLL_ALLGATHER, 2) != NCCLX_ALGO_RECURSIVE_DOUBLING);
  CHECK(ncclxTuneToolForceAlgo(NCCLX_COLL_ALLGATHER, -1) == 0);
  CHECK(ncclxTuneToolForceAlgo(NCCLX_COLL_ALLREDUCE, -1) == 0);
  CHECK(choose(&c, NCCLX_COLL_ALLREDUCE, 2) == before);

  int nhosts = 0, tp = -1;
  const char* tuner = "x";
  CHECK(ncclxTuneToolCommTopo(&c, &nhosts, &tp, NULL, &tuner) == 0);
  CHECK(nhosts == 1 && tp == PERF_TP_SHM && tuner == NULL);
  CHECK(ncclxTuneToolCommTopo(NULL, &nhosts, NULL, NULL, NULL) == -1);

  float dst[5] = {1, 2, 3, 4, 5}, src[5] = {1, 1, 1, 1, 1};
  ncclxTuneToolReduce(dst, src, 5, ncclxFloat32);
  CHECK(dst[0] == 2 && dst[4] == 6);
}

/* A tuner that forces tree, and writes a cost into an entry the core excluded. */
static ncclxResult_t reviving(void* ctx, const ncclxTunerQuery_v1_t* q, float* table,
                              size_t* chunk, int* channels) {
  (void)ctx, (void)q, (void)chunk, (void)channels;
  table[NCCLX_ALGO_HIERARCHICAL * NCCLX_NUM_PROTOS + NCCLX_PROTO_SIMPLE] = 0.0f;
  table[NCCLX_ALGO_TREE * NCCLX_NUM_PROTOS + NCCLX_PROTO_LL] = 0.0f;
  table[NCCLX_ALGO_TREE * NCCLX_NUM_PROTOS + NCCLX_PROTO_SIMPLE] = 0.5f;
  return ncclxSuccess;
}
static ncclxResult_t failing(void* ctx, const ncclxTunerQuery_v1_t* q, float* table,
                             size_t* chunk, int* channels) {
  (void)ctx, (void)q, (void)chunk, (void)channels;
  for (int i = 0; i < NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS; i++) table[i] = 0.0f;
  return ncclxInternalError;
}

static void testTunerMasking(void) {
  struct ncclxComm c;
  fakeComm(&c, 4, 1, 1);
  int dflt = choose(&c, NCCLX_COLL_ALLREDUCE, 1 << 20);
  static const ncclxTuner_t revive = {.name = "revive", .abiVersion = 1, .getCollInfo = reviving};
  static const ncclxTuner_t fail = {.name = "fail", .abiVersion = 1, .getCollInfo = failing};
  /* A real communicator keeps its tuner for life; this fake swaps it, so it also forgets
   * the choices made per call shape. */
  c.tuner = &revive;
  memset(c.tuneCache, 0, sizeof c.tuneCache);
  for (int k = 0; k < 3; k++) /* again: the caches must not change the answer */
    CHECK(choose(&c, NCCLX_COLL_ALLREDUCE, 1 << 20) == NCCLX_ALGO_TREE);
  c.tuner = &fail;
  memset(c.tuneCache, 0, sizeof c.tuneCache);
  CHECK(choose(&c, NCCLX_COLL_ALLREDUCE, 1 << 20) == dflt);
}

/* The tuner is asked once per call shape (collective, bytes, datatype, op). */
static int countedCalls;
static ncclxResult_t counting(void* ctx, const ncclxTunerQuery_v1_t* q, float* table,
                              size_t* chunk, int* channels) {
  (void)ctx, (void)q, (void)table, (void)chunk, (void)channels;
  countedCalls++;
  return ncclxSuccess;
}

static void testTunerAskedOncePerShape(void) {
  struct ncclxComm c;
  fakeComm(&c, 4, 1, 1);
  static const ncclxTuner_t count = {.name = "count", .abiVersion = 1, .getCollInfo = counting};
  c.tuner = &count;
  for (int k = 0; k < 5; k++) choose(&c, NCCLX_COLL_ALLREDUCE, 1 << 10);
  CHECK(countedCalls == 1);
  choose(&c, NCCLX_COLL_ALLREDUCE, 1 << 11); /* another size: asked again */
  CHECK(countedCalls == 2);
  ncclxCollArgs a;
  memset(&a, 0, sizeof a);
  a.coll = NCCLX_COLL_ALLREDUCE, a.count = 1 << 10, a.datatype = ncclxFloat32, a.op = ncclxMax;
  tuneSelect(&c, &a); /* another op: asked again */
  CHECK(countedCalls == 3);
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  unsetenv("NCCLX_TUNER_MODEL");
  unsetenv("NCCLX_ALGO");
  testDefaults();
  testGoodFile();
  testBadLines();
  testMissingAndEmpty();
  testConfigKey();
  testTransport();
  testShmChoices();
  testTwoRankShmAllreduce();
  testLLChoices();
  testLLBroadcastRounds();
  testLLAllgatherBulk();
  testSharedCpusFromComm();
  testToolHooks();
  testTunerMasking();
  testTunerAskedOncePerShape();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (failures == 0 && system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
  if (failures) {
    fprintf(stderr, "test_model: %d failure(s); files in %s\n", failures, dir);
    return 1;
  }
  printf("test_model: all checks passed\n");
  return 0;
}
