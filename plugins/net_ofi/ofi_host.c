/* Process identity: lets a comm tell whether a peer on the same host still exists, which
 * libfabric cannot always tell (a posted receive is not tied to any connection). And the
 * name of a peer's socket address, for messages. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ofi_internal.h"

/* Field 22 of /proc/PID/stat (start time, clock ticks since boot); 0 when unreadable.
 * *missing = 1 when the process does not exist. */
static uint64_t procStartTime(unsigned pid, int* missing) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%u/stat", pid);
  *missing = 0;
  FILE* f = fopen(path, "r");
  if (!f) {
    *missing = 1;
    return 0;
  }
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* The command name (field 2) may hold spaces and parentheses: count from the last ')'. */
  char* p = strrchr(buf, ')');
  if (!p) return 0;
  p++;
  for (int field = 3; field < 22 && p; field++) p = strchr(p + 1, ' ');
  if (!p) return 0;
  /* A zombie (state Z, field 3) has exited even though /proc still shows it. */
  char* state = strrchr(buf, ')') + 2;
  if (*state == 'Z' || *state == 'X') *missing = 1;
  return strtoull(p + 1, NULL, 10);
}

void ofiIdentityOfSelf(ofiIdentity* id) {
  memset(id, 0, sizeof(*id));
  char boot[64] = "";
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof(boot), f)) boot[0] = '\0';
    fclose(f);
  }
  struct stat st;
  uint64_t pidns = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
  /* Without a boot id we cannot prove two processes share a host: leave the hash 0,
   * which ofiPeerAlive treats as "cannot tell". */
  if (boot[0]) id->hostHash = ofiHash(ofiHash(0, boot, strlen(boot)), &pidns, sizeof(pidns));
  id->pid = (uint32_t)getpid();
  int missing = 0;
  id->startTime = procStartTime(id->pid, &missing);
}

int ofiPeerAlive(const ofiIdentity* self, const ofiIdentity* peer) {
  if (self->hostHash == 0 || peer->hostHash != self->hostHash || peer->pid == 0) return -1;
  int missing = 0;
  uint64_t start = procStartTime(peer->pid, &missing);
  if (missing) return 0;
  if (start != 0 && peer->startTime != 0 && start != peer->startTime) return 0; /* pid reused */
  return 1;
}

int ofiFormatSockaddr(const void* addr, size_t len, char* out, size_t size) {
  char ip[INET6_ADDRSTRLEN];
  struct sockaddr_storage ss;
  if (len < sizeof(struct sockaddr_in) || len > sizeof(ss)) return 0;
  memcpy(&ss, addr, len); /* handles carry addresses unaligned */
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in* a = (const struct sockaddr_in*)&ss;
    if (!inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip))) return 0;
    snprintf(out, size, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    return 1;
  }
  if (ss.ss_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    const struct sockaddr_in6* a = (const struct sockaddr_in6*)&ss;
    if (!inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip))) return 0;
    snprintf(out, size, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    return 1;
  }
  return 0;
}
