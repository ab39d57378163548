/* The socket network's configuration ([net.socket] keys), its interface choice and init. */
#include "transport/socket/net_socket_internal.h"
#include "ncclx/config_value.h"

static const char* const sockKnownKeys[] = {"ifname", "nsocks", "buffer_bytes"};

/* Where a key's value came from, for error messages. */
static const char* configWhere(const ncclxPluginEnv_t* env, const char* key, const char* value) {
  for (int i = 0;; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry || !env->config->entry(env->section, i, &k, &v, &w)) break;
    if (k && strcasecmp(k, key) == 0)
      return (v && value && strcmp(v, value) == 0 && w) ? w : "environment override";
  }
  return "environment";
}

static void warnUnknownKeys(const ncclxPluginEnv_t* env) {
  if (!env->config->entry) return;
  for (int i = 0;; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry(env->section, i, &k, &v, &w)) break;
    if (!k) continue;
    int known = 0;
    for (size_t j = 0; j < sizeof(sockKnownKeys) / sizeof(sockKnownKeys[0]); j++)
      if (strcasecmp(k, sockKnownKeys[j]) == 0) known = 1;
    if (!known)
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
               "NET/Socket: ignoring unknown key '%s' (%s); known keys: ifname, nsocks, "
               "buffer_bytes", k, w ? w : "?");
  }
}

static int parseLong(const char* s, long* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s) return -1;
  while (*end == ' ' || *end == '\t') end++;
  if (*end != '\0') return -1;
  *out = v;
  return 0;
}

static int isLinkLocal6(const struct sockaddr_in6* a) {
  return a->sin6_addr.s6_addr[0] == 0xfe && (a->sin6_addr.s6_addr[1] & 0xc0) == 0x80;
}

/* ifname set: that interface's IPv4 address, else its best IPv6 one. Unset: the first UP
 * non-loopback IPv4 interface, else loopback. */
static ncclxResult_t pickInterface(const ncclxPluginEnv_t* env, const char* want, sockCtx* ctx) {
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET, __FILE__, __LINE__,
             "NET/Socket: getifaddrs failed: %s", strerror(errno));
    return ncclxSystemError;
  }
  const struct ifaddrs *best = NULL, *best6 = NULL, *loop = NULL;
  char names[256] = "";
  for (const struct ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || !it->ifa_name) continue;
    int fam = it->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (!strstr(names, it->ifa_name) && strlen(names) + strlen(it->ifa_name) + 3 < sizeof(names)) {
      if (names[0]) strcat(names, ", ");
      strcat(names, it->ifa_name);
    }
    if (want) {
      if (strcmp(it->ifa_name, want) != 0) continue;
      if (fam == AF_INET && !best) best = it;
      if (fam == AF_INET6 &&
          (!best6 || (isLinkLocal6((const struct sockaddr_in6*)(const void*)best6->ifa_addr) &&
                      !isLinkLocal6((const struct sockaddr_in6*)(const void*)it->ifa_addr))))
        best6 = it;
    } else if (fam == AF_INET && (it->ifa_flags & IFF_UP)) {
      if (it->ifa_flags & IFF_LOOPBACK) {
        if (!loop) loop = it;
      } else if (!best) {
        best = it;
      }
    }
  }
  const struct ifaddrs* pick = best ? best : (want ? best6 : loop);
  ncclxResult_t res = ncclxSuccess;
  if (!pick) {
    if (want) {
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
               "NET/Socket: ifname = '%s' (%s): no such interface with an IP address "
               "(interfaces with addresses: %s)", want, configWhere(env, "ifname", want), names);
      res = ncclxInvalidUsage;
    } else {
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET, __FILE__, __LINE__,
               "NET/Socket: no UP IPv4 interface found (not even loopback); set ifname");
      res = ncclxSystemError;
    }
  } else {
    if (!(pick->ifa_flags & IFF_UP))
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET, __FILE__, __LINE__,
               "NET/Socket: interface %s is down; connections will fail until it is up",
               pick->ifa_name);
    snprintf(ctx->ifname, sizeof(ctx->ifname), "%s", pick->ifa_name);
    memset(&ctx->addr, 0, sizeof(ctx->addr));
    memcpy(&ctx->addr, pick->ifa_addr,
           pick->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in));
    if (ctx->addr.sa.sa_family == AF_INET) ctx->addr.in4.sin_port = 0;
    else ctx->addr.in6.sin6_port = 0;
    ctx->latencyUs = (pick->ifa_flags & IFF_LOOPBACK) ? 10.0f : 50.0f;
  }
  freeifaddrs(list);
  return res;
}

