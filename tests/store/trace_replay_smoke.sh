#!/usr/bin/env bash
# A brief run of engram-trace-replay (decode and prefill) on a small trace written here (Zipf-
# distributed compressed ids, the trace format of tools/trace), so that the benchmark cannot rot
# unnoticed. Usage: trace_replay_smoke.sh REPLAY ENGRAMD ENGRAMCTL
set -euo pipefail
replay=$1
export ENGRAMD=$2 ENGRAMCTL=$3
work=$(mktemp -d /tmp/engram-replay-smoke-XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work/zipf.trace" <<'PY'
import random, struct, sys
random.seed(5)
vocab, docs = 5000, [1500, 900, 2000]
weights = [1.0 / (i + 1) for i in range(vocab)]
with open(sys.argv[1], "wb") as f:
    f.write(b"ENGTRC01" + struct.pack("<IIIIQ", 1, len(docs), vocab, 2, sum(docs)))
    for n in docs:
        ids = random.choices(range(vocab), weights, k=n)
        f.write(struct.pack("<I", n) + struct.pack(f"<{n}I", *ids))
PY
for mode in decode prefill; do
  out=$("$replay" --trace "$work/zipf.trace" --dir "$work" --mode "$mode" --table-rows 20000 \
        --cache-mib 1 --max-steps 60 --chunk-tokens 1024)
  echo "$out"
  grep -q "simulated LRU" <<<"$out"
  grep -q "rows wrong 0" <<<"$out"
done
# Decode again with draft rows prefetched: both runs' rows are checked, the misses avoided shown.
out=$("$replay" --trace "$work/zipf.trace" --dir "$work" --mode decode --table-rows 20000 \
      --cache-mib 1 --max-steps 60 --prefetch-drafts 5 --draft-accept 0.7)
echo "$out"
grep -q "fraction of later misses avoided by prefetch" <<<"$out"
grep -q "rows wrong 0" <<<"$out"
# Decode again fetching each step's accepted rows, then its drafts' rows: every row checked, the
# fraction of fetch time hidden reported per step length.
out=$("$replay" --trace "$work/zipf.trace" --dir "$work" --mode decode --table-rows 20000 \
      --cache-mib 1 --max-steps 60 --hide-drafts 3 --step-ms 10 --step-ms 50)
echo "$out"
grep -q "two-phase fetch: accepted rows" <<<"$out"
[[ $(grep -cE '^ +(10|50)ms +[01]\.[0-9]{4} ' <<<"$out") -eq 2 ]]
grep -q "rows wrong 0" <<<"$out"
# Decode again with the row cache read in place: every row checked, and the hit rate within a
# point of the replay through engramd (the hits copied by the client still reach the policy).
out=$("$replay" --trace "$work/zipf.trace" --dir "$work" --mode decode --table-rows 20000 \
      --cache-mib 1 --max-steps 60 --in-place)
echo "$out"
grep -q "rows wrong 0" <<<"$out"
points=$(sed -n 's/.*hit rate \([-+][0-9.]*\) points against.*/\1/p' <<<"$out")
rows_in_place=$(sed -n 's/.*read in place: \([0-9]*\) rows copied.*/\1/p' <<<"$out")
[[ -n "$points" && "$rows_in_place" -gt 0 ]]
awk -v p="$points" 'BEGIN { exit (p < -1 || p > 1) }'
# The offline policies alone, the cache sized as a share of the tables' rows: no engramd, every
# policy with a hit rate, the share of the tables the cache holds in the header (the fewest bytes
# that hold it may hold up to 1/64 more), the filter's
# variants on request.
out=$("$replay" --trace "$work/zipf.trace" --mode prefill --table-rows 20000 --chunk-tokens 1024 \
      --cache-fraction 0.05 --sim-only --warmup-steps 2 --tinylfu-variants)
echo "$out"
grep -qE "cache of 20[0-9]{2} rows \(0\.05[0-9]{2} of the tables' rows" <<<"$out"
grep -qE '^  simulated S3-FIFO \+ TinyLFU at insert +0\.[0-9]{4} ' <<<"$out"
grep -qE '^  simulated S3-FIFO \+ TinyLFU at small exit +0\.[0-9]{4} ' <<<"$out"
grep -qE '^    small exit, sample 50x, ties in +0\.[0-9]{4} ' <<<"$out"
if grep -q engramd <<<"$out"; then exit 1; fi
# A file that is not a trace is refused, naming it.
echo "not a trace" >"$work/bad.trace"
if "$replay" --trace "$work/bad.trace" --dir "$work" 2>"$work/err"; then exit 1; fi
grep -q "bad.trace: not an Engram token trace" "$work/err"
# The hashed decode steps written as engram-ranks --trace text: one line a step, both layers.
out=$("$replay" --trace "$work/zipf.trace" --mode decode --table-rows 20000 --sequences 2 \
      --max-steps 30 --write-steps "$work/steps.txt")
echo "$out"
grep -q "wrote 30 steps" <<<"$out"
[[ $(grep -cE '^1:[0-9]+(,[0-9]+)* 14:[0-9]+(,[0-9]+)*$' "$work/steps.txt") -eq 30 ]]
