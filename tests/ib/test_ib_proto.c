/* Data-path bookkeeping: CTS records, immediates, striping over QPs, work-request ids, the
 * request ring and the completion accounting of sends and receives. */
#include <string.h>

#include "ib_proto.h"
#include "ib_slots.h"
#include "ib_test.h"

static void testCts(void) {
  uint8_t buf[IB_CTS_BYTES];
  ibCts in = {.seq = 77, .addr = 0x7f0012345678ull, .size = 1 << 20, .rkey = 0xdeadbeef}, out;
  ibCtsEncode(&in, buf);
  CHECK(ibCtsDecode(buf, 77, &out) == NULL);
  CHECK(out.seq == in.seq && out.addr == in.addr && out.size == in.size && out.rkey == in.rkey);
  CHECK(ibCtsDecode(buf, 76, NULL) != NULL); /* a record of another message */
  CHECK(ibCtsDecode(buf, 77 + IB_QUEUE, NULL) != NULL);
  for (size_t i = 0; i < IB_CTS_BYTES; i++) {
    uint8_t copy[IB_CTS_BYTES];
    memcpy(copy, buf, sizeof(copy));
    copy[i] ^= 0x10;
    CHECK_MSG(ibCtsDecode(copy, 77, NULL) != NULL, "byte %zu", i);
  }
  ibCts big = in;
  big.size = ((uint64_t)1 << 30) + 1;
  ibCtsEncode(&big, buf);
  CHECK(ibCtsDecode(buf, 77, NULL) != NULL);
  ibCts wrap = in;
  wrap.addr = UINT64_MAX - 10;
  wrap.size = 100;
  ibCtsEncode(&wrap, buf);
  CHECK(ibCtsDecode(buf, 77, NULL) != NULL);
  ibCts empty = {.seq = 5, .addr = 0, .size = 0, .rkey = 0};
  ibCtsEncode(&empty, buf);
  CHECK(ibCtsDecode(buf, 5, &out) == NULL && out.size == 0);
  memset(buf, 0, sizeof(buf));
  CHECK(ibCtsDecode(buf, 0, NULL) != NULL); /* an all-zero buffer is not a record */
}

static void testImm(void) {
  size_t size = 99;
  CHECK(ibImmDecode(ibImmEncode(0, 0), &size) == 0 && size == 0);
  CHECK(ibImmDecode(ibImmEncode(12345, 0), &size) == 0 && size == 12345);
  CHECK(ibImmDecode(ibImmEncode(IB_MAX_MESSAGE, 0), &size) == 0 && size == IB_MAX_MESSAGE);
  CHECK(ibImmDecode(ibImmEncode(5, 1), &size) == 1);
}

/* Parts must tile [0, size) exactly, be aligned, and use at most nqps QPs. */
static void testStripe(void) {
  const size_t sizes[] = {0, 1, 127, 128, 4096, 65535, 65536, 65537, 131072, 200000, 1 << 20,
                          (1 << 20) + 3, 7777777, IB_MAX_MESSAGE};
  for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
    for (int nqps = 1; nqps <= IB_MAX_QPS; nqps++) {
      for (int lead = 0; lead < nqps + 2; lead++) {
        size_t size = sizes[si], covered = 0, next = 0;
        int used = 0;
        /* Walk the parts in offset order: part p is on QP (lead + p) % nqps. */
        for (int p = 0; p < nqps; p++) {
          int j = (lead + p) % nqps;
          size_t off, len;
          ibStripe(size, nqps, lead, j, &off, &len);
          if (len == 0) continue;
          used++;
          CHECK_MSG(off == next, "size %zu nqps %d lead %d: part %d at %zu, expected %zu", size,
                    nqps, lead, p, off, next);
          CHECK(off % IB_STRIPE_ALIGN == 0);
          next = off + len;
          covered += len;
        }
        CHECK_MSG(covered == size, "size %zu nqps %d lead %d: covered %zu", size, nqps, lead, covered);
        if (size > 0 && size <= IB_STRIPE_MIN) CHECK(used == 1);
        if (size >= (size_t)nqps * IB_STRIPE_MIN) CHECK(used == nqps);
      }
    }
  }
  /* Small messages rotate over the QPs with the lead. */
  size_t off, len;
  ibStripe(100, 4, 2, 2, &off, &len);
  CHECK(off == 0 && len == 100);
  ibStripe(100, 4, 2, 0, &off, &len);
  CHECK(len == 0);
  ibStripe(100, 4, 0, 9, &off, &len); /* out of range QP */
  CHECK(len == 0);
}

