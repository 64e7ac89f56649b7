#!/usr/bin/env bash
# The main job end to end: writes a synthetic checkpoint, starts engramd on it, drives a
# decode-like and a prefill-like workload through the client library from another process
# (every byte checked), then stops the daemon with SIGTERM and checks it exited cleanly.
# Usage: tools/demo/run_demo.sh [BUILD_DIR]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
[[ "$build" = /* ]] || build=$root/$build
work=$(mktemp -d /tmp/engram-demo-XXXXXX)
daemon_pid=
cleanup() {
  if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then kill -9 "$daemon_pid"; fi
  rm -rf "$work"
}
trap cleanup EXIT
seed=7
rows=400000
echo "== writing a synthetic DeepSeek-V4.1 checkpoint ($rows rows per Engram layer) in $work/model"
"$build/tools/tables/engram-synth" "$work/model" --rows "$rows" --seed "$seed" --quiet
echo "== starting engramd"
"$build/daemon/engramd" --model "$work/model" --socket "$work/engramd.sock" &
daemon_pid=$!
for _ in $(seq 200); do
  [[ -S "$work/engramd.sock" ]] && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "engramd failed to start"; exit 1; }
  sleep 0.05
done
echo "== engram-demo (a separate client process)"
"$build/tools/demo/engram-demo" --socket "$work/engramd.sock" --synthetic-seed "$seed"
echo "== stopping engramd (SIGTERM)"
kill -TERM "$daemon_pid"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=
echo "engramd exited with status $status"
exit "$status"
