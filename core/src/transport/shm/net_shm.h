/*
 * The intra-host shared-memory transport, network plugin name "shm".
 *
 * It implements the network plugin ABI (ncclx/net.h), so the progress engine drives it like
 * any network; the core uses it for peers on the same host. Built into the core as
 * ncclxNetShm, or with -DNCCLX_NET_SHM_STANDALONE (net_shm.c + shm_*.c) into a plugin that
 * exports ncclxNetPlugin_v1. It uses only libc, the public headers and env->log/config.
 *
 * Connections. listen() creates /dev/shm/ncclx-<pid>-<hex> holding 64 mailboxes; the handle
 * carries its name, a random nonce and the listener's pid. connect() creates the connection
 * segment (ring of slots) and two doorbell FIFOs, posts their name in a mailbox and returns
 * at once. accept() checks the nonce (a handle of another job is refused), maps the segment,
 * unlinks every name (a crash leaves nothing in /dev/shm), and chooses the copy mode.
 * As with TCP, small messages sent before the accept still arrive if the sender closes
 * first: its names then stay until the receiver accepts, or its closeListen() removes them.
 * init() removes /dev/shm/ncclx-<pid>-* objects whose creator pid no longer exists.
 *
 * Messages (in order, one ring per connection; see shm_data.c):
 *   <= slot size:           copied into a slot and out again; <= 32 B ride with the flag.
 *   larger, in an ncclxMemAlloc buffer of the sender: the receiver maps that allocation (a
 *                           memfd, opened through /proc/<pid>/fd, cached per connection) and
 *                           copies the message out with one memcpy (SHM_MSG_MAPPED).
 *   larger, CMA available:  the receiver reads the sender's buffer with process_vm_readv
 *                           (in cma_chunk_bytes pieces) straight into the user buffer,
 *                           unless the core asked this connection for double copy.
 *   larger, otherwise:      pipelined through the ring in slot-sized fragments.
 * Which of the last two is faster depends on the host: in this VM process_vm_readv copies at
 * ~11 GB/s (page pinning per call) where memcpy runs at ~40 GB/s in cache, so two pipelined
 * copies on two cores beat one CMA copy 1.3-2x when every rank has a CPU of its own; with
 * ranks waiting for CPUs, the receiver pulling alone (the sender need not run) pays off.
 * A receive may be larger than the send (test() reports the real size); a send larger than
 * the posted receive fails the receiver (and a CMA sender) with ncclxRemoteError.
 *
 * Waiting: no system call on the fast path. After >= 128 consecutive test() calls without
 * progress spanning >= 50 us, a side sets its "sleeping" flag; the peer then writes one byte
 * to the doorbell FIFO that getPollFd returns (an epoll set with the peer's pidfd, so a
 * sleeper also wakes when the peer dies) the next time it publishes, consumes or acks. So a
 * caller must test() for ~50 us before sleeping in poll() (xfer.c spins and yields far
 * longer); one that polls sooner is woken late, bounded by its poll timeout. While idle,
 * test() checks every 5 ms (1 ms once armed) that the peer process still exists (pidfd,
 * else kill + /proc) and has not closed the connection, else fails with ncclxRemoteError.
 * Limitation: peers must share the pid namespace (the pid in the handle must name the
 * peer; otherwise it looks dead) as well as /dev/shm.
 *
 * [net.shm] keys (environment NCCLX_NET_SHM_<KEY>):
 *   buffer_bytes     payload area of one connection, split into `slots` slots. Size,
 *                    64K .. 1G. Default 1M: 16 slots of 64 KiB, 1.0 MiB of shared memory per
 *                    connection, created by the sender. At 8 ranks a rank creates 7 of them
 *                    per communicator: ~7.1 MiB per rank (each mapped by both ends).
 *   slots            slots per connection, a power of two 4 .. 4096. Default 16.
 *   single_copy      auto (mapped ncclxMemAlloc buffers when the receiver can open them,
 *                    probed on each connection; CMA when process_vm_readv works, probed
 *                    likewise, and the core wants it: see ncclxShmPreferCopy),
 *                    cma (required: a connection where it fails is refused with
 *                    ncclxInvalidUsage; mapped buffers as with auto), none (always double
 *                    copy, never mapped). Default auto. Either side's "none" wins.
 *   cma_chunk_bytes  bytes per process_vm_readv call. Size, 4K .. 1G. Default 1M.
 */
