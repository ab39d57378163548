#!/bin/sh
# Test driver for the libfabric network plugin (tests/ofi/CMakeLists.txt).
#
#   ofi_test.sh netcheck CHECK_TOOL PLUGIN PROVIDER [TOOL_ARGS...]
#       ncclx-net-check against PLUGIN with [net.ofi] provider = PROVIDER.
#   ofi_test.sh mp PROVIDER NP RUN_MP PROGRAM [ARGS...]
#       a tests/mp program under run_mp.sh with the core's shared memory off, so every byte
#       between ranks goes through the plugin.
#   ofi_test.sh direct PROVIDER NP PROGRAM [ARGS...]
#       the same for a program that forks its own NP ranks (the fault tests).
#   ofi_test.sh config CHECK_TOOL PLUGIN
#       configuration errors: unknown provider, bad values, unknown keys.
#
# PROVIDER "tcp" stands for "tcp;ofi_rxm" (CMake lists cannot carry a ';': reliable datagrams
# through ofi_rxm), "tcpmsg" for "tcp" (the plugin's connected endpoints). The mp and direct
# modes fail when any rank did not really use the plugin with that provider: a run that fell
# back to the socket network passes its own checks but not this script's. In those modes,
# OFI_TEST_LEVEL sets NCCLX_DEBUG (default INFO), and the log must match the extended regular
# expression OFI_TEST_EXPECT and must not match OFI_TEST_REJECT when they are set.
set -u

provider_name() {
  case "$1" in
    tcp) echo "tcp;ofi_rxm" ;;
    tcpmsg) echo "tcp" ;;
    *) echo "$1" ;;
  esac
}

# What the plugin's provider line must say about its endpoints for PROVIDER (short name).
endpoint_kind() {
  case "$1" in
    tcpmsg) echo "connected endpoints" ;;
    *) echo "reliable-datagram endpoint" ;;
  esac
}

fail() {
  echo "ofi_test.sh: FAIL: $*" >&2
  exit 1
}

