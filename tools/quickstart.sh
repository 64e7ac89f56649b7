#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds, writes a synthetic
# DeepSeek-V4.1-format checkpoint, validates it, packs its tables (full and one TP4 rank's range),
# checks every copy against the synthetic row function, then starts engramd on the checkpoint,
# drives decode-like and prefill-like gathers through the client library from a separate process
# (every byte checked) and stops the daemon with SIGTERM.
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

step "starting engramd on $work/model"
"$builddir/daemon/server/engramd" --model "$work/model" --socket "$work/engramd.sock" &
daemon_pid=$!
trap '[[ -n "${daemon_pid:-}" ]] && kill -9 "$daemon_pid" 2>/dev/null || true' EXIT
for _ in $(seq 400); do
  [[ -S "$work/engramd.sock" ]] && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "engramd failed to start"; exit 1; }
  sleep 0.05
done

step "engram-demo: decode-like and prefill-like gathers from a separate client process"
"$builddir/tools/demo/engram-demo" --socket "$work/engramd.sock" --synthetic-seed 7

step "stopping engramd (SIGTERM)"
kill -TERM "$daemon_pid"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=
echo "engramd exited with status $status"
exit "$status"
