/* The TCP side channel ("out of band") that carries connection info between the two ends of
 * a net_ib connection, plus small OS helpers. Every call is non-blocking; no verbs here, so
 * tests/ib exercises it on 127.0.0.1. After the handshake the socket stays open only to
 * notice a dead peer early (EOF) instead of after the RDMA retry timeouts. */
#ifndef NCCLX_IB_OOB_H
#define NCCLX_IB_OOB_H

#include <netinet/in.h>
#include <sys/socket.h>

#include "ib_common.h"

typedef union {
  struct sockaddr sa;
  struct sockaddr_in in4;
  struct sockaddr_in6 in6;
} ibSockAddr;

/* ifname "" or NULL: first UP non-loopback interface with IPv4, else loopback. Otherwise that
 * interface's IPv4 address, else a global IPv6 one. 0, or -1 with why. */
int ibOobPickAddr(const char* ifname, ibSockAddr* out, char* ifOut, size_t ifLen, char* why,
                  size_t whyLen);
/* Listening socket on local's address, any port; *bound gets the port. fd, or -1 (errno). */
int ibOobListen(const ibSockAddr* local, ibSockAddr* bound);
/* Non-blocking connect started: fd, or -1 (errno). */
int ibOobConnectStart(const ibSockAddr* remote);
/* 1 connected, 0 still connecting, -1 failed (errno). */
int ibOobConnectCheck(int fd);
/* An accepted non-blocking socket, or -1 with errno (EAGAIN: nobody waiting). */
int ibOobAccept(int listenFd, ibSockAddr* peer);
/* Move buf[*off, len) without blocking. 1 complete, 0 would block, -1 failed (errno;
 * ECONNRESET when the peer closed). */
int ibOobSend(int fd, const void* buf, size_t len, size_t* off);
int ibOobRecv(int fd, void* buf, size_t len, size_t* off);
/* After the handshake nothing more is sent: 0 alive, 1 closed or failed, 2 unexpected bytes. */
int ibOobPeerState(int fd);

void ibOobFormat(const ibSockAddr* a, char* buf, size_t len);
void ibOobToWire(const ibSockAddr* a, int* family, uint8_t addr[16], uint16_t* port);
int ibOobFromWire(int family, const uint8_t addr[16], uint16_t port, ibSockAddr* out);

uint64_t ibNowNs(void);
uint64_t ibRandom64(void);

#endif
