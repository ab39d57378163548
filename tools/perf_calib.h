/* ncclx-perf --calibrate: measures the constants of the default tuner's cost model on this
 * cluster and writes them as a file for `[tuner] model = PATH`.
 *
 *   alpha, beta per transport: send/recv ping-pong between rank 0 and one peer reached over
 *     shared memory and one reached over the network (whichever exist), one-way time =
 *     median round trip / 2 at each size, then a least-squares fit t = alpha + beta * bytes
 *     weighted by 1/t^2 (relative error: small sizes fix alpha, large ones beta).
 *   gamma: the core's float sum kernel on rank 0, fitted the same way.
 * Included by ncclx-perf.c only. */
#ifndef NCCLX_PERF_CALIB_H
#define NCCLX_PERF_CALIB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf_hooks.h"
#include "perf_ops.h"

#define PERF_MAX_SIZES 64

typedef struct {
  int n;
  double bytes[PERF_MAX_SIZES], us[PERF_MAX_SIZES];
  double alpha, beta;
} PerfFit;

/* "1.23 1.10 0.98" from /proc/loadavg, or "unknown": every figure is printed with it. */
static const char* perfLoadAvg(void) {
  static char buf[64];
  snprintf(buf, sizeof buf, "unknown");
  FILE* f = fopen("/proc/loadavg", "r");
  if (!f) return buf;
  double a, b, c;
  if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
  fclose(f);
  return buf;
}

