#!/usr/bin/env bash
# ncclx-net-check on the template network plugin, built in tree from examples/:
#   test-netcheck.sh CHECKER PLUGIN pass [OPTIONS...]     every check passes or skips, the
#       refusal check (garbage handle, wrong nonce, stranger) and the 300-message ordering
#       check among them, and no message exceeds the plugin's max_message_bytes;
#   test-netcheck.sh CHECKER PLUGIN initfail [OPTIONS...] init is refused: one FAIL line,
#       one "init failed" line, a non-zero exit and no per-check "no result" lines.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 CHECKER PLUGIN pass|initfail [OPTIONS...]" >&2; exit 2; }
checker=$1 plugin=$2 mode=$3
shift 3
out=$("$checker" -t 20 "$@" "$plugin" 2>&1)
rc=$?
echo "$out"
fail() { echo "FAIL: $1" >&2; exit 1; }
case $mode in
  pass)
    [ $rc -eq 0 ] || fail "the checker exited $rc"
    echo "$out" | grep -q '^PASS  garbage handle, wrong nonce, stranger: refused' ||
      fail "the refusal check did not pass"
    echo "$out" | grep -q '^PASS  ordering of 300 messages' || fail "the ordering check did not pass"
    if [[ " $* " == *" max_message_bytes=64K "* ]]; then
      echo "$out" | grep -q '300 messages of 0..65536 bytes' ||
        fail "the ordering check did not keep to the 64 KiB limit"
    fi
    ;;
  initfail)
    [ $rc -ne 0 ] || fail "the checker exited 0 although init was refused"
    [ "$(echo "$out" | grep -c '^FAIL')" -eq 1 ] || fail "expected exactly one FAIL line"
    echo "$out" | grep -q 'init failed' || fail "no 'init failed' line"
    echo "$out" | grep -q 'no result' && fail "per-check 'no result' lines were printed"
    ;;
  *) fail "unknown mode $mode" ;;
esac
echo "PASS: ncclx-net-check $mode $*"
