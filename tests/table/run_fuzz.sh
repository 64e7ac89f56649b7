#!/bin/bash
# Builds the table-header libFuzzer target with clang (address + undefined + fuzzer sanitizers)
# against the table library's sources and runs it briefly on a seed corpus.
# Usage: run_fuzz.sh FUZZ_SOURCE SOURCE_ROOT BUILD_DIR SECONDS TABLE_SOURCES...
# Exits 77 (skipped) when clang or its fuzzer runtime is missing.
set -euo pipefail
src=$1 root=$2 out=$3 seconds=$4
shift 4
clang=$(command -v clang++ || command -v clang++-14 || true)
if [[ -z "$clang" ]]; then
  echo "SKIP: clang++ not found (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
name=$(basename "$src" .cc)
bin="$out/$name"
objdir="$out/$name.objs"
mkdir -p "$objdir"
libs=$(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format libxxhash)
flags=(-std=c++20 -O1 -gline-tables-only -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I"$root")
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
      echo "SKIP: clang's libFuzzer runtime is missing (apt-get install libclang-rt-14-dev)"
      exit 77
    fi
    cat "$out/$name.build.log"
    exit 1
  fi
fi
corpus="$out/$name.corpus"
mkdir -p "$corpus"
# Seeds: a small valid shard and a valid packed file, so mutations start from the real formats.
if [[ ! -e "$corpus/seed-shard" ]]; then
  json='{"a":{"dtype":"F8_E4M3","shape":[2,256],"data_offsets":[0,512]},"b":{"dtype":"F8_E8M0","shape":[2,8],"data_offsets":[512,528]}}'
  { printf "$(printf '\\x%02x' ${#json} 0 0 0 0 0 0 0)"; printf '%s' "$json"; head -c 528 /dev/zero; } \
    >"$corpus/seed-shard"
fi
if [[ ! -e "$corpus/seed-packed" ]]; then
  # A 2-row packed table (docs/table_format.md); the target reseals the checksum itself.
  /usr/bin/python3 -c '
import struct, sys
h = struct.pack("<8sHHIIIQQQQIIIBBHQ40sQ", b"ENGRAMTB", 1, 0, 128, 14, 264, 2, 0, 2, 4096,
                0, 256, 8, 1, 2, 32, 4096 + 2 * 264, bytes(40), 0)
sys.stdout.buffer.write(h + bytes(4096 - len(h)) + bytes(range(256)) * 2 + bytes(16))
' >"$corpus/seed-packed"
fi
exec "$bin" -max_total_time="$seconds" -rss_limit_mb=1024 -malloc_limit_mb=512 \
  -print_final_stats=1 "$corpus"
