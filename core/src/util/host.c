/* Facts about the host this process runs on. */
#include "util/host.h"

#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

int hostCpus(void) {
  static atomic_int cpus; /* CPUs the host's ranks may run on, counted once */
  int c = atomic_load_explicit(&cpus, memory_order_relaxed);
  if (c == 0) {
    /* A process bound to a single CPU was pinned by its launcher (mpirun --bind-to core,
     * ncclx-perf -np), one or more ranks per CPU: count the host's CPUs then. Counting its
     * own mask made every pinned rank think it was oversubscribed and yield after 4 polls
     * (146k sched_yield calls in 200k 8-byte allreduces at 2 ranks: 0.64 us instead of
     * 0.37 us). A mask of several CPUs is the job's share of the host. */
    cpu_set_t set;
    c = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    if (c <= 1) c = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (c <= 0) c = 1;
    atomic_store_explicit(&cpus, c, memory_order_relaxed);
  }
  return c;
}
