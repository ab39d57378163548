/* A growable text buffer for building JSON off the hot path (trace batches, dumps, metrics). */
#ifndef NCCLX_PROFILER_TRACE_BUF_H
#define NCCLX_PROFILER_TRACE_BUF_H

#include <stddef.h>

typedef struct {
  char* p;
  size_t len, cap;
  int oom; /* an allocation failed: the content is incomplete */
} TraceBuf;

void tbInit(TraceBuf* b);
void tbFree(TraceBuf* b);
void tbPrintf(TraceBuf* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* Room for `n` more bytes at the end (NULL when out of memory); write there, then
 * tbCommit with the new end. For the trace writer's hand-made formatting. */
char* tbSpace(TraceBuf* b, size_t n);
void tbCommit(TraceBuf* b, char* end);
/* A JSON string literal with quotes; NULL becomes null. */
void tbString(TraceBuf* b, const char* s);
/* All of it to fd, retrying short writes; 0 or -1. */
int tbWriteFd(int fd, const TraceBuf* b);
/* To path through a temporary file and rename, so a reader never sees half a file;
 * 0 or -1 with errno set. */
int tbWriteFile(const TraceBuf* b, const char* path);

#endif