static double perfMedian(double* v, long n) {
  qsort(v, (size_t)n, sizeof(double), perfCmpDouble);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Weighted least squares of us = alpha + beta * bytes, weights 1/us^2; both kept >= 0. */
static void perfFitLine(PerfFit* f) {
  double s = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < f->n; i++) {
    double w = 1.0 / (f->us[i] * f->us[i] + 1e-12), x = f->bytes[i], y = f->us[i];
    s += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  double det = s * sxx - sx * sx;
  f->beta = det > 0 ? (s * sxy - sx * sy) / det : 0;
  if (f->beta < 0) f->beta = 0;
  f->alpha = s > 0 ? (sy - f->beta * sx) / s : 0;
  if (f->alpha < 0) {
    /* Refit beta through the origin. */
    f->alpha = 0;
    f->beta = sxx > 0 ? sxy / sxx : 0;
  }
}

static void perfPrintFit(const char* what, const PerfFit* f) {
  printf("#%11s  %12s  %10s  %7s\n", "size(B)", "measured(us)", "fit(us)", "error");
  for (int i = 0; i < f->n; i++) {
    double fit = f->alpha + f->beta * f->bytes[i];
    printf("%12.0f  %12.3f  %10.3f  %+6.1f%%\n", f->bytes[i], f->us[i], fit,
           f->us[i] > 0 ? 100.0 * (fit - f->us[i]) / f->us[i] : 0.0);
  }
  printf("# %s: alpha %.3f us, beta %.6g us/B (%.2f GB/s)\n", what, f->alpha, f->beta,
         f->beta > 0 ? 1e-3 / f->beta : 0.0);
}

/* One-way times between rank 0 and peer at every size; rank 0 gets the medians in *fit. */
static void perfPingPong(PerfCtx* c, int peer, PerfFit* fit) {
  const PerfOptions* o = c->opt;
  int me = c->rank;
  fit->n = 0;
  for (size_t size = o->minBytes;; size *= o->factor) {
    if (me == 0 || me == peer) {
      int other = me == 0 ? peer : 0;
      for (long k = -o->warmup; k < o->iters; k++) {
        double t0 = perfNowUs();
        if (me == 0) {
          PERF_CHECK(c, ncclxSend(c->sendbuf, size, ncclxUint8, other, c->comm, NULL));
          PERF_CHECK(c, ncclxRecv(c->recvbuf, size, ncclxUint8, other, c->comm, NULL));
        } else {
          PERF_CHECK(c, ncclxRecv(c->recvbuf, size, ncclxUint8, other, c->comm, NULL));
          PERF_CHECK(c, ncclxSend(c->sendbuf, size, ncclxUint8, other, c->comm, NULL));
        }
        if (k >= 0) c->samples[k] = (perfNowUs() - t0) / 2;
      }
      if (me == 0 && fit->n < PERF_MAX_SIZES) {
        fit->bytes[fit->n] = (double)size;
        fit->us[fit->n++] = perfMedian(c->samples, o->iters);
      }
    }
    if (size > o->maxBytes / o->factor) break;
  }
  PERF_CHECK(c, ncclxBarrier(c->comm, NULL));
}

/* gamma on rank 0: dst += src over float buffers, sizes from 1 KiB (below that it is all
 * call overhead) to -e. */
static void perfReduceRate(PerfCtx* c, PerfFit* fit) {
  const PerfOptions* o = c->opt;
  fit->n = 0;
  memset(c->sendbuf, 0, o->maxBytes);
  memset(c->recvbuf, 0, o->maxBytes);
  for (size_t size = o->minBytes;; size *= o->factor) {
    size_t count = size / sizeof(float);
    if (size >= 1024 && count > 0 && fit->n < PERF_MAX_SIZES) {
      for (long k = -o->warmup; k < o->iters; k++) {
        double t0 = perfNowUs();
        ncclxTuneToolReduce(c->recvbuf, c->sendbuf, count, ncclxFloat32);
        if (k >= 0) c->samples[k] = perfNowUs() - t0;
      }
      fit->bytes[fit->n] = (double)(count * sizeof(float));
      fit->us[fit->n++] = perfMedian(c->samples, o->iters);
    }
    if (size > o->maxBytes / o->factor) break;
  }
  perfFitLine(fit);
}

static int perfWriteModel(const PerfOptions* o, int nranks, int nhosts, const PerfFit* shm,
                          const PerfFit* net, const PerfFit* gamma, const char* load) {
  FILE* f = fopen(o->outPath, "w");
  if (!f) {
    fprintf(stderr, "ncclx-perf: cannot write the model to '%s': %s\n", o->outPath,
            strerror(errno));
    return -1;
  }
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  time_t now = time(NULL);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
  fprintf(f, "# ncclx cost model, written by ncclx-perf --calibrate on %s at %s\n", host, when);
  fprintf(f, "# %d ranks, %d host(s), sizes %zu..%zu x%zu, median of %ld, load average %s\n",
          nranks, nhosts, o->minBytes, o->maxBytes, o->factor, o->iters, load);
  fprintf(f, "# Use it with [tuner] model = PATH (or NCCLX_TUNER_MODEL=PATH). A transport not\n"
             "# measured here keeps the built-in constants.\n");
  if (shm->n)
    fprintf(f, "shm.alpha_us = %.4g\nshm.beta_us_per_byte = %.6g\n", shm->alpha, shm->beta);
  if (net->n)
    fprintf(f, "net.alpha_us = %.4g\nnet.beta_us_per_byte = %.6g\n", net->alpha, net->beta);
  if (gamma->n) fprintf(f, "gamma_us_per_byte = %.6g\n", gamma->beta);
  if (fclose(f) != 0) {
    fprintf(stderr, "ncclx-perf: writing '%s' failed: %s\n", o->outPath, strerror(errno));
    return -1;
  }
  return 0;
}

/* Returns the process exit status. */
static int perfCalibrate(PerfCtx* c) {
  const PerfOptions* o = c->opt;
  int nhosts = 1;
  int* tp = calloc((size_t)c->nranks, sizeof(int));
  if (!tp || ncclxTuneToolCommTopo(c->comm, &nhosts, NULL, tp, NULL) != 0) {
    fprintf(stderr, "ncclx-perf: cannot read the communicator's transports\n");
    ncclxCommAbort(c->comm);
    exit(1);
  }
  /* Rank 0's first peer of each kind; broadcast so every rank follows the same plan. */
  int32_t peers[2] = {-1, -1}; /* shm, net */
  for (int p = 1; p < c->nranks; p++) {
    int kind = tp[p] == PERF_TP_SHM ? 0 : 1;
    if (peers[kind] < 0) peers[kind] = p;
  }
  free(tp);
  PERF_CHECK(c, ncclxBroadcast(peers, peers, 2, ncclxInt32, 0, c->comm, NULL));
  const char* load = perfLoadAvg();
  if (c->rank == 0)
    printf("# ncclx-perf --calibrate: nranks %d, nhosts %d, sizes %zu..%zu x%zu, median of %ld "
           "(warmup %ld), load average %s\n",
           c->nranks, nhosts, o->minBytes, o->maxBytes, o->factor, o->iters, o->warmup, load);
  PerfFit fits[2];
  memset(fits, 0, sizeof fits);
  static const char* const names[2] = {"shm", "net"};
  for (int k = 0; k < 2; k++) {
    if (peers[k] < 0) {
      if (c->rank == 0)
        printf("# %s: no peer of rank 0 uses it%s; its constants stay built-in\n", names[k],
               k == 0 ? " ([core] shm = false, or one rank per host)" : " (one host)");
      continue;
    }
    if (c->rank == 0) printf("# %s: ping-pong rank 0 <-> rank %d, one-way = median round trip / 2\n",
                             names[k], peers[k]);
    perfPingPong(c, peers[k], &fits[k]);
    if (c->rank == 0) {
      perfFitLine(&fits[k]);
      perfPrintFit(names[k], &fits[k]);
    }
  }
  PerfFit gamma = {0};
  if (c->rank == 0) {
    printf("# gamma: the core's float sum, dst += src, on rank 0\n");
    perfReduceRate(c, &gamma);
    perfPrintFit("reduction", &gamma);
    printf("# gamma %.6g us/B (%.2f GB/s)\n", gamma.beta, gamma.beta > 0 ? 1e-3 / gamma.beta : 0.0);
  }
  int32_t status = 0;
  if (c->rank == 0) {
    if (perfWriteModel(o, c->nranks, nhosts, &fits[0], &fits[1], &gamma, load) == 0)
      printf("# wrote %s: use it with [tuner] model = %s (or NCCLX_TUNER_MODEL=%s)\n", o->outPath,
             o->outPath, o->outPath);
    else
      status = 1;
    fflush(stdout);
  }
  PERF_CHECK(c, ncclxBroadcast(&status, &status, 1, ncclxInt32, 0, c->comm, NULL));
  return status;
}

#endif
