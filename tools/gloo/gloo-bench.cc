// gloo-bench: the ncclx-perf all-reduce measurement made with Gloo's TCP transport, so that
// tools/compare-net can put Gloo next to ncclx and Open MPI row by row.
//
//   NCCLX_RANK=r NCCLX_NRANKS=n gloo-bench allreduce --store DIR [--iface IF] [-b 8 -e 16M ...]
//
// Rank and size come from NCCLX_RANK/NCCLX_NRANKS (tools/ncclx-hosts sets them) or Open MPI's
// variables. Rendezvous is a gloo FileStore in DIR (a directory every rank can see, empty at
// the start). --iface picks the NIC (default $NCCLX_HOSTS_IFNAME, else Gloo's choice from the
// hostname). float32 sum; --algo default (gloo::allreduce's choice: ring), ring or bcube.
// Timing follows ncclx-perf: warmup, then -n calls back to back, time = max over ranks of the
// per-rank mean, busbw = algbw * 2(n-1)/n, #wrong = wrong elements summed over ranks.
// Exit status: 0 ok, 1 a Gloo call failed, 2 bad arguments, 3 wrong results.
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Options {
  size_t minBytes = 8, maxBytes = 16u << 20, factor = 2;
  long iters = 20, warmup = 5;
  int check = 1;
  long timeoutSec = 120;
  std::string store, iface, algo = "default";
};

[[noreturn]] void usage(int status) {
  std::fprintf(status ? stderr : stdout,
               "usage: gloo-bench allreduce --store DIR [--iface IF] [--algo default|ring|bcube]\n"
               "                  [-b SIZE] [-e SIZE] [-f N] [-n N] [-w N] [-c 0|1] [-T SEC]\n"
               "  rank and size from NCCLX_RANK/NCCLX_NRANKS (or OMPI_COMM_WORLD_RANK/SIZE)\n");
  std::exit(status);
}

bool parseSize(const char* s, size_t* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s) return false;
  switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || v == 0) return false;
  *out = static_cast<size_t>(v);
  return true;
}

bool parseLong(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

Options parseArgs(int argc, char** argv) {
  Options o;
  bool haveOp = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(0);
    if (a == "allreduce") {
      haveOp = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gloo-bench: '%s' needs a value (or is unknown)\n", a.c_str());
      usage(2);
    }
    const char* v = argv[++i];
    long x = 0;
    bool ok = true;
    if (a == "-b") ok = parseSize(v, &o.minBytes);
    else if (a == "-e") ok = parseSize(v, &o.maxBytes);
    else if (a == "-f") { ok = parseLong(v, 2, 1 << 20, &x); o.factor = static_cast<size_t>(x); }
    else if (a == "-n") ok = parseLong(v, 1, 10000000, &o.iters);
    else if (a == "-w") ok = parseLong(v, 0, 10000000, &o.warmup);
    else if (a == "-c") { ok = parseLong(v, 0, 1, &x); o.check = static_cast<int>(x); }
    else if (a == "-T") ok = parseLong(v, 1, 86400, &o.timeoutSec);
    else if (a == "--store") o.store = v;
    else if (a == "--iface") o.iface = v;
    else if (a == "--algo") { o.algo = v; ok = o.algo == "default" || o.algo == "ring" || o.algo == "bcube"; }
    else {
      std::fprintf(stderr, "gloo-bench: unknown flag '%s'\n", a.c_str());
      usage(2);
    }
    if (!ok) {
      std::fprintf(stderr, "gloo-bench: bad value '%s' for %s\n", v, a.c_str());
      usage(2);
    }
  }
  if (!haveOp) {
    std::fprintf(stderr, "gloo-bench: only 'allreduce' is measured; give it as the op\n");
    usage(2);
  }
  if (o.store.empty()) {
    std::fprintf(stderr, "gloo-bench: --store DIR is required (a directory every rank sees)\n");
    usage(2);
  }
  if (o.minBytes > o.maxBytes) {
    std::fprintf(stderr, "gloo-bench: -b is larger than -e\n");
    usage(2);
  }
  return o;
}

