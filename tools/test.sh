#!/usr/bin/env bash
# Builds engramd and runs every test (Catch2, pytest, fuzz smoke runs, unit-file checks), then
# cross-builds for arm64 (DGX Spark) what the table, gather, hash, daemon, ops and GPU (CPU-side)
# suites need and runs them on the arm64 binaries under qemu-user.
# Usage: tools/test.sh [meson test args...]   e.g. tools/test.sh --suite table
#   Arguments go to both runs; without them the arm64 run takes the suites above and builds only
#   their targets (tools/test_plan.py), with them it builds the whole arm64 tree.
#   ENGRAM_BUILD_DIR     native build directory (default build); arm64 builds in it + "-arm64"
#   ENGRAM_ARM64=0       native only
#   ENGRAM_SETUP_ARGS    more options for the native build's meson setup (.ci/run: -Ddebug=false)
#   ENGRAM_PHASE_TIMES   a file to which each build and test phase appends one line:
#                        "PHASE<TAB>wall seconds<TAB>CPU seconds" (.ci/run prints them)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/phase_times.sh
arm64=${ENGRAM_ARM64:-1}
if [[ $arm64 == 1 ]]; then
  bash tools/setup.sh --arch arm64
else
  bash tools/setup.sh
fi
builddir=${ENGRAM_BUILD_DIR:-build}
phase_start
if [[ ! -f "$builddir/build.ninja" ]]; then
  read -ra setup_args <<<"${ENGRAM_SETUP_ARGS:-}"
  meson setup "$builddir" "${setup_args[@]}"
fi
meson compile -C "$builddir"
phase_end "native build"
rc=0
meson test -C "$builddir" --print-errorlogs --num-processes "$(nproc)" "$@" || rc=$?
phase_end "native tests"
[[ $arm64 == 1 ]] || exit "$rc"

# arm64: no GPU kernels, benchmarks or fuzzers, and of the rest only what its tests need. No
# debug information either (-Ddebug=false keeps -O2 and the asserts): gcc generates the same
# code without -g, and nothing debugs these binaries under qemu.
armdir=$builddir-arm64
if [[ ! -f "$armdir/build.ninja" ]]; then
  meson setup "$armdir" --cross-file cross/aarch64-linux-gnu.ini \
    -Dcuda=disabled -Dhip=disabled -Dbench=disabled -Dfuzz=disabled -Ddebug=false
fi
arm_args=("$@")
if ((${#arm_args[@]})); then
  meson compile -C "$armdir" || exit 1
else
  suites=(table gather hash daemon ops gpu)
  for s in "${suites[@]}"; do arm_args+=(--suite "$s"); done
  # Regenerates the build files (and so the introspection read below) if a meson.build changed.
  ninja -C "$armdir" build.ninja >/dev/null
  mapfile -t targets < <(/usr/bin/python3 tools/test_plan.py "$armdir" "${suites[@]}" |
                         sed -n 's/^target //p')
  echo "tests: arm64: building the ${#targets[@]} targets of the ${suites[*]} suites"
  ninja -C "$armdir" "${targets[@]}" || exit 1
fi
phase_end "arm64 build"
echo "tests: arm64 binaries under $(qemu-aarch64-static --version | head -1)"
meson test -C "$armdir" --no-rebuild --print-errorlogs --num-processes "$(nproc)" \
  "${arm_args[@]}" || rc=1
phase_end "arm64 tests"
exit "$rc"