static void testWrId(void) {
  int kind, qp, slot;
  uint32_t lo;
  uint64_t id = ibWrId(IB_WR_CTS_RECV, 7, IB_QUEUE - 1, 0x123456789abull);
  ibWrIdDecode(id, &kind, &qp, &slot, &lo);
  CHECK(kind == IB_WR_CTS_RECV && qp == 7 && slot == IB_QUEUE - 1 && lo == 0x456789abu);
  id = ibWrId(IB_WR_DATA_SEND, 0, 0, 0);
  ibWrIdDecode(id, &kind, &qp, &slot, &lo);
  CHECK(kind == IB_WR_DATA_SEND && qp == 0 && slot == 0 && lo == 0);
}

static void testRing(void) {
  ibRing ring;
  ibRingInit(&ring);
  ibReqState* r[IB_QUEUE];
  for (int i = 0; i < IB_QUEUE; i++) {
    CHECK(ibRingCanPost(&ring));
    r[i] = ibRingPost(&ring, 100, 2);
    CHECK(r[i] && r[i]->seq == (uint64_t)i && r[i]->state == IB_REQ_POSTED);
  }
  CHECK(!ibRingCanPost(&ring) && ibRingPost(&ring, 1, 1) == NULL);
  CHECK(ibRingOutstanding(&ring) == IB_QUEUE);
  /* Out-of-order release: the slot of the oldest message still blocks new posts. */
  ibRingRelease(&ring, r[3]);
  CHECK(!ibRingCanPost(&ring) && ring.first == 0);
  ibRingRelease(&ring, r[0]);
  CHECK(ring.first == 1 && ibRingCanPost(&ring));
  ibReqState* n = ibRingPost(&ring, 1, 1);
  CHECK(n && n->seq == IB_QUEUE && n == r[0]); /* reuses slot 0 */
  uint64_t seq = 0;
  CHECK(ibRingMatch(&ring, 0, (uint32_t)IB_QUEUE, &seq) && seq == IB_QUEUE);
  CHECK(!ibRingMatch(&ring, 0, 0, &seq));  /* the old message of slot 0 is gone */
  CHECK(!ibRingMatch(&ring, 3, 3, &seq));  /* released */
  CHECK(!ibRingMatch(&ring, IB_QUEUE, 0, &seq));
  CHECK(ibRingFind(&ring, 5) == r[5] && ibRingFind(&ring, 3) == NULL && ibRingFind(&ring, 999) == NULL);
}

static void testCompletion(void) {
  ibRing ring;
  ibRingInit(&ring);
  /* Send over 3 QPs: done at the third completion, and only once. */
  ibReqState* s = ibRingPost(&ring, 1000, 3);
  CHECK(ibReqSendPart(s) == 0 && ibReqSendPart(s) == 0 && ibReqSendPart(s) == 1);
  CHECK(s->state == IB_REQ_DONE && ibReqSendPart(s) == 0);
  /* Receive of capacity 1000 over 2 QPs: both parts announce 600 bytes. */
  int done = 0;
  ibReqState* r = ibRingPost(&ring, 1000, 2);
  CHECK(ibReqRecvPart(r, ibImmEncode(600, 0), &done) == NULL && !done);
  CHECK(ibReqRecvPart(r, ibImmEncode(600, 0), &done) == NULL && done);
  CHECK(r->state == IB_REQ_DONE && r->msgSize == 600);
  CHECK(ibReqRecvPart(r, ibImmEncode(600, 0), &done) != NULL); /* no part expected any more */
  /* Parts that disagree. */
  r = ibRingPost(&ring, 1000, 2);
  CHECK(ibReqRecvPart(r, ibImmEncode(10, 0), &done) == NULL);
  CHECK(ibReqRecvPart(r, ibImmEncode(11, 0), &done) != NULL && r->state == IB_REQ_FAILED);
  /* The sender flagged a message larger than the receive. */
  r = ibRingPost(&ring, 10, 1);
  const char* why = ibReqRecvPart(r, ibImmEncode(0, 1), &done);
  CHECK(why && strstr(why, "larger") && r->state == IB_REQ_FAILED);
  /* A size beyond the capacity (a peer that ignored the CTS). */
  r = ibRingPost(&ring, 10, 1);
  CHECK(ibReqRecvPart(r, ibImmEncode(11, 0), &done) != NULL && r->state == IB_REQ_FAILED);
  /* Zero-byte message. */
  r = ibRingPost(&ring, 0, 1);
  CHECK(ibReqRecvPart(r, ibImmEncode(0, 0), &done) == NULL && done && r->msgSize == 0);
}

int main(void) {
  testCts();
  testImm();
  testStripe();
  testWrId();
  testRing();
  testCompletion();
  return ibTestResult("test_ib_proto");
}
