#!/usr/bin/env bash
# Installs every Debian 12 package that building, testing and benchmarking engramd needs.
# Idempotent: packages already present are skipped, and apt is only consulted when one is missing.
set -euo pipefail

packages=(
  build-essential pkg-config meson ninja-build clang libclang-rt-14-dev
  liburing-dev libabsl-dev catch2 libbenchmark-dev
  libfmt-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libxxhash-dev
  pybind11-dev python3 python3-numpy python3-torch python3-pytest python3-matplotlib
  python3-venv python3-pip python3-mesonpy patchelf
  systemd
)
if [[ "${ENGRAM_SETUP_HIP:-1}" == 1 ]]; then
  packages+=(hipcc)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
echo "setup: all ${#packages[@]} packages present"
