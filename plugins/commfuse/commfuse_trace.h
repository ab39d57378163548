/* CommFuse timeline tracing, compiled in only with -DNCCLX_FUSE_TRACE (a diagnosis aid):
 * FUSE_TRACE(what, a, b) records (CLOCK_MONOTONIC time, label, two numbers) from any
 * thread into a per-process buffer; fuseTraceDump prints and clears it on stderr. Every
 * rank of one host uses the same clock, so the lines of all ranks can be merged by time. */
#ifndef NCCLX_COMMFUSE_TRACE_H
#define NCCLX_COMMFUSE_TRACE_H

#ifdef NCCLX_FUSE_TRACE
void fuseTraceMark(const char* what, int a, int b);
void fuseTraceDump(int rank, const char* opName, int algo, int pieces);
#define FUSE_TRACE(what, a, b) fuseTraceMark((what), (a), (b))
#define FUSE_TRACE_DUMP(rank, name, algo, pieces) fuseTraceDump((rank), (name), (algo), (pieces))
#else
#define FUSE_TRACE(what, a, b) ((void)0)
#define FUSE_TRACE_DUMP(rank, name, algo, pieces) ((void)0)
#endif
#endif
