#!/usr/bin/env bash
# Builds engramd under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer,
# both with clang (gcc expands fixed-size memcpy inline without instrumenting it, so its TSan
# misses races on copied rows; and gcc 12 takes three times as long as clang to compile this tree
# with ASan and UBSan, which CI's time limit cannot afford), each in its own build directory,
# and runs the daemon, client (hash), gather, store, ops and chaos suites there. Only what those
# tests need is built (their executables and the programs they start). meson's testlog.json
# stays in each build directory's meson-logs/.
# Usage: tools/sanitize.sh [asan|tsan]...   (default: both)
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
common=(-Dcuda=disabled -Dhip=disabled -Dbench=disabled -Dfuzz=disabled -Dbuildtype=debugoptimized
        -Dc_args=-gline-tables-only -Dcpp_args=-gline-tables-only)

status=0
for kind in "${kinds[@]}"; do
  dir="$prefix-$kind"
  case $kind in
    asan) opts=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
    # Without precompiled headers (base/pch/common_pch.h): a source that forgot an include
    # still compiles where its library's precompiled header supplies it, and fails here.
    tsan) opts=(-Dtsan=true -Db_lundef=false -Db_pch=false) ;;
    *) echo "unknown sanitizer '$kind' (asan, tsan)" >&2; exit 2 ;;
  esac
  # A run whose build fails leaves no test log behind: CI counts that as a failure.
  rm -f "$dir/meson-logs/testlog.json"
  phase_start
  if [[ ! -f "$dir/build.ninja" ]] &&
      ! env "${compilers[@]}" meson setup "$dir" "${common[@]}" "${opts[@]}"; then
    status=1
    continue
  fi
  # Regenerates the build files (and so the introspection read below) if a meson.build changed.
  ninja -C "$dir" build.ninja >/dev/null
  # The tests of `suites` that run C/C++ code in-process, and the targets they need.
  plan=$(/usr/bin/python3 tools/test_plan.py "$dir" --in-process "${suites[@]}")
  mapfile -t tests < <(sed -n 's/^test //p' <<<"$plan")
  mapfile -t targets < <(sed -n 's/^target //p' <<<"$plan")
  echo "== $kind: building ${#targets[@]} targets with $jobs jobs"
  if ! ninja -C "$dir" -j "$jobs" "${targets[@]}"; then
    echo "== $kind: the build failed" >&2
    status=1
    continue
  fi
  phase_end "$kind build"
  echo "== $kind: ${#tests[@]} tests: ${tests[*]}"
  # Leaks count; any report ends the process with exit status 66, which fails its test (for a
  # daemon a test started: testkit/daemon_test_util.h). TSan suppressions, if any, are
  # narrow and say why (tools/tsan.supp).
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=66:strict_string_checks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66"
  export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$root/tools/tsan.supp"
  if ! meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$(nproc)" \
      --timeout-multiplier 4 "${tests[@]}"; then
    status=1
  fi
  phase_end "$kind tests"
  echo "== $kind: testlog at $dir/meson-logs/testlog.json"
done
exit $status
