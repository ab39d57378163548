/* Names the core passes (function, datatype, op, algorithm, protocol, transport) are a handful
 * of static strings. Each communicator interns them by address on first sight, so an event
 * record carries one byte per name and the writer copies pre-escaped text: no string work
 * on the hot path after warm-up. */
#include <string.h>

#include "trace.h"

void traceNamesInit(TraceNames* t) {
  memset(t, 0, sizeof(*t));
  t->n = 2; /* 0: no name (NULL), 1: the table is full */
  t->names[1].len = 1;
  t->names[1].text[0] = '?';
}

static unsigned slotOf(const char* s) {
  uintptr_t v = (uintptr_t)s;
  return (unsigned)((v >> 3) ^ (v >> 11)) & (TRACE_NAME_SLOTS - 1);
}

uint8_t traceNameId(TraceNames* t, const char* s) {
  if (!s) return 0;
  unsigned h = slotOf(s);
  for (;; h = (h + 1) & (TRACE_NAME_SLOTS - 1)) {
    uint8_t id = t->bySlot[h];
    if (id == 0) break;
    if (t->names[id].ptr == s) return id;
  }
  if (t->n == TRACE_NAMES) return 1;
  uint8_t id = (uint8_t)t->n;
  TraceName* n = &t->names[id];
  size_t len = 0;
  for (; len + 1 < sizeof(n->text) && s[len]; len++) {
    char c = s[len]; /* the text goes into JSON unquoted: make it safe once, here */
    n->text[len] = (c == '"' || c == '\\' || (unsigned char)c < 0x20) ? '_' : c;
  }
  n->text[len] = '\0';
  n->len = (uint8_t)len;
  n->ptr = s;
  /* Published before any record that uses it (the ring's release store orders it). */
  t->n++;
  t->bySlot[h] = id;
  return id;
}
