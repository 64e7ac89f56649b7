#!/usr/bin/env bash
# Installs every Debian 12 package that building, testing, packaging and benchmarking engramd
# needs. Idempotent: packages already present are skipped, and apt is only consulted when one
# is missing.
# Usage: tools/setup.sh [--arch arm64]
#   --arch arm64   also the aarch64 cross toolchain, the arm64 (multiarch) -dev packages and
#                  qemu-user-static, for the cross build in cross/aarch64-linux-gnu.ini
set -euo pipefail

cross_arch=
while (($#)); do
  case $1 in
    --arch)
      [[ ${2:-} == arm64 ]] || { echo "setup: --arch takes arm64 (got '${2:-}')" >&2; exit 2; }
      cross_arch=arm64
      shift 2
      ;;
    *) echo "setup: unknown argument '$1' (usage: tools/setup.sh [--arch arm64])" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential pkg-config meson ninja-build clang libclang-rt-14-dev
  # tests/structure's format check: the release whose layout the tree follows.
  clang-format
  liburing-dev libabsl-dev catch2 libbenchmark-dev
  libfmt-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libxxhash-dev
  python3 python3-numpy python3-torch python3-pytest python3-matplotlib
  python3-venv python3-pip python3-mesonpy patchelf
  systemd
  # man and groff, whose warnings the kit suite's check of the man pages (man/) reads; the kit
  # suite's checks of the Prometheus rules (PyYAML) and of the zsh completion (zsh -n).
  man-db groff-base python3-yaml zsh
  # promtool, for the kit suite's promtool check metrics of the scrape and the textfile and the
  # alert rules' unit tests: Debian ships it only in the Prometheus server's package (96 MB
  # installed, with its service unit), small beside PyTorch; the tests skip where it is missing.
  prometheus
  # Debian packages (debian/): dpkg-buildpackage, debhelper, lintian.
  dpkg-dev debhelper lintian
)
if [[ "${ENGRAM_SETUP_HIP:-1}" == 1 ]]; then
  packages+=(hipcc)
fi
# The libraries engramd links, for the target architecture (the header-only ones are
# architecture-independent and come with the list above).
cross_packages=(
  crossbuild-essential-arm64 qemu-user-static
  liburing-dev:arm64 libabsl-dev:arm64 libfmt-dev:arm64
  libtomlplusplus-dev:arm64 libxxhash-dev:arm64
  # For dpkg-buildpackage -aarm64: aarch64-linux-gnu-pkg-config.
  pkgconf:arm64
)

sudo_cmd=()
[[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
if [[ -n $cross_arch ]]; then
  packages+=("${cross_packages[@]}")
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "setup: adding the arm64 architecture to dpkg (multiarch)"
    "${sudo_cmd[@]}" dpkg --add-architecture arm64
    "${sudo_cmd[@]}" apt-get update -qq
  fi
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
echo "setup: all ${#packages[@]} packages present"
