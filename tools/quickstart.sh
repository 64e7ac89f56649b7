#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds, writes a synthetic
# DeepSeek-V4.1-format checkpoint, validates it, packs its tables (full and one TP4 rank's range),
# checks every copy against the synthetic row function, then starts engramd on the checkpoint,
# drives decode-like and prefill-like gathers through the client library from a separate process
# (every byte checked) once layer 14's load into memory has finished, layer 14 from that resident
# copy and layer 1 through the row cache, shows the row store's memory and hit rate, and stops
# the daemon with SIGTERM.
# The build shows ninja's step counter and keeps its output in
# $ENGRAM_BUILD_DIR/quickstart-build.log.
# Usage: tools/quickstart.sh [--rows N]
#   ENGRAM_BUILD_DIR: build directory (default build); ENGRAM_QUICKSTART_DIR: work files (default
#   $ENGRAM_BUILD_DIR/quickstart); ENGRAM_QUICKSTART_LOAD_TIMEOUT: seconds to wait for the
#   resident load (default 300); ENGRAM_QUICKSTART_PROGRESS_INTERVAL: seconds between the build's
#   progress lines when the output is not a terminal (default 30).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=400000
if [[ "${1:-}" == "--rows" ]]; then rows=$2; fi
load_timeout=${ENGRAM_QUICKSTART_LOAD_TIMEOUT:-300}
progress_interval=${ENGRAM_QUICKSTART_PROGRESS_INTERVAL:-30}
[[ $load_timeout =~ ^[0-9]+$ ]] || {
  echo "quickstart: ENGRAM_QUICKSTART_LOAD_TIMEOUT must be whole seconds (got '$load_timeout')" >&2
  exit 2
}

bash tools/setup.sh
builddir=${ENGRAM_BUILD_DIR:-build}
mkdir -p "$builddir"
build_log=$builddir/quickstart-build.log
: >"$build_log"
# The first build is long (about 15 minutes on 2 cores): say so, show ninja's progress and keep
# the compiler's output in a log instead of printing it.
echo "quickstart: building in $builddir (the first build takes about 15 minutes on 2 cores," \
  "less on more); full output in $build_log"
build_status=0
if [[ ! -f "$builddir/build.ninja" ]]; then
  meson setup "$builddir" >>"$build_log" 2>&1 || build_status=$?
fi
if [[ $build_status -eq 0 ]]; then
  meson compile -C "$builddir" 2>&1 | tools/build_progress.sh "$build_log" "$progress_interval" \
    || build_status=$?
fi
if [[ $build_status -ne 0 ]]; then
  echo "quickstart: the build failed; the end of $build_log:" >&2
  tail -n 25 "$build_log" >&2
  exit 1
fi
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
  # The socket answers "starting" until the tables are open: wait until it serves.
  "$builddir/tools/engramctl/engramctl" status --socket "$work/engramd.sock" >/dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "engramd failed to start"; exit 1; }
  sleep 0.05
done

ctl="$builddir/tools/engramctl/engramctl"
step "waiting for layer 14's load into memory (at most $load_timeout s), so that the gathers" \
  "below show each tier as it serves once started, not while it loads"
# Until its load ends a resident table serves the rows not loaded yet from storage: timed then,
# "resident" would show a mix of memory and disk.
resident_state() {
  "$ctl" tables --no-residency --json --socket "$work/engramd.sock" | python3 -c '
import json, sys
reply = json.load(sys.stdin)
if "tables" not in reply:
    print("engramctl tables: %s" % reply.get("error", reply))
    sys.exit(2)
tables = [t for t in reply["tables"] if t.get("tier") == "resident"]
states = {t.get("resident_load_state") for t in tables}
for t in tables:
    if t.get("resident_load_state") in ("failed", "cancelled", "waiting"):
        error = t.get("resident_load_error")
        print("layer %d: load %s%s" % (t["layer"], t["resident_load_state"],
                                       ": " + error if error else ""))
        sys.exit(2)
print(", ".join("layer %d %s, %d of %d rows" % (t["layer"], t["resident_load_state"],
      t["resident_rows_loaded"], t["covered_end"] - t["covered_begin"]) for t in tables))
sys.exit(0 if states <= {"loaded"} else 1)'
}
load_start=$SECONDS
while true; do
  load_status=0
  state=$(resident_state) || load_status=$?
  if [[ $load_status -eq 0 ]]; then
    echo "$state (waited $((SECONDS - load_start)) s)"
    break
  fi
  kill -0 "$daemon_pid" 2>/dev/null || { echo "quickstart: engramd exited" >&2; exit 1; }
  if [[ $load_status -ne 1 ]]; then
    echo "quickstart: the resident load did not finish: $state" >&2
    exit 1
  fi
  if ((SECONDS - load_start >= load_timeout)); then
    echo "quickstart: still loading after $load_timeout s: $state" >&2
    echo "(ENGRAM_QUICKSTART_LOAD_TIMEOUT=SECONDS waits longer; engramctl tables shows progress)" >&2
    exit 1
  fi
  sleep 0.2
done

step "engram-demo: decode-like and prefill-like gathers from a separate client process" \
  "(layer 14 from memory, layer 1 through the row cache, started empty)"
for layer in 14 1; do
  "$builddir/tools/demo/engram-demo" --socket "$work/engramd.sock" --synthetic-seed 7 \
    --table "$layer"
done
step "row store: memory, cache hit rate and evictions (row ids above are uniform: the worst case)"
"$ctl" status --socket "$work/engramd.sock" | sed -n '/^  row store/,/^  budget split/p'
"$ctl" stats --socket "$work/engramd.sock" | grep -E "^layer|tier "
# engram-demo read layer 14 in place (no request to engramd); engramd still counts those rows,
# from the session's touch page, as rows it served from memory.
"$ctl" stats --json --socket "$work/engramd.sock" | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tables"]:
    if t.get("tier") != "resident":
        continue
    if t["store_rows"] == 0 or t["store_hit_rows"] != t["store_rows"]:
        print("quickstart: engramd counts %d rows of resident layer %d, %d of them from memory"
              % (t["store_rows"], t["layer"], t["store_hit_rows"]), file=sys.stderr)
        sys.exit(1)'

step "stopping engramd (SIGTERM)"
kill -TERM "$daemon_pid"
status=0
wait "$daemon_pid" || status=$?
daemon_pid=
echo "engramd exited with status $status"
exit "$status"
