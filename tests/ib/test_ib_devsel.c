/* Port selection from (name, port, state, link layer) records with [net.ib] hca / port, GID
 * choice, speed and MTU helpers. */
#include <string.h>

#include "ib_devsel.h"
#include "ib_test.h"

static const ibPortRecord hostPorts[] = {
    {"mlx5_0", 1, 1, IB_LINK_IB},  {"mlx5_0", 2, 0, IB_LINK_IB},  {"mlx5_1", 1, 1, IB_LINK_IB},
    {"mlx5_2", 1, 1, IB_LINK_ETH}, {"mlx5_10", 1, 1, IB_LINK_IB}, {"bnxt_re0", 1, 1, IB_LINK_ETH},
    {"odd0", 1, 1, IB_LINK_UNKNOWN},
};
#define NPORTS ((int)(sizeof(hostPorts) / sizeof(hostPorts[0])))

/* Selected records as "name:port name:port ..." for compact comparisons. */
static void selectText(const char* hca, int portOnly, char* out, size_t len, char* why, size_t whyLen) {
  ibHcaFilter f;
  char err[200];
  out[0] = '\0';
  if (ibHcaParse(hca, &f, err, sizeof(err)) != 0) {
    snprintf(out, len, "parse error: %s", err);
    return;
  }
  int sel[16];
  int n = ibSelectPorts(hostPorts, NPORTS, &f, portOnly, sel, 16, why, whyLen);
  for (int i = 0; i < n; i++) {
    size_t used = strlen(out);
    snprintf(out + used, len - used, "%s%s:%d", i ? " " : "", hostPorts[sel[i]].name, hostPorts[sel[i]].port);
  }
}

#define EXPECT_SELECT(hca, portOnly, expected)                                  \
  do {                                                                          \
    char got[256], why[1024];                                                   \
    selectText(hca, portOnly, got, sizeof(got), why, sizeof(why));              \
    CHECK_MSG(strcmp(got, expected) == 0, "hca '%s' port %d: got '%s' want '%s' (%s)", hca, \
              portOnly, got, expected, why);                                    \
  } while (0)

static void testSelection(void) {
  /* No filter: every active port with a known link layer, in record order. */
  EXPECT_SELECT("", 0, "mlx5_0:1 mlx5_1:1 mlx5_2:1 mlx5_10:1 bnxt_re0:1");
  EXPECT_SELECT("mlx5_0:1,^mlx5_2", 0, "mlx5_0:1");
  EXPECT_SELECT("^mlx5_2", 0, "mlx5_0:1 mlx5_1:1 mlx5_10:1 bnxt_re0:1");
  EXPECT_SELECT("^mlx5_2,^bnxt_re0", 0, "mlx5_0:1 mlx5_1:1 mlx5_10:1");
  /* Exact names: mlx5_1 does not pick mlx5_10; patterns do. */
  EXPECT_SELECT("mlx5_1", 0, "mlx5_1:1");
  EXPECT_SELECT("mlx5_1*", 0, "mlx5_1:1 mlx5_10:1");
  EXPECT_SELECT("mlx5_*,^mlx5_1*", 0, "mlx5_0:1 mlx5_2:1");
  EXPECT_SELECT("mlx5_[01]", 0, "mlx5_0:1 mlx5_1:1");
  EXPECT_SELECT(" mlx5_2 , bnxt_re0 ", 0, "mlx5_2:1 bnxt_re0:1");
  /* Exclusion wins over inclusion; a port-specific exclude leaves the other ports. */
  EXPECT_SELECT("mlx5_0,^mlx5_0", 0, "");
  EXPECT_SELECT("mlx5_0,^mlx5_0:2", 0, "mlx5_0:1");
  /* [net.ib] port restricts every device. */
  EXPECT_SELECT("", 1, "mlx5_0:1 mlx5_1:1 mlx5_2:1 mlx5_10:1 bnxt_re0:1");
  EXPECT_SELECT("", 2, "");

  /* Nothing usable: why names each port and its reason. */
  ibHcaFilter f;
  char err[200], why[1024];
  CHECK(ibHcaParse("mlx5_0:2", &f, err, sizeof(err)) == 0);
  int sel[16];
  CHECK(ibSelectPorts(hostPorts, NPORTS, &f, 0, sel, 16, why, sizeof(why)) == 0);
  CHECK_MSG(strstr(why, "mlx5_0:2 (InfiniBand, port not active)") != NULL, "%s", why);
  CHECK_MSG(strstr(why, "mlx5_1:1 (InfiniBand, not selected by [net.ib] hca)") != NULL, "%s", why);
  CHECK(ibSelectPorts(hostPorts, 0, &f, 0, sel, 16, why, sizeof(why)) == 0);
  CHECK(strstr(why, "no RDMA ports") != NULL);
  /* Unknown link layer is never used, even when named. */
  CHECK(ibHcaParse("odd0", &f, err, sizeof(err)) == 0);
  CHECK(ibSelectPorts(hostPorts, NPORTS, &f, 0, sel, 16, why, sizeof(why)) == 0);
  CHECK(strstr(why, "unknown link layer") != NULL);
  /* maxOut bounds the result. */
  CHECK(ibHcaParse("", &f, err, sizeof(err)) == 0);
  CHECK(ibSelectPorts(hostPorts, NPORTS, &f, 0, sel, 2, why, sizeof(why)) == 2);

  /* Typos are reported. */
  char unmatched[128];
  CHECK(ibHcaParse("mlx5_0,mlx6_*,mlx5_1:3,^nothing", &f, err, sizeof(err)) == 0);
  CHECK(ibHcaUnmatched(&f, hostPorts, NPORTS, unmatched, sizeof(unmatched)) == 2);
  CHECK_MSG(strcmp(unmatched, "mlx6_*, mlx5_1:3") == 0, "%s", unmatched);
}

