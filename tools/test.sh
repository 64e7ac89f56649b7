#!/usr/bin/env bash
# Builds engramd and runs every test (Catch2, pytest, fuzz smoke runs, unit-file checks), then
# cross-builds for arm64 (DGX Spark) what the table, gather, hash, daemon, ops and GPU (CPU-side)
# suites need and runs them on the arm64 binaries under qemu-user.
# Usage: tools/test.sh [meson test args...]   e.g. tools/test.sh --suite table
#   Arguments go to both runs; without them the arm64 run takes the suites above and builds only
#   their targets (tools/test_plan.py), with them it builds the whole arm64 tree.
#   ENGRAM_BUILD_DIR     native build directory (default build); arm64 builds in it + "-arm64"
#   ENGRAM_ARM64=0       native only
#   ENGRAM_SANITIZE=1    the sanitizer runs too (tools/sanitize.sh asan, then tsan; .ci/run)
#   ENGRAM_SETUP_ARGS    more options for the native build's meson setup (.ci/run: -Ddebug=false)
#   ENGRAM_PHASE_TIMES   a file to which each build and test phase appends one line:
#                        "PHASE<TAB>wall seconds<TAB>CPU seconds" (.ci/run prints them)
# Where there is more than one run, the test phases that keep about one core busy (qemu-user's
# tests, the sanitizer runs' tests, which mostly run one at a time) and the package test (suite
# deb: a package build, lintian and apt) each run beside the next build, whose compiler takes the
# other core. The native tests run alone: some of them time their work.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/phase_times.sh
arm64=${ENGRAM_ARM64:-1}
sanitize=${ENGRAM_SANITIZE:-0}
if [[ $arm64 == 1 ]]; then
  bash tools/setup.sh --arch arm64
else
  bash tools/setup.sh
fi
builddir=${ENGRAM_BUILD_DIR:-build}
armdir=$builddir-arm64
logs=$builddir/meson-logs
rc=0

# Runs the phase $1 (a shell function) in the background, its output kept in $logs/$1.log and
# printed whole when it ends (wait_beside), so that it does not interleave with the foreground's.
beside_pid=
beside_name=
run_beside() {
  beside_name=$1
  (
    phase_start
    "$1" && status=0 || status=$?
    exit "$status"
  ) >"$logs/$1.log" 2>&1 &
  beside_pid=$!
}
# Waits for the phase run_beside started; its failure fails the run.
wait_beside() {
  [[ -n $beside_pid ]] || return 0
  wait "$beside_pid" || rc=1
  echo "== $beside_name (ran beside the build above):"
  cat "$logs/$beside_name.log"
  beside_pid=
}

native_build() {
  if [[ ! -f "$builddir/build.ninja" ]]; then
    local setup_args
    read -ra setup_args <<<"${ENGRAM_SETUP_ARGS:-}"
    meson setup "$builddir" "${setup_args[@]}"
  fi
  meson compile -C "$builddir"
  phase_end "native build"
}

# $@: more meson test arguments.
native_tests() {
  meson test -C "$builddir" --print-errorlogs --num-processes "$(nproc)" "$@" || return 1
}

# The package suite apart, with its own log (meson-logs/testlog-deb.json).
deb_tests() {
  local status=0
  meson test -C "$builddir" --no-rebuild --print-errorlogs --logbase testlog-deb --suite deb ||
    status=1
  phase_end "deb tests"
  return $status
}

# arm64: no GPU kernels, benchmarks or fuzzers, and of the rest only what its tests need. No
# debug information either (-Ddebug=false keeps -O2 and the asserts): gcc generates the same
# code without -g, and nothing debugs these binaries under qemu.
# This build and the sanitizer builds compile each target as one file (meson's unity build,
# up to 16 files in one): the headers are parsed and the templates instantiated once per
# target, not once per file (the ops library: 43 CPU-s against 100). The native build keeps one
# object per file, so a file that lacks an include still fails there; a name defined in two
# files of one target (in an anonymous namespace too) fails the unity builds.
arm_args=("$@")
arm64_build() {
  if [[ ! -f "$armdir/build.ninja" ]]; then
    meson setup "$armdir" --cross-file cross/aarch64-linux-gnu.ini \
      -Dcuda=disabled -Dhip=disabled -Dbench=disabled -Dfuzz=disabled -Ddebug=false \
      -Dunity=on -Dunity_size=16
  fi
  if ((${#arm_args[@]})); then
    meson compile -C "$armdir" || return 1
  else
    local suites=(table gather hash daemon ops gpu) s targets
    for s in "${suites[@]}"; do arm_args+=(--suite "$s"); done
    # Regenerates the build files (and so the introspection read below) if a meson.build changed.
    ninja -C "$armdir" build.ninja >/dev/null
    mapfile -t targets < <(/usr/bin/python3 tools/test_plan.py "$armdir" "${suites[@]}" |
                           sed -n 's/^target //p')
    echo "tests: arm64: building the ${#targets[@]} targets of the ${suites[*]} suites"
    ninja -C "$armdir" "${targets[@]}" || return 1
  fi
  phase_end "arm64 build"
}

# qemu-user runs the binaries several times slower than the hardware, and slower still beside a
# build: the timeouts stretch accordingly.
arm64_tests() {
  local status=0
  echo "tests: arm64 binaries under $(qemu-aarch64-static --version | head -1)"
  meson test -C "$armdir" --no-rebuild --print-errorlogs --num-processes "$(nproc)" \
    --timeout-multiplier 3 "${arm_args[@]}" || status=1
  phase_end "arm64 tests"
  return $status
}

asan_tests() { bash tools/sanitize.sh --tests-only asan; }
tsan_tests() { bash tools/sanitize.sh --tests-only tsan; }

phase_start
native_build
if [[ $arm64 == 0 && $sanitize == 0 ]]; then
  native_tests "$@" || rc=1
  phase_end "native tests"
  exit "$rc"
fi
# The package test waits to run beside a later phase, unless the arguments chose the tests.
if (($#)); then
  native_tests "$@" || rc=1
else
  native_tests --no-suite deb || rc=1
fi
phase_end "native tests"
deferred_deb=$((!$#))
if [[ $arm64 == 1 ]]; then
  arm64_build || exit 1
  run_beside arm64_tests
fi
if [[ $sanitize == 1 ]]; then
  bash tools/sanitize.sh --build-only asan && asan_built=1 || { asan_built=0; rc=1; }
  wait_beside
  ((asan_built)) && run_beside asan_tests
  bash tools/sanitize.sh --build-only tsan && tsan_built=1 || { tsan_built=0; rc=1; }
  wait_beside
  ((tsan_built)) && run_beside tsan_tests
fi
phase_start
if ((deferred_deb)); then
  deb_tests || rc=1
fi
wait_beside
exit "$rc"
