/* Growable text buffer and whole-file writes for the trace plugin. */
#include "trace_buf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void tbInit(TraceBuf* b) { memset(b, 0, sizeof(*b)); }

void tbFree(TraceBuf* b) {
  free(b->p);
  tbInit(b);
}

static int tbReserve(TraceBuf* b, size_t extra) {
  if (b->oom) return -1;
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra + 1) cap *= 2;
  char* p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

char* tbSpace(TraceBuf* b, size_t n) { return tbReserve(b, n) == 0 ? b->p + b->len : NULL; }

void tbCommit(TraceBuf* b, char* end) {
  b->len = (size_t)(end - b->p);
  b->p[b->len] = '\0';
}

void tbPrintf(TraceBuf* b, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0 || tbReserve(b, (size_t)n) != 0) return;
  if ((size_t)n < sizeof(small)) {
    memcpy(b->p + b->len, small, (size_t)n + 1);
  } else {
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  b->len += (size_t)n;
}

void tbString(TraceBuf* b, const char* s) {
  if (!s) {
    tbPrintf(b, "null");
    return;
  }
  if (tbReserve(b, strlen(s) * 6 + 2) != 0) return;
  char* o = b->p + b->len;
  *o++ = '"';
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      *o++ = '\\';
      *o++ = (char)ch;
    } else if (ch < 0x20 || ch == 0x7f) {
      o += sprintf(o, "\\u%04x", ch);
    } else {
      *o++ = (char)ch;
    }
  }
  *o++ = '"';
  *o = '\0';
  b->len = (size_t)(o - b->p);
}

int tbWriteFd(int fd, const TraceBuf* b) {
  size_t off = 0;
  while (off < b->len) {
    ssize_t n = write(fd, b->p + off, b->len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    off += (size_t)n;
  }
  return 0;
}

int tbWriteFile(const TraceBuf* b, const char* path) {
  if (b->oom) {
    errno = ENOMEM;
    return -1;
  }
  char tmp[4200];
  if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid()) >= sizeof(tmp)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  int rc = tbWriteFd(fd, b);
  int saved = errno;
  if (close(fd) != 0 && rc == 0) rc = -1, saved = errno;
  if (rc == 0 && rename(tmp, path) != 0) rc = -1, saved = errno;
  if (rc != 0) unlink(tmp);
  errno = saved;
  return rc;
}