# The shm provider keeps a region per process in /dev/shm (PID:N:N, 16 MiB) that a SIGKILLed
# process (the tests kill some on purpose) cannot remove. Regions that appeared during this
# test and whose process is gone are removed at exit. Ours whose process is gone are also
# removed at the start: libfabric takes a region named by a new process's own pid (pids wrap
# within minutes in a full run) for that process's live one and fails fi_enable with EBUSY.
shm_regions() {
  for f in /dev/shm/*:*:*; do
    f=${f#/dev/shm/}
    case "$f" in
      *[!0-9:]* | :* | *::* | *:) ;;
      *) echo "$f" ;;
    esac
  done | sort
}
me=$(id -u)
shm_regions | while read -r f; do
  [ -d "/proc/${f%%:*}" ] || [ -z "$(find "/dev/shm/$f" -prune -user "$me" 2>/dev/null)" ] ||
    rm -f "/dev/shm/$f"
done
shm_before=$(mktemp "${TMPDIR:-/tmp}/ncclx-ofi-shm.XXXXXX") || fail "mktemp"
shm_regions >"$shm_before"
log=""
cleanup() {
  shm_regions | comm -13 "$shm_before" - | while read -r f; do
    [ -d "/proc/${f%%:*}" ] || rm -f "/dev/shm/$f"
  done
  rm -f "$shm_before" ${log:+"$log"}
}
trap cleanup EXIT

# The tcp provider stays on loopback (127.0.0.1): tests never touch other interfaces.
domain_for() {
  case "$1" in
    tcp*) echo "lo" ;;
    *) echo "" ;;
  esac
}

# verify_log LOG PROVIDER NP KIND: every rank loaded the plugin with that provider and kind
# of endpoints, and initialized with it.
verify_log() {
  log=$1 prov=$2 np=$3 kind=$4
  loaded=$(grep -c "net: using plugin 'ofi'" "$log")
  provs=$(grep -F "NET/OFI: provider $prov (" "$log" | grep -cF "$kind")
  inits=$(grep -c "init complete" "$log")
  inits_ofi=$(grep "init complete" "$log" | grep -c " net ofi dev [0-9]* shm off ")
  fallback=$(grep -cE "plugin 'ofi' refused|using the built-in socket network" "$log")
  echo "ofi_test.sh: $loaded rank(s) loaded 'ofi', $provs with provider $prov ($kind);" \
    "$inits_ofi of $inits communicator init(s) on ofi with core shm off; $fallback fallback line(s)"
  [ "$loaded" -ge "$np" ] || fail "only $loaded of $np ranks logged \"net: using plugin 'ofi'\""
  [ "$provs" -ge "$np" ] || fail "only $provs of $np ranks logged the plugin's provider line for $prov with $kind"
  [ "$inits" -ge "$np" ] || fail "only $inits 'init complete' lines for $np ranks"
  [ "$inits_ofi" -eq "$inits" ] || fail "$((inits - inits_ofi)) communicator(s) did not use net ofi with shm off"
  [ "$fallback" -eq 0 ] || fail "a rank fell back from the ofi plugin"
  if [ -n "${OFI_TEST_EXPECT:-}" ]; then
    grep -qE "$OFI_TEST_EXPECT" "$log" || fail "no log line matches '$OFI_TEST_EXPECT'"
    echo "ofi_test.sh: $(grep -cE "$OFI_TEST_EXPECT" "$log") line(s) match '$OFI_TEST_EXPECT'"
  fi
  if [ -n "${OFI_TEST_REJECT:-}" ] && grep -qE "$OFI_TEST_REJECT" "$log"; then
    grep -E "$OFI_TEST_REJECT" "$log" | head -5
    fail "log lines match '$OFI_TEST_REJECT'"
  fi
}

ofi_env() {
  prov=$1
  NCCLX_NET_PLUGIN=ofi
  NCCLX_NET_OFI_PROVIDER=$prov
  NCCLX_NET_OFI_DOMAIN=$(domain_for "$prov")
  NCCLX_CORE_SHM=0
  NCCLX_DEBUG=${OFI_TEST_LEVEL:-INFO}
  NCCLX_DEBUG_SUBSYS='^COLL,P2P,TUNING'
  export NCCLX_NET_PLUGIN NCCLX_NET_OFI_PROVIDER NCCLX_NET_OFI_DOMAIN NCCLX_CORE_SHM \
    NCCLX_DEBUG NCCLX_DEBUG_SUBSYS
}

mode=${1:-}
[ $# -ge 1 ] && shift
case "$mode" in
  netcheck)
    [ $# -ge 3 ] || fail "usage: netcheck CHECK_TOOL PLUGIN PROVIDER [ARGS...]"
    tool=$1 plugin=$2 prov=$(provider_name "$3")
    shift 3
    dom=$(domain_for "$prov")
    if [ -n "$dom" ]; then
      "$tool" -o "provider=$prov" -o "domain=$dom" "$@" "$plugin"
    else
      "$tool" -o "provider=$prov" "$@" "$plugin"
    fi
    exit $?
    ;;
  mp | direct)
    if [ "$mode" = mp ]; then
      [ $# -ge 4 ] || fail "usage: mp PROVIDER NP RUN_MP PROGRAM [ARGS...]"
    else
      [ $# -ge 3 ] || fail "usage: direct PROVIDER NP PROGRAM [ARGS...]"
    fi
    prov=$(provider_name "$1") kind=$(endpoint_kind "$1") np=$2
    shift 2
    ofi_env "$prov"
    log=$(mktemp "${TMPDIR:-/tmp}/ncclx-ofi-test.XXXXXX") || fail "mktemp"
    if [ "$mode" = mp ]; then
      runmp=$1
      shift
      "$runmp" "$np" "$@" >"$log" 2>&1
    else
      "$@" >"$log" 2>&1
    fi
    rc=$?
    # The INFO lines of a passing run are noise; keep warnings, results and the verdict.
    grep -vE "NCCLX (INFO|TRACE)" "$log"
    [ "$rc" -eq 0 ] || { grep "NCCLX INFO" "$log" | tail -40; fail "the program exited with $rc"; }
    verify_log "$log" "$prov" "$np" "$kind"
    echo "ofi_test.sh: PASS"
    ;;
  config)
    [ $# -eq 2 ] || fail "usage: config CHECK_TOOL PLUGIN"
    tool=$1 plugin=$2
    out=$("$tool" --no-kill -t 5 -o provider=nosuchprovider "$plugin" 2>&1)
    echo "$out" | grep -q "libfabric provider 'nosuchprovider' (command line -o provider) not available" ||
      { echo "$out"; fail "an unknown provider is not reported by name"; }
    echo "$out" | grep -q "^FAIL  init" || { echo "$out"; fail "init with an unknown provider did not fail"; }
    out=$("$tool" --no-kill -t 5 -o provider=shm -o liveness_ms=soon "$plugin" 2>&1)
    echo "$out" | grep -q "liveness_ms = 'soon' (command line -o liveness_ms)" ||
      { echo "$out"; fail "a bad liveness_ms is not reported with its key and origin"; }
    echo "$out" | grep -q "init returned ncclxInvalidUsage" ||
      { echo "$out"; fail "a bad value is not ncclxInvalidUsage"; }
    out=$("$tool" --no-kill -t 5 -o provider=shm -o rxm_eager_limit=64M+ "$plugin" 2>&1)
    echo "$out" | grep -q "rxm_eager_limit = '64M+' (command line -o rxm_eager_limit): expected 0 (libfabric's default) or a size up to 1G" ||
      { echo "$out"; fail "a bad rxm_eager_limit is not reported with its key, origin and what is expected"; }
    out=$("$tool" --no-kill -t 5 -o provider=shm -o rxm_eager_limit=64K -o domain=nosuchdomain "$plugin" 2>&1)
    echo "$out" | grep -q "rxm_eager_limit" && { echo "$out"; fail "rxm_eager_limit = 64K (a size with a suffix) was refused"; }
    out=$("$tool" --no-kill -t 5 -o provider=shm -o mr_locale=on -o domain=nosuchdomain "$plugin" 2>&1)
    echo "$out" | grep -q "ignoring unknown key 'mr_locale' (command line -o mr_locale)" ||
      { echo "$out"; fail "an unknown key is not warned about"; }
    echo "$out" | grep -q "domain = 'nosuchdomain' (command line -o domain): provider 'shm' has no such domain (it has: shm)" ||
      { echo "$out"; fail "an unknown domain is not reported with the domains there are"; }
    for bad in 0 9 two; do
      out=$("$tool" --no-kill -t 5 -o provider=shm -o endpoints=$bad "$plugin" 2>&1)
      echo "$out" | grep -q "endpoints = '$bad' (command line -o endpoints): expected 1 to 8 endpoints per device" ||
        { echo "$out"; fail "endpoints = $bad is not reported with its key, origin and what is expected"; }
    done
    out=$("$tool" --no-kill -t 5 -o provider=shm -o endpoint_type=datagram "$plugin" 2>&1)
    echo "$out" | grep -q "endpoint_type = 'datagram' (command line -o endpoint_type): expected auto, msg (connected endpoints) or rdm" ||
      { echo "$out"; fail "a bad endpoint_type is not reported with its key, origin and what is expected"; }
    out=$("$tool" --no-kill -t 5 -o provider=shm -o endpoint_type=msg "$plugin" 2>&1)
    echo "$out" | grep -q "endpoint_type = msg (command line -o endpoint_type): provider 'shm' has no connected (FI_EP_MSG) endpoints" ||
      { echo "$out"; fail "connected endpoints asked of a provider without them are not reported"; }
    echo "$out" | grep -q "init returned ncclxInvalidUsage" ||
      { echo "$out"; fail "endpoint_type = msg with shm is not ncclxInvalidUsage"; }
    echo "ofi_test.sh: PASS (unknown provider, bad values, a size with a suffix, unknown key, unknown domain, bad endpoint counts, bad endpoint types)"
    ;;
  *)
    fail "usage: ofi_test.sh netcheck|mp|direct|config ..."
    ;;
esac
