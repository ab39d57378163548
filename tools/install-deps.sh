#!/usr/bin/env bash
# Installs the Debian packages ncclx needs to build and test (idempotent).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libinih-dev openmpi-bin libopenmpi-dev python3-torch python3-numpy
      libfabric-dev libfabric-bin libibverbs-dev librdmacm-dev libopenblas-dev iproute2 python3
      libgloo-dev)  # libgloo-dev: the Gloo side of tools/compare-net (tools/gloo/gloo-bench);
                    # python3-torch, python3-numpy: the torch.distributed backend (python/, docs/python.md)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all packages present"
