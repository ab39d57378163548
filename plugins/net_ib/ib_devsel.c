/* Port and GID selection rules (see ib_devsel.h). */
#include "ib_devsel.h"

#include <ctype.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void appendf(char* buf, size_t len, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char* buf, size_t len, const char* fmt, ...) {
  size_t used = strlen(buf);
  if (used + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, len - used, fmt, ap);
  va_end(ap);
}

static int nameCharOk(char c) {
  return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.' || c == '*' || c == '?' ||
         c == '[' || c == ']';
}

int ibHcaParse(const char* text, ibHcaFilter* f, char* why, size_t whyLen) {
  memset(f, 0, sizeof(*f));
  if (why && whyLen) why[0] = '\0';
  if (text == NULL || text[strspn(text, " \t")] == '\0') return 0;
  const char* p = text;
  for (int index = 1;; index++) {
    const char* end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    if (len == 0) {
      snprintf(why, whyLen, "item %d is empty", index);
      return -1;
    }
    if (f->n == IB_HCA_MAX_ITEMS) {
      snprintf(why, whyLen, "more than %d items", IB_HCA_MAX_ITEMS);
      return -1;
    }
    ibHcaItem* it = &f->items[f->n];
    char item[128];
    snprintf(item, sizeof(item), "%.*s", (int)(len < 100 ? len : 100), p);
    const char* s = item;
    if (*s == '^') it->exclude = 1, s++;
    const char* colon = strchr(s, ':');
    size_t nameLen = colon ? (size_t)(colon - s) : strlen(s);
    if (nameLen == 0 || nameLen >= IB_NAME_MAX) {
      snprintf(why, whyLen, "item %d '%s': %s", index, item,
               nameLen ? "device name too long" : "no device name");
      return -1;
    }
    for (size_t i = 0; i < nameLen; i++) {
      if (!nameCharOk(s[i])) {
        snprintf(why, whyLen, "item %d '%s': character '%c' is not allowed in a device name",
                 index, item, s[i]);
        return -1;
      }
    }
    memcpy(it->pattern, s, nameLen);
    it->pattern[nameLen] = '\0';
    if (colon) {
      char* endp = NULL;
      long port = strtol(colon + 1, &endp, 10);
      if (colon[1] == '\0' || !isdigit((unsigned char)colon[1]) || *endp != '\0' || port < 1 ||
          port > 255) {
        snprintf(why, whyLen, "item %d '%s': port must be a number from 1 to 255", index, item);
        return -1;
      }
      it->port = (int)port;
    }
    if (!it->exclude) f->nInclude++;
    f->n++;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

static int itemMatches(const ibHcaItem* it, const char* name, int port) {
  if (it->port && it->port != port) return 0;
  return fnmatch(it->pattern, name, 0) == 0;
}

int ibHcaAdmits(const ibHcaFilter* f, const char* name, int port) {
  int included = f->nInclude == 0;
  for (int i = 0; i < f->n; i++) {
    if (!itemMatches(&f->items[i], name, port)) continue;
    if (f->items[i].exclude) return 0;
    included = 1;
  }
  return included;
}

int ibSelectPorts(const ibPortRecord* recs, int n, const ibHcaFilter* f, int portOnly, int* out,
                  int maxOut, char* why, size_t whyLen) {
  int count = 0;
  if (why && whyLen) why[0] = '\0';
  char reasons[1024] = "";
  for (int i = 0; i < n; i++) {
    const char* reason = NULL;
    if (portOnly > 0 && recs[i].port != portOnly)
      reason = "other port number than [net.ib] port";
    else if (!ibHcaAdmits(f, recs[i].name, recs[i].port))
      reason = "not selected by [net.ib] hca";
    else if (!recs[i].active)
      reason = "port not active";
    else if (recs[i].linkLayer != IB_LINK_IB && recs[i].linkLayer != IB_LINK_ETH)
      reason = "unknown link layer";
    else if (count == maxOut)
      reason = "too many ports";
    if (reason) {
      appendf(reasons, sizeof(reasons), "%s%s:%d (%s, %s)", reasons[0] ? ", " : "", recs[i].name,
              recs[i].port, ibLinkName(recs[i].linkLayer), reason);
      continue;
    }
    out[count++] = i;
  }
  if (count == 0 && why) {
    if (n == 0)
      snprintf(why, whyLen, "no RDMA ports");
    else
      snprintf(why, whyLen, "no usable port among %s", reasons);
  }
  return count;
}

int ibHcaUnmatched(const ibHcaFilter* f, const ibPortRecord* recs, int n, char* out, size_t len) {
  int count = 0;
  if (out && len) out[0] = '\0';
  for (int i = 0; i < f->n; i++) {
    if (f->items[i].exclude) continue;
    int hit = 0;
    for (int r = 0; r < n && !hit; r++) hit = itemMatches(&f->items[i], recs[r].name, recs[r].port);
    if (hit) continue;
    count++;
    if (out) {
      if (f->items[i].port)
        appendf(out, len, "%s%s:%d", count > 1 ? ", " : "", f->items[i].pattern, f->items[i].port);
      else
        appendf(out, len, "%s%s", count > 1 ? ", " : "", f->items[i].pattern);
    }
  }
  return count;
}

static int gidEmpty(const uint8_t* g) {
  for (int i = 0; i < 16; i++)
    if (g[i]) return 0;
  return 1;
}

static int gidIsV4Mapped(const uint8_t* g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g, prefix, 12) == 0;
}

static int gidIsLinkLocal(const uint8_t* g) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

static int rocePreference(const ibGidRecord* r) {
  if (gidEmpty(r->gid)) return 0;
  if (r->type == IB_GID_TYPE_ROCE_V2) {
    if (gidIsV4Mapped(r->gid)) return 4;
    return gidIsLinkLocal(r->gid) ? 2 : 3;
  }
  return r->type == IB_GID_TYPE_ROCE_V1 ? 1 : 0;
}

int ibGidPick(const ibGidRecord* recs, int n, int linkLayer, int configured, char* why,
              size_t whyLen) {
  if (why && whyLen) why[0] = '\0';
  if (configured >= 0) {
    for (int i = 0; i < n; i++)
      if (recs[i].index == configured && !gidEmpty(recs[i].gid)) return configured;
    char valid[256] = "";
    for (int i = 0; i < n; i++)
      if (!gidEmpty(recs[i].gid)) appendf(valid, sizeof(valid), "%s%d", valid[0] ? ", " : "", recs[i].index);
    snprintf(why, whyLen, "gid_index %d is not a populated entry of the GID table (populated: %s)",
             configured, valid[0] ? valid : "none");
    return -1;
  }
  if (linkLayer == IB_LINK_IB) {
    int best = -1;
    for (int i = 0; i < n; i++) {
      if (gidEmpty(recs[i].gid)) continue;
      if (recs[i].index == 0) return 0;
      if (best < 0 || recs[i].index < best) best = recs[i].index;
    }
    if (best < 0) snprintf(why, whyLen, "the GID table is empty");
    return best;
  }
  int best = -1, bestScore = 0;
  for (int i = 0; i < n; i++) {
    int score = rocePreference(&recs[i]);
    if (score > bestScore || (score == bestScore && score > 0 && recs[i].index < best)) {
      best = recs[i].index;
      bestScore = score;
    }
  }
  if (best < 0)
    snprintf(why, whyLen, "no RoCE GID in the table (does the Ethernet interface have an IP "
             "address?)");
  return best;
}

int ibPortSpeedMbps(int activeSpeed, int activeWidth) {
  int lane;
  switch (activeSpeed) {
    case 1: lane = 2500; break;     /* SDR */
    case 2: lane = 5000; break;     /* DDR */
    case 4: lane = 10000; break;    /* QDR */
    case 8: lane = 10000; break;    /* FDR10 */
    case 16: lane = 14000; break;   /* FDR */
    case 32: lane = 25000; break;   /* EDR */
    case 64: lane = 50000; break;   /* HDR */
    case 128: lane = 100000; break; /* NDR */
    case 256: lane = 200000; break; /* XDR */
    default: return 0;
  }
  int lanes;
  switch (activeWidth) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return 0;
  }
  return lane * lanes;
}

int ibMtuMin(int a, int b) { return a < b ? a : b; }

int ibMtuBytes(int mtu) { return (mtu >= IB_MTU_MIN && mtu <= IB_MTU_MAX) ? 128 << mtu : 0; }

const char* ibLinkName(int linkLayer) {
  return linkLayer == IB_LINK_IB ? "InfiniBand" : linkLayer == IB_LINK_ETH ? "RoCE" : "unknown";
}