static int readSpeedMbps(const char* ifname) {
  char path[128];
  snprintf(path, sizeof(path), "/sys/class/net/%s/speed", ifname);
  FILE* f = fopen(path, "r");
  int v = 0;
  if (f) {
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
  }
  return v > 0 ? v : 10000; /* virtual and loopback devices report nothing useful */
}

static char* readPciPath(const char* ifname) {
  char path[128], real[PATH_MAX];
  snprintf(path, sizeof(path), "/sys/class/net/%s/device", ifname);
  if (!realpath(path, real)) return NULL;
  return strdup(real);
}

static long readProcLong(const char* path) {
  FILE* f = fopen(path, "r");
  long v = -1;
  if (f) {
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
  }
  return v;
}

/* Setting SO_*BUF turns kernel autotuning off, and without CAP_NET_ADMIN the kernel caps it
 * at net.core.*mem_max (often 208 KiB): then autotuning is the faster choice. */
static void checkBufferLimit(sockCtx* ctx) {
  if (ctx->bufBytes == 0) return;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  int v = (int)ctx->bufBytes;
  int canForce = setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) == 0;
  close(fd);
  if (canForce) return;
  long rmax = readProcLong("/proc/sys/net/core/rmem_max");
  long wmax = readProcLong("/proc/sys/net/core/wmem_max");
  if ((rmax >= 0 && (size_t)rmax < ctx->bufBytes) || (wmax >= 0 && (size_t)wmax < ctx->bufBytes)) {
    SOCK_INFO(ctx, "buffer_bytes %zu exceeds net.core.rmem_max/wmem_max (%ld/%ld) and "
              "CAP_NET_ADMIN is missing; leaving socket buffers to kernel autotuning",
              ctx->bufBytes, rmax, wmax);
    ctx->bufBytes = 0;
  }
}

ncclxResult_t sockInit(void** ctxOut, const ncclxPluginEnv_t* env) {
  if (!ctxOut || !env || !env->log || !env->config || !env->config->get) return ncclxInternalError;
  *ctxOut = NULL;
  warnUnknownKeys(env);

  /* An empty value ("nsocks =") means the default, as for ifname. */
  long nsocks = SOCK_DEFAULT_SOCKS;
  const char* v = env->config->get(env->section, "nsocks");
  if (v && *v && (parseLong(v, &nsocks) != 0 || nsocks < 1 || nsocks > SOCK_MAX_SOCKS)) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
             "NET/Socket: nsocks = '%s' (%s): expected an integer from 1 to %d", v,
             configWhere(env, "nsocks", v), SOCK_MAX_SOCKS);
    return ncclxInvalidUsage;
  }
  size_t bufBytes = SOCK_DEFAULT_BUF_BYTES;
  v = env->config->get(env->section, "buffer_bytes");
  if (v && *v && (ncclxParseSize(v, &bufBytes) != 0 || (bufBytes != 0 && bufBytes < 4096) ||
            bufBytes > ((size_t)1 << 30))) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
             "NET/Socket: buffer_bytes = '%s' (%s): expected 0 (kernel autotuning) or a size "
             "from 4K to 1G, e.g. 4194304 or 4M", v, configWhere(env, "buffer_bytes", v));
    return ncclxInvalidUsage;
  }

  sockCtx* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return ncclxSystemError;
  ctx->log = env->log;
  ctx->nsocks = (int)nsocks;
  ctx->bufBytes = bufBytes;
  const char* ifname = env->config->get(env->section, "ifname");
  if (ifname && !*ifname) ifname = NULL;
  ncclxResult_t res = pickInterface(env, ifname, ctx);
  if (res != ncclxSuccess) {
    free(ctx);
    return res;
  }
  ctx->speedMbps = readSpeedMbps(ctx->ifname);
  ctx->pciPath = readPciPath(ctx->ifname);
  ctx->guid = (uint64_t)if_nametoindex(ctx->ifname) | ((uint64_t)SOCK_HANDLE_MAGIC << 32);
  checkBufferLimit(ctx);
  pthread_mutex_init(&ctx->lock, NULL);

  char addr[SOCK_ADDR_STR];
  sockAddrFormat(&ctx->addr, addr, sizeof(addr));
  SOCK_INFO(ctx, "using %s (%s, %d Mb/s), %d socket%s per connection, socket buffers %zu bytes%s",
            ctx->ifname, addr, ctx->speedMbps, ctx->nsocks, ctx->nsocks == 1 ? "" : "s",
            ctx->bufBytes, ctx->bufBytes ? "" : " (autotuned)");
  *ctxOut = ctx;
  return ncclxSuccess;
}