int envInt(const char* a, const char* b) {
  for (const char* name : {a, b}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return -1;
}

double nowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Element j of rank r's input: small integers, so every sum is exact in float.
float inputValue(int rank, size_t j) { return static_cast<float>((rank + 1) * (1 + static_cast<int>(j % 7))); }

class Bench {
 public:
  Bench(const Options& o, std::shared_ptr<gloo::Context> ctx) : o_(o), ctx_(std::move(ctx)) {}

  // One all-reduce of `count` floats from `in` into `out`.
  void allreduce(float* in, float* out, size_t count) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setInput(in, count);
    opts.setOutput(out, count);
    if (o_.algo == "ring") opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    if (o_.algo == "bcube") opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  }

  double maxOverRanks(double v) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setInput(&v, 1);
    opts.setOutput(&v, 1);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
    return v;
  }

  double sumOverRanks(double v) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setInput(&v, 1);
    opts.setOutput(&v, 1);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
    return v;
  }

 private:
  const Options& o_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  Options o = parseArgs(argc, argv);
  int rank = envInt("NCCLX_RANK", "OMPI_COMM_WORLD_RANK");
  int size = envInt("NCCLX_NRANKS", "OMPI_COMM_WORLD_SIZE");
  if (rank < 0 || size < 1 || rank >= size) {
    std::fprintf(stderr, "gloo-bench: set NCCLX_RANK and NCCLX_NRANKS (rank %d of %d is not valid)\n",
                 rank, size);
    return 2;
  }
  if (o.iface.empty() && std::getenv("NCCLX_HOSTS_IFNAME")) o.iface = std::getenv("NCCLX_HOSTS_IFNAME");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  std::shared_ptr<gloo::rendezvous::Context> ctx;
  try {
    gloo::transport::tcp::attr attr;
    if (!o.iface.empty()) attr.iface = o.iface;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(o.store);
    ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::seconds(o.timeoutSec));
    ctx->connectFullMesh(store, dev);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo-bench: rank %d: connecting failed: %s\n", rank, e.what());
    return 1;
  }

  Bench bench(o, ctx);
  double busFactor = size > 1 ? 2.0 * (size - 1) / size : 0.0;
  size_t maxCount = o.maxBytes / sizeof(float);
  std::vector<float> in(maxCount ? maxCount : 1), out(in.size());
  uint64_t totalWrong = 0;
  if (rank == 0) {
    std::printf("# gloo-bench allreduce: nranks %d, dtype float, op sum, iters %ld, warmup %ld, "
                "check %d, barrier 0, sizes %zu..%zu x%zu\n", size, o.iters, o.warmup, o.check,
                o.minBytes, o.maxBytes, o.factor);
    std::printf("# library: Gloo %s (libgloo-dev), tcp transport%s%s, algorithm %s\n",
                "0.5.0", o.iface.empty() ? "" : " on ", o.iface.c_str(), o.algo.c_str());
    std::printf("#%11s  %12s  %8s  %6s  %5s  %9s  %11s  %11s  %7s\n", "size(B)", "count(elems)",
                "type", "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  try {
    for (size_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= o.factor) {
      size_t count = bytes / sizeof(float);
      if (count == 0) continue;
      for (size_t j = 0; j < count; j++) in[j] = inputValue(rank, j);
      for (long i = 0; i < o.warmup; i++) bench.allreduce(in.data(), out.data(), count);
      double t0 = nowUs();
      for (long i = 0; i < o.iters; i++) bench.allreduce(in.data(), out.data(), count);
      double mean = (nowUs() - t0) / static_cast<double>(o.iters);
      uint64_t wrong = 0;
      if (o.check) {
        double ranksSum = size * (size + 1) / 2.0;
        for (size_t j = 0; j < count; j++)
          if (out[j] != static_cast<float>(ranksSum * (1 + static_cast<int>(j % 7)))) wrong++;
      }
      double time = bench.maxOverRanks(mean);
      uint64_t wrongAll = static_cast<uint64_t>(bench.sumOverRanks(static_cast<double>(wrong)));
      totalWrong += wrongAll;
      double algbw = static_cast<double>(count * sizeof(float)) / time / 1e3;
      if (rank == 0) {
        std::printf("%12zu  %12zu  %8s  %6s  %5d  %9.3f  %11.3f  %11.3f  %7s\n", count * sizeof(float),
                    count, "float", "sum", -1, time, algbw, algbw * busFactor,
                    o.check ? std::to_string(wrongAll).c_str() : "N/A");
      }
      if (bytes > o.maxBytes / o.factor) break;  // the next step would overflow or pass -e
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo-bench: rank %d: allreduce failed: %s\n", rank, e.what());
    return 1;
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(totalWrong),
                totalWrong ? "FAILED" : "OK");
  }
  return totalWrong ? 3 : 0;
}
