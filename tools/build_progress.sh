#!/usr/bin/env bash
# Shows a long build's progress while keeping all its output in a log: reads the build's output
# (meson compile, whose ninja prints one "[n/N] ..." line a step) on stdin, appends every line
# to LOG, and prints ninja's counter with the elapsed time and a rough estimate of what is left:
# on a terminal as one line rewritten in place, otherwise a line every INTERVAL seconds.
# Usage: meson compile -C build 2>&1 | tools/build_progress.sh LOG [INTERVAL]
set -uo pipefail
log=$1
interval=${2:-30}
start=$SECONDS
last_print=$((start - interval))
shown=0
tty=0
[[ -t 1 ]] && tty=1
exec 3>>"$log"

minutes() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

while IFS= read -r line; do
  printf '%s\n' "$line" >&3
  [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] || continue
  step=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
  elapsed=$((SECONDS - start))
  # The steps are far from equal (a link or a heavy file takes minutes), so the estimate is
  # only given once a tenth of them has run.
  left=""
  if ((step * 10 >= total && step < total)); then
    left=", about $(minutes $((elapsed * (total - step) / step))) left"
  fi
  text="build: step $step of $total ($((step * 100 / total))%), $(minutes "$elapsed") elapsed$left"
  if ((tty)); then
    printf '\r\033[K%s' "$text"
    shown=1
  elif ((SECONDS - last_print >= interval || step == total)); then
    printf '%s\n' "$text"
    last_print=$SECONDS
  fi
done
((shown)) && printf '\n'
exit 0
