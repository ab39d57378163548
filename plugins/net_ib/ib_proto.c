/* Data-path protocol helpers (see ib_proto.h). */
#include "ib_proto.h"

#include <string.h>

#define IB_CTS_CHECK 0x53544358u /* "XCTS" */

static void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
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

/* The check word covers every field: a stale, shifted or damaged record fails. */
static uint32_t ctsCheck(const ibCts* c) {
  uint32_t h = IB_CTS_CHECK;
  const uint64_t words[4] = {c->seq, c->addr, c->size, c->rkey};
  for (int i = 0; i < 4; i++) {
    h = (h ^ (uint32_t)words[i]) * 16777619u;
    h = (h ^ (uint32_t)(words[i] >> 32)) * 16777619u;
  }
  return h;
}

/* Layout: 0 seq | 8 addr | 16 size | 24 rkey | 28 check. */
void ibCtsEncode(const ibCts* cts, void* buf) {
  uint8_t* p = buf;
  put64(p, cts->seq);
  put64(p + 8, cts->addr);
  put64(p + 16, cts->size);
  put32(p + 24, cts->rkey);
  put32(p + 28, ctsCheck(cts));
}

const char* ibCtsDecode(const void* buf, uint64_t seq, ibCts* out) {
  const uint8_t* p = buf;
  ibCts c;
  c.seq = get64(p);
  c.addr = get64(p + 8);
  c.size = get64(p + 16);
  c.rkey = get32(p + 24);
  if (get32(p + 28) != ctsCheck(&c)) return "corrupted clear-to-send record";
  if (c.seq != seq) return "clear-to-send record for another message (streams out of step)";
  if (c.size > IB_MAX_MESSAGE) return "clear-to-send record with a receive larger than 1 GiB";
  if (c.size > 0 && c.addr + c.size < c.addr) return "clear-to-send record wraps the address space";
  if (out) *out = c;
  return NULL;
}

uint32_t ibImmEncode(size_t size, int tooLarge) {
  if (tooLarge) return IB_IMM_ERROR;
  return (uint32_t)(size & ~(size_t)IB_IMM_ERROR);
}

int ibImmDecode(uint32_t imm, size_t* size) {
  if (imm & IB_IMM_ERROR) {
    *size = 0;
    return 1;
  }
  *size = imm;
  return 0;
}

void ibStripe(size_t size, int nqps, int lead, int j, size_t* off, size_t* len) {
  *off = 0;
  *len = 0;
  if (nqps < 1 || j < 0 || j >= nqps || size == 0) return;
  size_t parts = (size + IB_STRIPE_MIN - 1) / IB_STRIPE_MIN;
  if (parts > (size_t)nqps) parts = (size_t)nqps;
  if (parts < 1) parts = 1;
  size_t chunk = (size + parts - 1) / parts;
  chunk = (chunk + IB_STRIPE_ALIGN - 1) / IB_STRIPE_ALIGN * IB_STRIPE_ALIGN;
  size_t p = (size_t)((j - lead % nqps + nqps) % nqps);
  if (p >= parts) return;
  size_t o = p * chunk;
  if (o >= size) return;
  *off = o;
  *len = size - o < chunk ? size - o : chunk;
}

/* Layout: kind 8 bits | qp 8 bits | slot 16 bits | seq low 32 bits. */
uint64_t ibWrId(int kind, int qp, int slot, uint64_t seq) {
  return ((uint64_t)(kind & 0xff) << 56) | ((uint64_t)(qp & 0xff) << 48) |
         ((uint64_t)(slot & 0xffff) << 32) | (uint32_t)seq;
}

void ibWrIdDecode(uint64_t id, int* kind, int* qp, int* slot, uint32_t* seqLow) {
  *kind = (int)(id >> 56);
  *qp = (int)((id >> 48) & 0xff);
  *slot = (int)((id >> 32) & 0xffff);
  *seqLow = (uint32_t)id;
}
