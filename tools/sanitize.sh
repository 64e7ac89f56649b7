#!/usr/bin/env bash
# Builds engramd under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer,
# both with clang (gcc expands fixed-size memcpy inline without instrumenting it, so its TSan
# misses races on copied rows; and gcc 12 takes three times as long as clang to compile this tree
# with ASan and UBSan, which CI's time limit cannot afford), each in its own build directory,
# and runs the daemon, client (hash), gather, store, ops and chaos suites there. Only what those
# tests need is built (their executables and the programs they start). meson's testlog.json
# stays in each build directory's meson-logs/.
# Usage: tools/sanitize.sh [--build-only|--tests-only] [asan|tsan]...   (default: both)
#   --build-only, --tests-only: one half of each run (tools/test.sh runs one run's tests beside
#   the next one's build); --tests-only runs what an earlier --build-only built.
#   SANITIZE_BUILD_DIR=build-san (prefix: build-san-asan, build-san-tsan)
#   SANITIZE_JOBS=N   parallel compile jobs (default: the number of cores)
#   ENGRAM_PHASE_TIMES   a file to which each run appends the wall and CPU seconds of its build
#                        and of its tests (tools/phase_times.sh)
# Exit status: 0 when every selected run passed.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/phase_times.sh
root=$(pwd)
prefix=${SANITIZE_BUILD_DIR:-build-san}
jobs=${SANITIZE_JOBS:-$(nproc)}
do_build=1
do_tests=1
case ${1:-} in
  --build-only) do_tests=0; shift ;;
  --tests-only) do_build=0; shift ;;
esac
kinds=("$@")
[[ ${#kinds[@]} -eq 0 ]] && kinds=(asan tsan)
suites=(daemon hash gather store ops chaos)
ccache=$(command -v ccache >/dev/null && echo "ccache " || true)
# Both runs build with clang. meson puts ccache in front of the compilers it finds itself, not
# of those named in CC/CXX.
compilers=(CC="${ccache}clang" CXX="${ccache}clang++")
# Debug information as line tables only (the last -g option wins over the build type's -g):
# a report's stack names functions, files, lines and inlined frames, and that is all it reads
# from it; variable and type information is for a debugger, and the rest of -g's cost.
# Each target compiles as one file (meson's unity build; tools/test.sh says why).
common=(-Dcuda=disabled -Dhip=disabled -Dbench=disabled -Dfuzz=disabled -Dbuildtype=debugoptimized
        -Dc_args=-gline-tables-only -Dcpp_args=-gline-tables-only -Dunity=on -Dunity_size=16)

# The tests of `suites` that run C/C++ code in-process ("test NAME") and the targets they need
# ("target PATH"), from the build directory $1's introspection.
plan_of() {
  # Regenerates the build files (and so the introspection) if a meson.build changed.
  ninja -C "$1" build.ninja >/dev/null
  /usr/bin/python3 tools/test_plan.py "$1" --in-process "${suites[@]}"
}

# Configures (once) and builds the run $1 in $2.
build_run() {
  local kind=$1 dir=$2 opts targets
  case $kind in
    asan) opts=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
    tsan) opts=(-Dtsan=true -Db_lundef=false) ;;
  esac
  # A run whose build fails leaves no test log behind: CI counts that as a failure.
  rm -f "$dir/meson-logs/testlog.json"
  if [[ ! -f "$dir/build.ninja" ]] &&
      ! env "${compilers[@]}" meson setup "$dir" "${common[@]}" "${opts[@]}"; then
    return 1
  fi
  mapfile -t targets < <(plan_of "$dir" | sed -n 's/^target //p')
  echo "== $kind: building ${#targets[@]} targets with $jobs jobs"
  if ! ninja -C "$dir" -j "$jobs" "${targets[@]}"; then
    echo "== $kind: the build failed" >&2
    return 1
  fi
}

# Runs the tests of the run $1, built in $2.
test_run() {
  local kind=$1 dir=$2 tests
  [[ -f "$dir/build.ninja" ]] || { echo "== $kind: $dir is not built" >&2; return 1; }
  mapfile -t tests < <(plan_of "$dir" | sed -n 's/^test //p')
  echo "== $kind: ${#tests[@]} tests: ${tests[*]}"
  # Leaks count; any report ends the process with exit status 66, which fails its test (for a
  # daemon a test started: testkit/daemon_test_util.h). TSan suppressions, if any, are
  # narrow and say why (tools/tsan.supp).
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=66:strict_string_checks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66"
  export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$root/tools/tsan.supp"
  local rc=0
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$(nproc)" \
    --timeout-multiplier 4 "${tests[@]}" || rc=1
  echo "== $kind: testlog at $dir/meson-logs/testlog.json"
  return $rc
}

status=0
for kind in "${kinds[@]}"; do
  case $kind in
    asan | tsan) ;;
    *) echo "unknown sanitizer '$kind' (asan, tsan)" >&2; exit 2 ;;
  esac
  dir="$prefix-$kind"
  phase_start
  if ((do_build)); then
    build_run "$kind" "$dir" || { status=1; continue; }
    phase_end "$kind build"
  fi
  if ((do_tests)); then
    test_run "$kind" "$dir" || status=1
    phase_end "$kind tests"
  fi
done
exit $status