#ifndef NCCLX_NET_SHM_H
#define NCCLX_NET_SHM_H

#include "ncclx/net.h"

extern const ncclxNet_v1_t ncclxNetShm;

/* ncclxMemAlloc's allocations of NCCLX_SHM_MAPPED_MIN bytes or more: memory behind a memfd,
 * which a same-host receiver maps to copy a message out with one memcpy (shm_mem.c). NULL
 * when the system refuses one (the caller then uses ordinary memory). Such memory is shared
 * with a child forked after the allocation, like any MAP_SHARED mapping. From 4 KiB, the
 * smallest message that goes mapped (2 ranks, all-to-all of a 32 KiB buffer: 1.1 us against
 * 3.4 through the slots); each such allocation takes a page at least and a descriptor. */
#define NCCLX_SHM_MAPPED_MIN ((size_t)4 << 10)
void* ncclxShmMemAlloc(size_t bytes);
/* Releases p and returns 1 when ncclxShmMemAlloc made it, else returns 0. */
int ncclxShmMemFree(void* p);

/* The core's word for a sendComm: do the host's ranks share CPUs? A message in a mapped
 * ncclxMemAlloc buffer makes its sender wait until the receiver has copied it out, where one
 * that fits the ring's slots frees the sender once copied in. With ranks waiting for CPUs that
 * wait chains ring steps together (4 ranks on 2 CPUs, allreduce 512 KiB-2 MiB: 2x slower
 * mapped), so there only messages larger than the ring go mapped; with a CPU each, every
 * message of 4 KiB or more does (SHM_MAPPED_MIN_BYTES), slot-sized ones included (see
 * ncclxShmSendKind for the exceptions). */
void ncclxShmSharedCpus(void* sendComm, int shared);

/* The core's word for the next message it posts on sendComm (consumed by that isend):
 *   NCCLX_SHM_SEND_COLL      a collective's step (the default);
 *   NCCLX_SHM_SEND_EXCHANGE  part of an exchange where every send and receive stands posted
 *                            at once and nothing received is forwarded (a linear all-to-all,
 *                            or the linear reduce-scatter, all-gather and all-reduce),
 *                            so a mapped send's wait for the receiver's copy chains nothing:
 *                            it goes mapped from 8 KiB even where ranks share CPUs (4 ranks on
 *                            2 CPUs, all-to-all 1 MiB: 82 us against 190 through the ring;
 *                            256 KiB: 16 against 50);
 *   NCCLX_SHM_SEND_USER      the application's ncclxSend: while a slot holds it, it is copied
 *                            in and done, whatever the buffer, so that up to a slot a send
 *                            not grouped with its receive behaves the same on every host. */
enum { NCCLX_SHM_SEND_COLL = 0, NCCLX_SHM_SEND_EXCHANGE = 1, NCCLX_SHM_SEND_USER = 2 };
void ncclxShmSendKind(void* sendComm, int kind);

/* Test hook: 1 when large messages from mapped ncclxMemAlloc buffers are possible on a
 * sendComm or recvComm (both sides agreed at accept), 0 when not (or not known yet), -1 when
 * comm is not a shm comm. */
int ncclxShmCommMapped(void* comm);

/* Test hook: messages a sendComm sent, or a recvComm received, through mapped buffers; -1
 * when comm is not a shm comm. */
long long ncclxShmCommMappedMessages(void* comm);

/* Test hook: copy mode of a sendComm or recvComm: 1 single copy (CMA), 2 double copy,
 * 0 not known yet (a sendComm whose receiver has not accepted), -1 not a shm comm. */
int ncclxShmCommMode(void* comm);

/* This host's process_vm_readv and memcpy speeds (GB/s), measured once per process on 1 MiB
 * of ordinary memory: 0, or -1 when process_vm_readv does not work here (api/comm_lifecycle.c decides). */
int ncclxShmCmaSpeed(double* cmaGBps, double* copyGBps);

/* The core's choice for a sendComm under single_copy = auto: prefer != 0 sends large messages
 * through the ring even when CMA works (peers.c: when the host has CPUs for its ranks). */
void ncclxShmPreferCopy(void* sendComm, int prefer);

#endif
