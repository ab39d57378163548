#!/bin/sh
# The shared library must not need the static TLS block (ELF flag STATIC_TLS): a library
# that does cannot always be dlopened (init.dlopen shows it fail in a CUDA build; a CPU-only
# build may still squeeze into glibc's spare static TLS, so this checks the flag itself).
lib="$1"
command -v readelf >/dev/null 2>&1 || { echo "SKIP: no readelf"; exit 77; }
if readelf -d "$lib" | grep -q STATIC_TLS; then
  echo "FAIL: $lib is marked STATIC_TLS (initial-exec thread-locals?):"
  readelf -d "$lib" | grep FLAGS
  exit 1
fi
echo "ok: $lib needs no static TLS"
