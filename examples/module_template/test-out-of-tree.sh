#!/usr/bin/env bash
# Proves that a feature module builds OUT OF TREE against an INSTALLED ncclx and replaces the
# built-in one, and that an installed libncclx finds its own modules in its prefix:
#   1. cmake --install BUILD_DIR into a temporary prefix (it must hold lib/ncclx's two modules,
#      and libncclx must not hold their code);
#   2. copy the template from <prefix>/share/ncclx/examples and build it against the prefix;
#   3. check the .so exports only ncclxModule_v1 and does not link libncclx;
#   4. run the CommFuse examples (3 ranks, every schedule, results checked bit for bit) with
#      NCCLX_MODULES_COMMFUSE=<the template> and confirm from the log that it served them;
#   5. run one of them, the MoE layer example and tests of both families on the installed
#      libncclx with no setting: the prefix's modules load and serve them.
# Usage: test-out-of-tree.sh BUILD_DIR. Exit 0 = pass, 77 = skipped (no OpenBLAS examples).
set -euo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ncclx-module-template.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "FAIL: $1" >&2
  if [ $# -gt 1 ] && [ -f "$2" ]; then tail -n 40 "$2" | sed 's/^/  | /' >&2; fi
  exit 1
}
step() { echo "== $*"; }

EXAMPLES="$BUILD/examples/commfuse"
if [ ! -x "$EXAMPLES/commfuse_tp_linear" ]; then
  echo "SKIP: the CommFuse examples are not built (OpenBLAS missing)"
  exit 77
fi

step "install $BUILD into $WORK/prefix"
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log" 2>&1 ||
  fail "cmake --install failed" "$WORK/install.log"
[ -f "$WORK/prefix/include/ncclx/module.h" ] || fail "the install has no include/ncclx/module.h"
LIBDIR=$(dirname "$(find "$WORK/prefix" -name 'libncclx.so.0' | head -n 1)")
for m in commfuse moe; do
  [ -f "$LIBDIR/ncclx/libncclx-module-$m.so" ] || fail "the install has no $LIBDIR/ncclx/libncclx-module-$m.so"
