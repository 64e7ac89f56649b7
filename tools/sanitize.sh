#!/usr/bin/env bash
# Builds engramd under AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer,
# each in its own build directory, and runs the daemon, client (hash), gather, ops and chaos
# suites there. meson's testlog.json stays in each build directory's meson-logs/.
# Usage: tools/sanitize.sh [asan|tsan]...   (default: both)
#   SANITIZE_BUILD_DIR=build-san (prefix: build-san-asan, build-san-tsan)
# Exit status: 0 when every selected run passed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
prefix=${SANITIZE_BUILD_DIR:-build-san}
kinds=("$@")
[[ ${#kinds[@]} -eq 0 ]] && kinds=(asan tsan)
suites=(daemon hash gather ops chaos)
common=(-Dcuda=disabled -Dhip=disabled -Dbench=disabled -Dfuzz=disabled -Dbuildtype=debugoptimized)

# The tests of `suites` that run C/C++ code in-process: Python tests would load the sanitizer
# runtime late (ctypes), and the libFuzzer runs build with clang on their own.
tests_of() {
  local dir=$1
  local args=()
  for s in "${suites[@]}"; do args+=(--suite "$s"); done
  meson test -C "$dir" --list "${args[@]}" 2>/dev/null |
    sed -n 's/^engramd:[a-z]* \/ //p' | grep -v -E 'pytest|fuzz' || true
}

status=0
for kind in "${kinds[@]}"; do
  dir="$prefix-$kind"
  case $kind in
    asan) opts=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
    tsan) opts=(-Dtsan=true -Db_lundef=false) ;;
    *) echo "unknown sanitizer '$kind' (asan, tsan)" >&2; exit 2 ;;
  esac
  if [[ ! -f "$dir/build.ninja" ]]; then
    meson setup "$dir" "${common[@]}" "${opts[@]}"
  fi
  meson compile -C "$dir"
  mapfile -t tests < <(tests_of "$dir")
  echo "== $kind: ${#tests[@]} tests: ${tests[*]}"
  # Leaks count; any report ends the test with a failure (exit code 66 for ASan/UBSan, 66 for
  # TSan). The TSan suppressions are narrow and say why (tools/tsan.supp).
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=66:strict_string_checks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66"
  export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$root/tools/tsan.supp"
  if ! meson test -C "$dir" --print-errorlogs --num-processes "$(nproc)" \
      --timeout-multiplier 4 "${tests[@]}"; then
    status=1
  fi
  echo "== $kind: testlog at $dir/meson-logs/testlog.json"
done
exit $status