static void testParseErrors(void) {
  const char* bad[] = {",",        "mlx5_0,",  ",mlx5_0", "mlx5_0:",   "mlx5_0:0", "mlx5_0:256",
                       "mlx5_0:1x", ":1",      "^:1",     "mlx5 0",    "a/b",      "mlx5_0:-1"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ibHcaFilter f;
    char why[200] = "";
    CHECK_MSG(ibHcaParse(bad[i], &f, why, sizeof(why)) != 0, "'%s' accepted", bad[i]);
    CHECK_MSG(why[0] != '\0', "'%s' refused without a reason", bad[i]);
  }
  char many[512] = "";
  for (int i = 0; i <= IB_HCA_MAX_ITEMS; i++) strcat(many, i ? ",d" : "d");
  ibHcaFilter f;
  char why[200];
  CHECK(ibHcaParse(many, &f, why, sizeof(why)) != 0 && strstr(why, "more than"));
  CHECK(ibHcaParse("   ", &f, why, sizeof(why)) == 0 && f.n == 0);
  CHECK(ibHcaParse(NULL, &f, why, sizeof(why)) == 0 && f.n == 0);
  CHECK(ibHcaParse("^mlx5_0:2, mlx5_1", &f, why, sizeof(why)) == 0);
  CHECK(f.n == 2 && f.nInclude == 1 && f.items[0].exclude && f.items[0].port == 2 &&
        strcmp(f.items[0].pattern, "mlx5_0") == 0 && !f.items[1].exclude && f.items[1].port == 0);
}

static ibGidRecord gid(int index, int type, const char* kind) {
  ibGidRecord r;
  memset(&r, 0, sizeof(r));
  r.index = index;
  r.type = type;
  if (strcmp(kind, "v4") == 0) {
    r.gid[10] = r.gid[11] = 0xff;
    r.gid[12] = 192, r.gid[13] = 168, r.gid[14] = 1, r.gid[15] = (uint8_t)index;
  } else if (strcmp(kind, "ll") == 0) {
    r.gid[0] = 0xfe, r.gid[1] = 0x80, r.gid[15] = (uint8_t)index;
  } else if (strcmp(kind, "v6") == 0) {
    r.gid[0] = 0x20, r.gid[1] = 0x01, r.gid[15] = (uint8_t)index;
  } /* "empty" stays zero */
  return r;
}

