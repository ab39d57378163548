/* Facts about the host this process runs on. */
#ifndef NCCLX_UTIL_HOST_H
#define NCCLX_UTIL_HOST_H

/* CPUs this process's ranks may run on (its affinity mask, or the host's CPUs when a
 * launcher pinned it to one), counted once per process. */
int hostCpus(void);

#endif