done
# libncclx holds neither module's code, only the forwarders: each module's own sentences are
# in its module and not in the library.
for pair in "commfuse:out of memory choosing a schedule" "moe:not an expert of this" \
            "moe:that does not start with a dynamic all-to-all"; do
  m=${pair%%:*} text=${pair#*:}
  grep -q "$text" "$LIBDIR/ncclx/libncclx-module-$m.so" || fail "the $m module lacks its sentence '$text'"
  if grep -q "$text" "$LIBDIR/libncclx.so.0"; then fail "libncclx.so still holds $m code ('$text')"; fi
done
KIT="$WORK/prefix/share/ncclx/examples/module_template"
[ -f "$KIT/module_template.c" ] || fail "the install has no share/ncclx/examples/module_template"
cp -r "$KIT" "$WORK/src"

step "configure and build the template against the installed headers"
cmake -S "$WORK/src" -B "$WORK/build" -DCMAKE_PREFIX_PATH="$WORK/prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  > "$WORK/configure.log" 2>&1 || fail "configuring the template failed" "$WORK/configure.log"
cmake --build "$WORK/build" > "$WORK/build.log" 2>&1 || fail "building the template failed" "$WORK/build.log"
MODULE="$WORK/build/libncclx-module-template.so"
[ -f "$MODULE" ] || fail "$MODULE was not produced" "$WORK/build.log"

step "check the shared object"
exports=$(nm -D --defined-only "$MODULE" | awk '{print $3}' | tr '\n' ' ')
[ "$exports" = "ncclxModule_v1 " ] || fail "exports '$exports', expected only ncclxModule_v1"
if readelf -d "$MODULE" | grep -q 'NEEDED.*libncclx'; then
  fail "the module links libncclx; a module must use only the headers"
fi

echo "; empty: the environment configures everything" > "$WORK/empty.ini"
run() { # NAME ARGS...: one CommFuse example at 3 ranks, output checked
  local name=$1 log=$WORK/$1.log
  shift
  (cd "$WORK" && NCCLX_CONF_FILE="$WORK/empty.ini" NCCLX_NET_SOCKET_IFNAME=lo NCCLX_CORE_TIMEOUT_S=60 \
     NCCLX_DEBUG=INFO NCCLX_DEBUG_SUBSYS=INIT,PLUGIN timeout 300 "$EXAMPLES/commfuse_$name" "$@") > "$log" 2>&1 ||
    fail "commfuse_$name failed" "$log"
  grep -q "bit-identical" "$log" || fail "commfuse_$name checked nothing" "$log"
  if grep -q "differ\|FAIL" "$log"; then fail "commfuse_$name: results differ" "$log"; fi
}

for ex in "tp_linear -np 3 -f 768 -n 2" "dp_grad -np 3 -k 768 -s 2" "ulysses -np 3 -s 96 -d 96 -H 6 -dh 32 -n 2"; do
  step "commfuse_${ex%% *} on the template module"
  # shellcheck disable=SC2086 # the example's arguments are words on purpose
  NCCLX_MODULES_COMMFUSE="$MODULE" run $ex
  loads=$(grep -c "module commfuse: template loaded from $MODULE" "$WORK/${ex%% *}.log" || true)
  [ "$loads" -ge 3 ] || fail "expected every rank to load the template, found $loads lines" "$WORK/${ex%% *}.log"
done

step "commfuse_tp_linear on the installed library: its own CommFuse module"
LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" run tp_linear -np 3 -f 768 -n 2
grep -q "module commfuse: commfuse loaded from $LIBDIR/ncclx/libncclx-module-commfuse.so" "$WORK/tp_linear.log" ||
  fail "the installed library did not load the module of its prefix" "$WORK/tp_linear.log"
step "the MoE layer example on the installed library: its own MoE module"
MOE_EXAMPLE="$BUILD/tests/a2av/a2av_moe_layer_example"
(cd "$WORK" && LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCLX_CONF_FILE="$WORK/empty.ini" \
   NCCLX_NET_SOCKET_IFNAME=lo NCCLX_CORE_TIMEOUT_S=60 NCCLX_DEBUG=INFO NCCLX_DEBUG_SUBSYS=INIT,PLUGIN \
   timeout 300 "$MOE_EXAMPLE" -np 3) > "$WORK/moe_layer.log" 2>&1 || fail "the MoE layer example failed" "$WORK/moe_layer.log"
grep -q "module moe: moe loaded from $LIBDIR/ncclx/libncclx-module-moe.so" "$WORK/moe_layer.log" ||
  fail "the installed library did not load the MoE module of its prefix" "$WORK/moe_layer.log"
# Tests of both families on the installed library (results checked by the programs): each rank
# loads the module of the prefix.
for t in "a2av/a2av_dynamic 3" "a2av/a2av_moe 3" "a2av/a2av_overflow moe" "fuse/fuse_check 3"; do
  name=$(basename "${t%% *}")
  step "$name on the installed library"
  # shellcheck disable=SC2086 # the program's arguments are words on purpose
  (cd "$WORK" && LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCLX_CONF_FILE="$WORK/empty.ini" \
     NCCLX_NET_SOCKET_IFNAME=lo NCCLX_CORE_TIMEOUT_S=60 NCCLX_DEBUG=INFO NCCLX_DEBUG_SUBSYS=INIT,PLUGIN \
     timeout 300 "$BUILD/tests/"$t) > "$WORK/$name.log" 2>&1 || fail "$name failed on the installed library" "$WORK/$name.log"
  grep -q "loaded from $LIBDIR/ncclx/libncclx-module-" "$WORK/$name.log" ||
    fail "$name did not load its module from the prefix" "$WORK/$name.log"
done
echo "PASS: template module built out of tree and served the CommFuse examples; the install loads its own modules"
