/* Naming what differs when a message's signature (net.h, "Signed tags") is not this rank's:
 * the kinds of call, and their bytes per rank. Only failures come here. */
#include <stdio.h>

#include "exec/xfer.h"


static const char* _Atomic moduleKindNames[NCCLX_MODULE_CALL_KINDS];

void xferNameModuleKind(int kind, const char* name) {
  if (kind >= 0 && kind < NCCLX_MODULE_CALL_KINDS) moduleKindNames[kind] = name; /* a module's static string */
}

static void xferSigKindName(int kind, char* buf, size_t size) {
  const char* module = kind >= XFER_SIG_MODULE && kind < XFER_SIG_MODULE + NCCLX_MODULE_CALL_KINDS
                           ? moduleKindNames[kind - XFER_SIG_MODULE]
                           : NULL;
  if (kind == XFER_SIG_P2P)
    snprintf(buf, size, "send/recv");
  else if (kind < XFER_SIG_MODULE)
    snprintf(buf, size, "%s", ncclxCollName((ncclxCollType_t)(kind - XFER_SIG_COLL)));
  else if (module)
    snprintf(buf, size, "%s", module);
  else
    snprintf(buf, size, "module call kind %d", kind - XFER_SIG_MODULE);
}

/* What differs between the call a message came from (theirs) and ours, for "<rank> ...". */
void xferDescribeMismatch(int theirs, int ours, char* buf, size_t size) {
  int tk = (theirs >> XFER_SIG_BYTES_BITS) & (XFER_SIG_KINDS - 1);
  int ok = (ours >> XFER_SIG_BYTES_BITS) & (XFER_SIG_KINDS - 1);
  unsigned tb = (unsigned)theirs & XFER_SIG_BYTES_MASK, ob = (unsigned)ours & XFER_SIG_BYTES_MASK;
  char tn[32], on[32];
  xferSigKindName(tk, tn, sizeof(tn));
  xferSigKindName(ok, on, sizeof(on));
  if (!(theirs & NCCLX_NET_TAG_SIGNED) || tk != ok)
    snprintf(buf, size, "sent data of %s where this rank runs %s (collectives differ across ranks)",
             (theirs & NCCLX_NET_TAG_SIGNED) ? tn : "an unsigned message", on);
  else if (tk == XFER_SIG_P2P)
    snprintf(buf, size, "sent %u bytes where this rank receives %u (counts or datatypes differ; "
             "sizes of 64 MiB and more show folded)", tb, ob);
  else
    snprintf(buf, size, "called %s with %u bytes per rank where this rank has %u (counts or datatypes "
             "differ between ranks; sizes of 64 MiB and more show folded)", tn, tb, ob);
}
