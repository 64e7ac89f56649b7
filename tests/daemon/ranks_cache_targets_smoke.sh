#!/usr/bin/env bash
# A brief run of engram-ranks --steady --timeline-s (the cache tier's targets) on a small trace
# written here, so that the mode and the lines bench/spark-targets.sh reads cannot rot unnoticed.
# Usage: ranks_cache_targets_smoke.sh ENGRAM_RANKS ENGRAMD ENGRAMCTL
set -euo pipefail
ranks=$1
export ENGRAMD=$2 ENGRAMCTL=$3
work=$(mktemp -d /var/tmp/engram-ranks-targets-XXXXXX)
trap 'rm -rf "$work"' EXIT
# 60 steps of 16 rows a layer: a hot set of 200 rows and a long tail, as a trace has.
/usr/bin/python3 - "$work/steps.txt" <<'PY'
import random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for _ in range(60):
        groups = []
        for layer in (1, 14):
            ids = [random.randrange(200) if random.random() < 0.6 else random.randrange(20000)
                   for _ in range(16)]
            groups.append(f"{layer}:" + ",".join(map(str, ids)))
        f.write(" ".join(groups) + "\n")
PY
out=$("$ranks" --dir "$work" --rows 20000 --tier cache --trace "$work/steps.txt" --ranks 1,2 \
      --period-ms 5 --steps 20 --read-samples 50 --steady --timeline-s 2 --window-s 0.5)
echo "$out"
for t in b c e; do
  grep -qE "^target \($t\) .* \| measured [0-9.]+ \| limit .* \| (met|missed) \| " <<<"$out"
done
[[ $(grep -c '^target (b) ' <<<"$out") -eq 2 ]]
[[ $(grep -cE '^in place, N=[12] \| p50 ratio [0-9.]+ \| p99 ratio [0-9.]+ \|' <<<"$out") -eq 2 ]]
grep -q "the row cache holds 0 rows of" <<<"$out"
grep -q "every case ran" <<<"$out"
# The mode measures the cache tier on a trace: anything else is refused with the reason.
if "$ranks" --steady --tier storage --trace "$work/steps.txt" 2>"$work/err"; then exit 1; fi
grep -q "add --tier cache and --trace FILE" "$work/err"
