#!/usr/bin/env bash
# Builds ncclx twice (release, and AddressSanitizer + UndefinedBehaviorSanitizer) and runs
# the whole CTest suite on both. Usage: tools/run-tests.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
run_suite() {
  local dir=$1; shift
  cmake -S . -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
  cmake --build "$dir" -j"$jobs"
  (cd "$dir" && ctest --output-on-failure --timeout 600 -j2 ${CTEST_ARGS:-})
}
mkdir -p build build-san
# The release build takes the CUDA path when nvcc is present (NCCLX_CUDA=AUTO); the sanitizer
# build is CPU-only, so both the CUDA and the no-CUDA builds run the whole suite.
echo "== release build =="
run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== sanitizer build (ASan + UBSan) =="
# Leak checking stays on; mpirun itself is not instrumented, only our programs.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
run_suite build-san -DCMAKE_BUILD_TYPE=Debug -DNCCLX_SANITIZE=ON -DNCCLX_CUDA=OFF