static void testGidPick(void) {
  char why[256];
  /* A typical RoCE table: link-local v1/v2, then IPv4-mapped v1/v2, then global v6. */
  ibGidRecord roce[] = {gid(0, IB_GID_TYPE_ROCE_V1, "ll"), gid(1, IB_GID_TYPE_ROCE_V2, "ll"),
                        gid(2, IB_GID_TYPE_ROCE_V1, "v4"), gid(3, IB_GID_TYPE_ROCE_V2, "v4"),
                        gid(4, IB_GID_TYPE_ROCE_V2, "v6"), gid(5, IB_GID_TYPE_ROCE_V2, "empty")};
  CHECK(ibGidPick(roce, 6, IB_LINK_ETH, -1, why, sizeof(why)) == 3);
  CHECK(ibGidPick(roce, 5, IB_LINK_ETH, -1, why, sizeof(why)) == 3);
  CHECK(ibGidPick(roce + 4, 1, IB_LINK_ETH, -1, why, sizeof(why)) == 4); /* only global v6 */
  CHECK(ibGidPick(roce, 2, IB_LINK_ETH, -1, why, sizeof(why)) == 1);     /* v2 link-local > v1 */
  CHECK(ibGidPick(roce, 1, IB_LINK_ETH, -1, why, sizeof(why)) == 0);     /* v1 as a last resort */
  CHECK(ibGidPick(roce + 5, 1, IB_LINK_ETH, -1, why, sizeof(why)) == -1 && strstr(why, "RoCE GID"));
  /* A configured index must exist and be populated. */
  CHECK(ibGidPick(roce, 6, IB_LINK_ETH, 2, why, sizeof(why)) == 2);
  CHECK(ibGidPick(roce, 6, IB_LINK_ETH, 5, why, sizeof(why)) == -1);
  CHECK_MSG(strstr(why, "gid_index 5") && strstr(why, "0, 1, 2, 3, 4"), "%s", why);
  CHECK(ibGidPick(roce, 6, IB_LINK_ETH, 9, why, sizeof(why)) == -1);
  /* InfiniBand: entry 0. */
  ibGidRecord ib[] = {gid(1, IB_GID_TYPE_IB, "ll"), gid(0, IB_GID_TYPE_IB, "ll")};
  CHECK(ibGidPick(ib, 2, IB_LINK_IB, -1, why, sizeof(why)) == 0);
  CHECK(ibGidPick(ib, 1, IB_LINK_IB, -1, why, sizeof(why)) == 1);
  CHECK(ibGidPick(ib, 0, IB_LINK_IB, -1, why, sizeof(why)) == -1);
}

static void testSpeedMtu(void) {
  CHECK(ibPortSpeedMbps(32, 2) == 100000);  /* EDR 4x */
  CHECK(ibPortSpeedMbps(64, 2) == 200000);  /* HDR 4x */
  CHECK(ibPortSpeedMbps(128, 2) == 400000); /* NDR 4x */
  CHECK(ibPortSpeedMbps(1, 1) == 2500);
  CHECK(ibPortSpeedMbps(64, 16) == 100000); /* HDR 2x */
  CHECK(ibPortSpeedMbps(3, 2) == 0 && ibPortSpeedMbps(32, 3) == 0);
  CHECK(ibMtuMin(5, 3) == 3 && ibMtuMin(1, 4) == 1);
  CHECK(ibMtuBytes(1) == 256 && ibMtuBytes(5) == 4096 && ibMtuBytes(0) == 0 && ibMtuBytes(6) == 0);
  CHECK(strcmp(ibLinkName(IB_LINK_ETH), "RoCE") == 0);
}

int main(void) {
  testSelection();
  testParseErrors();
  testGidPick();
  testSpeedMtu();
  return ibTestResult("test_ib_devsel");
}
