#!/bin/bash
# Builds one libFuzzer target with clang (address + undefined + fuzzer sanitizers) from its
# source and the project sources it exercises, and runs it briefly.
# Usage: run_fuzz.sh FUZZ_SOURCE SOURCE_ROOT BUILD_DIR SECONDS [SOURCES...]
#   FUZZ_PKGS   pkg-config packages to link (none by default)
#   FUZZ_SEEDS  a script run with the corpus directory to write seed inputs into it
#   FUZZ_CXX    the clang++ to build with (meson's; found on PATH when unset)
#   FUZZ_REQUIRED  non-empty (-Dfuzz=enabled): a missing clang or fuzzer runtime fails (exit 1)
# Otherwise exits 77 (skipped) when clang or its fuzzer runtime is missing.
set -euo pipefail
src=$1 root=$2 out=$3 seconds=$4
shift 4
missing() {
  if [[ -n "${FUZZ_REQUIRED:-}" ]]; then
    echo "FAIL: $1 (-Dfuzz=enabled requires it)"
    exit 1
  fi
  echo "SKIP: $1"
  exit 77
}
clang=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [[ -z "$clang" ]]; then
  missing "clang++ not found (apt-get install clang libclang-rt-14-dev)"
fi
name=$(basename "$src" .cc)
bin="$out/$name"
objdir="$out/$name.objs"
mkdir -p "$objdir"
libs=""
if [[ -n "${FUZZ_PKGS:-}" ]]; then libs=$(pkg-config --libs $FUZZ_PKGS); fi
flags=(-std=c++20 -O1 -gline-tables-only -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I"$root" -I"$root/include")
# Rebuild only when a source or this script changed; compile the units two at a time.
stale=0
for f in "$src" "$@" "$0"; do [[ -e "$bin" && "$bin" -nt "$f" ]] || stale=1; done
if ((stale)); then
  : >"$out/$name.build.log"
  objs=()
  pids=()
  for f in "$src" "$@"; do
    o="$objdir/$(basename "$f" .cc).o"
    objs+=("$o")
    "$clang" "${flags[@]}" -c "$f" -o "$o" 2>>"$out/$name.build.log" &
    pids+=($!)
    if ((${#pids[@]} >= 2)); then wait "${pids[0]}" || stale=2; pids=("${pids[@]:1}"); fi
  done
  for p in "${pids[@]}"; do wait "$p" || stale=2; done
  if ((stale == 2)) || ! "$clang" "${flags[@]}" "${objs[@]}" $libs -o "$bin" \
      2>>"$out/$name.build.log"; then
    if grep -q -e "libclang_rt.fuzzer" -e "cannot find -lclang" "$out/$name.build.log"; then
      missing "clang's libFuzzer runtime is missing (apt-get install libclang-rt-14-dev)"
    fi
    cat "$out/$name.build.log"
    exit 1
  fi
fi
corpus="$out/$name.corpus"
mkdir -p "$corpus"
if [[ -n "${FUZZ_SEEDS:-}" ]]; then bash "$FUZZ_SEEDS" "$corpus"; fi
# libFuzzer exits with 77 on a crash by default, which meson would count as a skip.
exec "$bin" -max_total_time="$seconds" -rss_limit_mb=1024 -malloc_limit_mb=512 \
  -error_exitcode=1 -print_final_stats=1 "$corpus"
