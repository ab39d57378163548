/* Choosing RDMA ports and GIDs, as pure functions over records that ib_verbs.c fills from
 * the devices (so the rules are tested without hardware).
 *
 * [net.ib] hca is a comma-separated list of items `[^]NAME[:PORT]`:
 *   NAME   a device name, or a shell pattern (mlx5_*, mlx5_[01]) matched with fnmatch;
 *   :PORT  only that port of the device (otherwise every port);
 *   ^      exclude what the item matches.
 * A port is used when it is ACTIVE, matches no exclude item and, if the list has include
 * items, matches one of them. "mlx5_0:1,^mlx5_2" = port 1 of mlx5_0 only (mlx5_2 never). */
#ifndef NCCLX_IB_DEVSEL_H
#define NCCLX_IB_DEVSEL_H

#include "ib_common.h"

#define IB_HCA_MAX_ITEMS 32

typedef struct {
  char pattern[IB_NAME_MAX];
  int port;    /* 0 = any */
  int exclude;
} ibHcaItem;

typedef struct {
  ibHcaItem items[IB_HCA_MAX_ITEMS];
  int n;
  int nInclude;
} ibHcaFilter;

/* 0 and *f filled, or -1 with why set. An empty or blank string is the empty filter. */
int ibHcaParse(const char* text, ibHcaFilter* f, char* why, size_t whyLen);
/* 1 when the filter admits device `name` port `port` (the state is not looked at). */
int ibHcaAdmits(const ibHcaFilter* f, const char* name, int port);

typedef struct {
  char name[IB_NAME_MAX];
  int port;
  int active;     /* port state is IBV_PORT_ACTIVE */
  int linkLayer;  /* IB_LINK_* */
} ibPortRecord;

/* Indexes of the usable records, in record order, into out[] (at most maxOut). portOnly > 0
 * restricts every device to that port number ([net.ib] port). Returns the count; when it is
 * 0, why lists each port and the reason it was not used. */
int ibSelectPorts(const ibPortRecord* recs, int n, const ibHcaFilter* f, int portOnly, int* out,
                  int maxOut, char* why, size_t whyLen);

/* Include items of the filter that match no record at all (likely typos), comma-separated in
 * out; returns how many. */
int ibHcaUnmatched(const ibHcaFilter* f, const ibPortRecord* recs, int n, char* out, size_t len);

enum { IB_GID_TYPE_IB = 0, IB_GID_TYPE_ROCE_V1 = 1, IB_GID_TYPE_ROCE_V2 = 2 };

typedef struct {
  int index;
  int type;       /* IB_GID_TYPE_* */
  uint8_t gid[16];
} ibGidRecord;

/* GID index to use on a port, or -1 with why set. configured >= 0 ([net.ib] gid_index) must
 * name a non-empty entry. Automatic on Ethernet (RoCE): RoCE v2 with an IPv4-mapped address,
 * then v2 global IPv6, v2 link-local, then v1; lowest index among equals. On InfiniBand:
 * entry 0 (only used when a GRH is needed). */
int ibGidPick(const ibGidRecord* recs, int n, int linkLayer, int configured, char* why,
              size_t whyLen);

/* Port speed in Mb/s from ibv_port_attr active_speed and active_width codes; 0 if unknown. */
int ibPortSpeedMbps(int activeSpeed, int activeWidth);
/* Path MTU both ends support, and its size in bytes for logs. */
int ibMtuMin(int a, int b);
int ibMtuBytes(int mtu);
const char* ibLinkName(int linkLayer);

#endif
