#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds, writes a synthetic
# DeepSeek-V4.1-format checkpoint, validates it, packs its tables (full and one TP4 rank's range),
# checks every copy against the synthetic row function, then starts engramd on the checkpoint,
# drives decode-like and prefill-like gathers through the client library from a separate process
# (every byte checked), layer 14 from a resident copy and layer 1 through the row cache, shows
# the row store's memory and hit rate, and stops the daemon with SIGTERM.
# Usage: tools/quickstart.sh [--rows N]   (work files go to $ENGRAM_QUICKSTART_DIR or build/quickstart)
set -euo pipefail
cd "$(dirname "$0")/.."
rows=400000
if [[ "${1:-}" == "--rows" ]]; then rows=$2; fi

bash tools/setup.sh
builddir=${ENGRAM_BUILD_DIR:-build}
[[ -f "$builddir/build.ninja" ]] || meson setup "$builddir" >/dev/null
meson compile -C "$builddir" >/dev/null
bin=$builddir/tools/tables
work=${ENGRAM_QUICKSTART_DIR:-$builddir/quickstart}
rm -rf "$work"
mkdir -p "$work"

step() { printf '\n== %s\n' "$*"; }

step "writing a synthetic DeepSeek-V4.1 checkpoint ($rows rows per table) to $work/model"
"$bin/engram-synth" "$work/model" --rows "$rows" --seed 7

step "validating it and checking sampled rows against the synthetic row function"
"$bin/engram-inspect" "$work/model" --verify-synthetic --seed 7

step "packing both tables, and the TP4 rank-1 range of layer 14 as a compacted per-rank copy"
rank_begin=$((rows / 4)); rank_end=$((rows / 2))
"$bin/engram-pack" "$work/model" --layer 1 --out "$work/layer1.engram"
"$bin/engram-pack" "$work/model" --layer 14 --out "$work/layer14.engram"
"$bin/engram-pack" "$work/model" --layer 14 --rows "$rank_begin:$rank_end" \
  --out "$work/layer14.rank1.engram"
for f in "$work"/*.engram; do
  "$bin/engram-inspect" "$f" --verify-synthetic --seed 7
done

step "starting engramd on $work/model: layer 14 resident, layer 1 through a 32 MiB row cache"
# A memory budget (docs/operations.md, "Memory budget"): layer 14 in memory, layer 1's hot rows
# in the cache, its misses read with O_DIRECT. The row store gets what the process, its buffers
# (which grow with the CPUs) and the arenas' and page cache's shares (a quarter and a tenth of
# the budget) leave: the budget is what the store needs plus a generous allowance per CPU, over
# 13/20.
resident_bytes=$(((rows * 264 + 2097151) / 2097152 * 2097152))
others=$(((64 + $(nproc) * 40) * 1048576))
budget=$(((resident_bytes + 32 * 1048576 + others) * 20 / 13 + 1048576))
"$builddir/daemon/engramd" --model "$work/model" --socket "$work/engramd.sock" \
  --tier 14=resident --tier 1=cache --cache-bytes 32M --memory-budget "$budget" &
daemon_pid=$!
trap '[[ -n "${daemon_pid:-}" ]] && kill -9 "$daemon_pid" 2>/dev/null || true' EXIT
for _ in $(seq 400); do
  [[ -S "$work/engramd.sock" ]] && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "engramd failed to start"; exit 1; }
  sleep 0.05
done

step "engram-demo: decode-like and prefill-like gathers from a separate client process"
for layer in 14 1; do
  "$builddir/tools/demo/engram-demo" --socket "$work/engramd.sock" --synthetic-seed 7 \
    --table "$layer"
done
step "row store: memory, cache hit rate and evictions (row ids above are uniform: the worst case)"
ctl="$builddir/tools/engramctl/engramctl"
"$ctl" status --socket "$work/engramd.sock" | grep -E "row store|row cache"
"$ctl" stats --socket "$work/engramd.sock" | grep -E "^layer|tier "

step "stopping engramd (SIGTERM)"
kill -TERM "$daemon_pid"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=
echo "engramd exited with status $status"
exit "$status"
