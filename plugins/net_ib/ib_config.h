/* [net.ib] keys: parsing and validation, independent of any RDMA device.
 *
 * Every bad value is refused with a message naming the key, the value and where it was set
 * (file:line from the section's entries, or the NCCLX_NET_IB_<KEY> environment variable). */
#ifndef NCCLX_IB_CONFIG_H
#define NCCLX_IB_CONFIG_H

#include "ib_common.h"
#include "ib_devsel.h"

typedef struct {
  char hca[256];        /* raw filter text, "" = every active port */
  ibHcaFilter hcaFilter;
  int gidIndex;         /* -1: choose automatically */
  int port;             /* 0: any port number */
  int trafficClass;     /* 0..255 */
  int sl;               /* 0..15 */
  int timeout;          /* 1..31: local ACK timeout 4.096 us * 2^timeout */
  int retryCnt;         /* 0..7 */
  int qpsPerConn;       /* 1..IB_MAX_QPS */
  int mrCacheIdle;      /* registrations kept after their last user, 0..4096 */
  char oobIfname[64];   /* interface of the TCP side channel, "" = automatic */
} ibConfig;

void ibConfigDefaults(ibConfig* cfg);

/* Reads the section. ncclxSuccess, or ncclxInvalidUsage with err holding the message. */
ncclxResult_t ibConfigLoad(const ncclxConfigApi_t* api, const ncclxConfigSection_t* section,
                           ibConfig* cfg, char* err, size_t errLen);

/* Calls warn(arg, message) for each key of the section that net_ib does not know. */
void ibConfigUnknownKeys(const ncclxConfigApi_t* api, const ncclxConfigSection_t* section,
                         void (*warn)(void* arg, const char* message), void* arg);

/* Where a key's current value comes from: "file:line" or "env NCCLX_NET_IB_KEY". */
void ibConfigWhere(const ncclxConfigApi_t* api, const ncclxConfigSection_t* section,
                   const char* key, const char* value, char* out, size_t len);

#endif
