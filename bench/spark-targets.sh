#!/usr/bin/env bash
# The DGX Spark row-cache targets in one go: runs each benchmark that measures one, keeps its raw
# output, and prints one table (target, measured, met/missed). bench/README.md ("DGX Spark
# targets") says what each target is and how it is measured; docs/performance.md has the results.
#
#   bench/spark-targets.sh BIN_DIR [--quick] [--out DIR] [--work DIR] [--token-trace FILE]
#
# BIN_DIR: a folder holding the binaries (a GPU bundle's bin/, its lib/ beside it) or a meson
# build folder. Needs engram-ranks, engram-miss-cpu, engramd, engramctl, engram-synth and
# engram-trace-replay; bench/store/restart_hit_rate.py and tools/fdstore.py (found beside this
# script, as in the repository and the bundle); python3 (standard library only).
# --work: where the tables go (the device to measure; O_DIRECT must work there), default
# /var/tmp/engram-spark; --out: the raw outputs, default $OUT or ./spark-targets-<time>.
# --token-trace: a token trace from tools/trace/engram_trace.mjs (default: the bundle's
# trace.bin, else /var/tmp/debian-doc.trace), hashed into decode steps by engram-trace-replay.
# About 7 minutes on a 16-core host whose disk reads ~0.2 M O_DIRECT rows/s; --quick: tiny sizes,
# a check that everything runs (about 1.5 minutes on 2 cores). Exit status: 0 when every part ran
# (met or missed), 1 when one failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
bin_dir="$(cd "$1" 2>/dev/null && pwd)" || { echo "spark-targets: no folder '$1'" >&2; exit 2; }
shift
quick=0 out="" work=/var/tmp/engram-spark token_trace=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --out) out="$2"; shift ;;
    --work) work="$2"; shift ;;
    --token-trace) token_trace="$2"; shift ;;
    -h|--help) usage ;;
    *) echo "spark-targets: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

# A binary by name: directly in BIN_DIR (a bundle) or at its place in a meson build folder.
find_bin() {
  local name=$1 sub=$2
  for p in "$bin_dir/$name" "$bin_dir/$sub/$name"; do
    if [[ -x "$p" ]]; then echo "$p"; return 0; fi
  done
  echo "spark-targets: no $name in $bin_dir (nor $bin_dir/$sub)" >&2
  return 1
}
ranks_bin=$(find_bin engram-ranks bench/daemon) || exit 2
miss_bin=$(find_bin engram-miss-cpu bench/store) || exit 2
replay_bin=$(find_bin engram-trace-replay bench/store) || exit 2
engramd=$(find_bin engramd daemon) || exit 2
engramctl=$(find_bin engramctl tools/engramctl) || exit 2
synth=$(find_bin engram-synth tools/tables) || exit 2
restart_py="$here/store/restart_hit_rate.py"
[[ -f "$restart_py" ]] || { echo "spark-targets: no $restart_py" >&2; exit 2; }
if [[ -d "$bin_dir/../lib" ]]; then
  lib_dir="$(cd "$bin_dir/../lib" && pwd)"
  export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export ENGRAMD="$engramd" ENGRAMCTL="$engramctl"
if [[ -z "$token_trace" ]]; then
  for t in "$bin_dir/../trace.bin" /var/tmp/debian-doc.trace; do
    if [[ -f "$t" ]]; then token_trace=$t; break; fi
  done
fi
[[ -f "$token_trace" ]] || {
  echo "spark-targets: no token trace (--token-trace; make one with node tools/trace/engram_trace.mjs --out /var/tmp/debian-doc.trace)" >&2
  exit 2
}
out=${out:-${OUT:-$PWD/spark-targets-$(date -u +%Y%m%dT%H%M%S)}}
mkdir -p "$out" "$work" || exit 2

# Sizes. Host: 48 sequences a step (1,152 rows a layer, as a DeepSeek-V4.1 decode step of 48
# tokens), a step every 70 ms (a GB10 decode step), 600 trace steps folded into 2 M-row tables:
# the part cache's misses at 8 ranks stay under the disk's ~0.2 M reads/s, and a cold cache
# fills within the timeline.
if [[ $quick -eq 1 ]]; then
  table_rows=100000 sequences=1 trace_steps=200 period=50 steps=40 ranks=1,8
  timeline=20 window=2 warm_passes=1 read_samples=300
  miss_args=(--rows 20000 --batch 64 --batches 20 --rounds 2)
  restart_args=(--rows 20000 --cache-bytes 2M --step 128 --warm 10 --before 5 --after 15)
