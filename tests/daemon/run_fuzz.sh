#!/bin/bash
# Builds one libFuzzer target with clang (address + fuzzer sanitizers) and runs it briefly.
# Usage: run_fuzz.sh FUZZ_SOURCE CODEC_SOURCE SOURCE_ROOT BUILD_DIR [SECONDS]
# Exits 77 (skipped) when clang or its fuzzer runtime is missing.
set -euo pipefail
src=$1 codec=$2 root=$3 out=$4 seconds=${5:-4}
clang=$(command -v clang++ || command -v clang++-14 || true)
if [[ -z "$clang" ]]; then
  echo "SKIP: clang++ not found (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
name=$(basename "$src" .cc)
bin="$out/$name"
if ! "$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$root" -I"$root/include" "$src" "$codec" -o "$bin" 2>"$out/$name.build.log"; then
  if grep -q -e "libclang_rt.fuzzer" -e "cannot find" "$out/$name.build.log"; then
    echo "SKIP: clang's libFuzzer runtime is missing (apt-get install libclang-rt-14-dev)"
    exit 77
  fi
  cat "$out/$name.build.log"
  exit 1
fi
corpus="$out/$name.corpus"
mkdir -p "$corpus"
exec "$bin" -max_total_time="$seconds" -rss_limit_mb=1024 -print_final_stats=1 "$corpus"
