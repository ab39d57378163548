#!/usr/bin/env bash
# Proves that a third-party network plugin builds OUT OF TREE against an INSTALLED ncclx and
# really carries a collective:
#   1. cmake --install BUILD_DIR into a temporary prefix;
#   2. copy the template from <prefix>/share/ncclx/examples (not from this source tree) and
#      build it against the prefix (find_package(ncclx), headers only);
#   3. check the .so exports only ncclxNetPlugin_v1 and does not link libncclx;
#   4. run the installed <prefix>/bin/ncclx-net-check on it, plain and with
#      -o max_message_bytes=64K;
#   5. run a checked 2-rank allreduce (ncclx-perf, up to 1 MiB) with the plugin as the only
#      network (NCCLX_CORE_SHM=0) and confirm from NCCLX_DEBUG=INFO that it was used.
# Usage: test-out-of-tree.sh BUILD_DIR     (a built ncclx tree: libncclx and tools/ncclx-perf)
# Exit status 0 = pass; anything else = failure, with the reason and the relevant log.
set -euo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ncclx-net-template.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "FAIL: $1" >&2
  if [ $# -gt 1 ] && [ -f "$2" ]; then tail -n 40 "$2" | sed 's/^/  | /' >&2; fi
  exit 1
}
step() { echo "== $*"; }

PERF="$BUILD/tools/ncclx-perf"
[ -x "$PERF" ] || fail "$PERF is not built (build the ncclx-perf target first)"

step "install $BUILD into $WORK/prefix"
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log" 2>&1 ||
  fail "cmake --install failed" "$WORK/install.log"
[ -f "$WORK/prefix/include/ncclx/net.h" ] || fail "the install has no include/ncclx/net.h"
KIT="$WORK/prefix/share/ncclx"
[ -f "$KIT/doc/plugin-guide.md" ] || fail "the install has no share/ncclx/doc/plugin-guide.md"
[ -f "$KIT/examples/net_plugin_template/net_template.c" ] ||
  fail "the install has no share/ncclx/examples/net_plugin_template"
cp -r "$KIT/examples/net_plugin_template" "$WORK/src" # what an author copies to start

step "configure and build the template against the installed headers"
cmake -S "$WORK/src" -B "$WORK/build" -DCMAKE_PREFIX_PATH="$WORK/prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > "$WORK/configure.log" 2>&1 ||
  fail "configuring the template failed" "$WORK/configure.log"
cmake --build "$WORK/build" > "$WORK/build.log" 2>&1 || fail "building the template failed" "$WORK/build.log"
PLUGIN="$WORK/build/libncclx-net-template.so"
[ -f "$PLUGIN" ] || fail "$PLUGIN was not produced" "$WORK/build.log"
# It must compile against the installed copy, not the source tree.
grep -q -- "-I$WORK/prefix/include\|-isystem $WORK/prefix/include" "$WORK/build/compile_commands.json" ||
  fail "the template was not compiled against the installed headers" "$WORK/build/compile_commands.json"

step "check the shared object"
exports=$(nm -D --defined-only "$PLUGIN" | awk '{print $3}' | tr '\n' ' ')
[ "$exports" = "ncclxNetPlugin_v1 " ] || fail "exports '$exports', expected only ncclxNetPlugin_v1"
if readelf -d "$PLUGIN" | grep -q 'NEEDED.*libncclx'; then
  fail "the plugin links libncclx; a plugin must use only the headers"
fi

CHECK="$WORK/prefix/bin/ncclx-net-check"
[ -x "$CHECK" ] || fail "the install has no bin/ncclx-net-check"
# A prefix off the loader's path: the installed tools find libncclx as a user's would, through
# LD_LIBRARY_PATH (a build without an install RPATH, the sanitizer build here, needs it).
LIBDIR=$(dirname "$(find "$WORK/prefix" -name 'libncclx.so.0' | head -n 1)")
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for opts in "" "-o max_message_bytes=64K"; do
  step "installed ncclx-net-check $opts"
  # shellcheck disable=SC2086 # opts is two words on purpose
  "$CHECK" $opts "$PLUGIN" > "$WORK/check.log" 2>&1 ||
    fail "ncclx-net-check $opts refused the template" "$WORK/check.log"
  tail -n 1 "$WORK/check.log" | sed 's/^/   /'
done

step "2-rank allreduce over the template network"
echo "; intentionally empty: the environment below configures everything" > "$WORK/empty.ini"
(
  cd "$WORK" # no stray ./ncclx.ini
  NCCLX_CONF_FILE="$WORK/empty.ini" NCCLX_NET_PLUGIN="$PLUGIN" NCCLX_CORE_SHM=0 \
    NCCLX_DEBUG=INFO NCCLX_DEBUG_SUBSYS=INIT,NET,PLUGIN \
    timeout 300 "$PERF" allreduce -np 2 -b 8 -e 1M -n 5 -w 2 -T 240
) > "$WORK/perf.log" 2>&1 || fail "ncclx-perf failed" "$WORK/perf.log"

used=$(grep -c "net: using plugin 'template' from $PLUGIN" "$WORK/perf.log" || true)
[ "$used" -eq 2 ] || fail "expected both ranks to log \"net: using plugin 'template'\", found $used" "$WORK/perf.log"
if grep -q "refused\|falling back" "$WORK/perf.log"; then
  fail "a plugin was refused or the core fell back to another network" "$WORK/perf.log"
fi
grep -q "# Out of bounds values : 0 OK" "$WORK/perf.log" || fail "results were not checked or wrong" "$WORK/perf.log"
grep -q "^ *1048576 " "$WORK/perf.log" || fail "the 1 MiB row is missing" "$WORK/perf.log"
grep "NET/Template\|net: using" "$WORK/perf.log" | sed 's/^/   /'
echo "PASS: template plugin built out of tree, loaded and carried a checked 2-rank allreduce"