else
  table_rows=2000000 sequences=48 trace_steps=600 period=70 steps=100 ranks=1,8
  timeline=90 window=5 warm_passes=1 read_samples=2000
  miss_args=(--rows 100000 --batch 768 --batches 100 --rounds 4)
  restart_args=(--rows 200000 --cache-bytes 16M --warm 30 --before 20 --after 60)
fi

{
  echo "# spark-targets $(date -u +%FT%TZ) on $(hostname), $(nproc) CPUs, $(uname -r)"
  echo "bin: $bin_dir; work: $work; token trace: $token_trace; quick: $quick"
} | tee "$out/run.txt"
failed=0
run_part() {  # name, command...: runs it with its output in $out/name.txt
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$out/run.txt"
  local t0=$SECONDS
  "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s" | tee -a "$out/run.txt"
  if [[ $rc -ne 0 ]]; then failed=1; tail -n 20 "$out/$name.txt"; fi
}

run_part steps "$replay_bin" --trace "$token_trace" --mode decode --sequences "$sequences" \
  --table-rows "$table_rows" --max-steps "$trace_steps" --write-steps "$work/steps.txt"
run_part miss-cpu "$miss_bin" --dir "$work" "${miss_args[@]}"
run_part ranks "$ranks_bin" --dir "$work" --rows "$table_rows" --tier cache \
  --trace "$work/steps.txt" --ranks "$ranks" --period-ms "$period" --steps "$steps" \
  --warm-passes "$warm_passes" --read-samples "$read_samples" --steady \
  --timeline-s "$timeline" --window-s "$window" --engramd "$engramd" --engramctl "$engramctl"
run_part restart python3 "$restart_py" "$engramd" "$engramctl" "$synth" --dir "$work" \
  --restarts kept "${restart_args[@]}"

python3 - "$out" <<'PY' | tee "$out/summary.md"
"""One table from the raw outputs: target, what was measured, met or missed."""
import re
import sys

out = sys.argv[1]


def read(name):
    try:
        return open(f"{out}/{name}.txt", encoding="utf-8", errors="replace").read()
    except OSError:
        return ""


rows = []
m = re.search(r"ratio engramd / plain: ([0-9.]+)", read("miss-cpu"))
if m:
    v = float(m.group(1))
    rows.append(("(a) CPU per missed row vs a plain io_uring O_DIRECT loop", f"{v:.2f}x",
                 "<= 1.5x", "met" if v <= 1.5 else "missed"))
else:
    rows.append(("(a) CPU per missed row", "-", "<= 1.5x", "not measured"))
names = {"b": "(b) steady p99 / (all-hit p99 + one read p99)",
         "c": "(c) decode p99 beside a prefill / alone",
         "e": "(e) cold start: s until p99 within 2x of steady"}
found = set()
for line in read("ranks").splitlines():
    m = re.match(r"target \((\w)\) (.*?) \| measured ([0-9.]+) \| limit (.*?) \| (.*?) \| (.*)", line)
    if m:
        t, what, value, limit, verdict, detail = m.groups()
        found.add(t)
        if t == "e" and "not recovered" in detail:
            shown = f"not within the {float(value):.0f} s timeline"
        else:
            shown = f"{float(value):.3g}" + (" s" if t == "e" else "x")
        rows.append((f"{names[t]}, {what}", shown, f"<= {limit}", verdict))
for t in sorted(set(names) - found):
    rows.append((names[t], "-", "", "not measured"))
for line in read("ranks").splitlines():
    m = re.match(r"in place, N=(\d+) \| p50 ratio ([0-9.]+) \| p99 ratio ([0-9.]+) \| (.*)", line)
    if m:
        n, p50, p99, detail = m.groups()
        rows.append((f"client in place, all hits vs resident in place, N={n}",
                     f"p50 {float(p50):.2f}x, p99 {float(p99):.2f}x", "(reported)", "-"))
m = re.search(r"^\| kept \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|", read("restart"),
              re.M)
if m:
    before, _, after, ratio = (float(x) for x in m.groups())
    rows.append(("(d) hit rate in the first minute after a restart / before (kept cache)",
                 f"{ratio:.2f} ({after:.3f} / {before:.3f})", ">= 0.90",
                 "met" if ratio >= 0.9 else "missed"))
else:
    rows.append(("(d) hit rate after a restart / before", "-", ">= 0.90", "not measured"))
print("| target | measured | limit | verdict |")
print("|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
PY
echo "raw outputs: $out"
exit $failed
