/* Process-wide part of the trace plugin: the list of communicators, the one background
 * thread (writes buffered trace records, runs the watchdog, serves SIGUSR1) and the signal
 * handler. The thread starts with the first communicator and is joined when the last one
 * finalizes, so the plugin never keeps a process alive and is idle before it is unloaded.
 *
 * The SIGUSR1 handler only writes a byte to a pipe (async-signal-safe); the thread does the
 * I/O. A handler the application had installed is still called. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "trace.h"

static pthread_mutex_t lifeLock = PTHREAD_MUTEX_INITIALIZER; /* add/remove, start/join */
static pthread_mutex_t listLock = PTHREAD_MUTEX_INITIALIZER; /* the list; held by the thread */
static TraceComm* comms;
static int ncomms;
static long tickMs = 100;
static int stopping;
static pthread_t thread;
static int wakePipe[2] = {-1, -1};
static int signalFd = -1; /* read by the handler: the pipe's write end or -1 */
static int signalInstalled;
static struct sigaction previousAction;

static void poke(char what) {
  int fd = __atomic_load_n(&signalFd, __ATOMIC_RELAXED);
  if (fd < 0) return;
  ssize_t rc = write(fd, &what, 1); /* a full pipe already holds a wake-up */
  (void)rc;
}

void traceGlobalWake(void) { poke('W'); }

static void onSignal(int sig, siginfo_t* info, void* uctx) {
  int saved = errno;
  poke('S');
  if (previousAction.sa_flags & SA_SIGINFO) {
    if (previousAction.sa_sigaction) previousAction.sa_sigaction(sig, info, uctx);
  } else if (previousAction.sa_handler != SIG_DFL && previousAction.sa_handler != SIG_IGN) {
    previousAction.sa_handler(sig);
  }
  errno = saved;
}

static void dumpOnSignal(TraceComm* c) {
  char path[TRACE_PATH_MAX + 64];
  tracePathFor(c, "dump", "json", path, sizeof(path));
  if (traceDumpWrite(c, path, "SIGUSR1") == 0)
    traceLog(&c->env, NCCLX_LOG_WARN, "SIGUSR1: state of comm %016llx rank %d written to %s",
             (unsigned long long)c->commHash, c->rank, path);
}

static void* threadMain(void* arg) {
  (void)arg;
  /* Background work: yield the CPU to the ranks' own threads when they want it (a full ring
   * makes the hot path write its batch itself, so nothing is lost by running late). On
   * Linux the nice value is per thread. */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  for (;;) {
    struct pollfd p = {wakePipe[0], POLLIN, 0};
    int rc = poll(&p, 1, (int)__atomic_load_n(&tickMs, __ATOMIC_RELAXED));
    int sig = 0;
    if (rc > 0 && (p.revents & POLLIN)) {
      char buf[64];
      ssize_t n;
      while ((n = read(wakePipe[0], buf, sizeof(buf))) > 0)
        for (ssize_t i = 0; i < n; i++) sig |= buf[i] == 'S';
    }
    traceClockRefine(); /* keeps the stamps' conversion on CLOCK_MONOTONIC */
    pthread_mutex_lock(&listLock);
    int quit = stopping;
    uint64_t now = traceStamp();
    for (TraceComm* c = comms; c; c = c->next) {
      traceDrain(c);
      if (sig) dumpOnSignal(c);
      traceWatchdogCheck(c, now);
    }
    pthread_mutex_unlock(&listLock);
    if (quit) return NULL;
  }
}

static int startThread(const ncclxPluginEnv_t* env) {
  if (pipe2(wakePipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    traceLog(env, NCCLX_LOG_WARN, "cannot create the wake-up pipe: %s", strerror(errno));
    return -1;
  }
  stopping = 0;
  /* The thread takes no signals: they belong to the application's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&thread, NULL, threadMain, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    traceLog(env, NCCLX_LOG_WARN, "cannot start the writer/watchdog thread: %s", strerror(rc));
    close(wakePipe[0]), close(wakePipe[1]);
    wakePipe[0] = wakePipe[1] = -1;
    return -1;
  }
  __atomic_store_n(&signalFd, wakePipe[1], __ATOMIC_RELAXED);
  return 0;
}

static void installSignal(const ncclxPluginEnv_t* env) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = onSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR1, &sa, &previousAction) != 0) {
    traceLog(env, NCCLX_LOG_WARN, "cannot install the SIGUSR1 handler: %s", strerror(errno));
    return;
  }
  signalInstalled = 1;
}

static void restoreSignal(void) {
  if (!signalInstalled) return;
  struct sigaction now;
  /* Leave a handler installed after ours alone. */
  if (sigaction(SIGUSR1, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == onSignal)
    sigaction(SIGUSR1, &previousAction, NULL);
  signalInstalled = 0;
}

int traceGlobalAdd(TraceComm* c) {
  pthread_mutex_lock(&lifeLock);
  if (ncomms == 0 && startThread(&c->env) != 0) {
    pthread_mutex_unlock(&lifeLock);
    return -1;
  }
  if (c->cfg.signal && !signalInstalled) installSignal(&c->env);
  pthread_mutex_lock(&listLock);
  c->next = comms;
  comms = c;
  ncomms++;
  long tick = c->cfg.flushMs;
  if (c->cfg.watchdogMs > 0 && c->cfg.watchdogMs / 4 < tick) tick = c->cfg.watchdogMs / 4 > 0 ? c->cfg.watchdogMs / 4 : 1;
  if (ncomms == 1 || tick < tickMs) __atomic_store_n(&tickMs, tick, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&listLock);
  pthread_mutex_unlock(&lifeLock);
  return 0;
}

void traceGlobalRemove(TraceComm* c) {
  pthread_mutex_lock(&lifeLock);
  pthread_mutex_lock(&listLock);
  for (TraceComm** p = &comms; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      ncomms--;
      break;
    }
  int last = ncomms == 0;
  if (last) stopping = 1;
  pthread_mutex_unlock(&listLock);
  if (last) {
    restoreSignal();
    poke('Q');
    pthread_join(thread, NULL);
    __atomic_store_n(&signalFd, -1, __ATOMIC_RELAXED);
    close(wakePipe[0]), close(wakePipe[1]);
    wakePipe[0] = wakePipe[1] = -1;
  }
  pthread_mutex_unlock(&lifeLock);
}
