#!/usr/bin/env bash
# engramd as engramd.service runs it (an unprivileged user, the unit's capability bounding and
# ambient sets) on table files another user owns: it must hold a read lease on every table file,
# so that a writer merely opening one is noticed before its open(2) returns. Without CAP_LEASE
# (empty sets) the lease is refused, which engramd must say, and it serves on (inotify and
# re-stat only). Needs root and setpriv; skips (77) otherwise.
# Usage: lease_capability.sh ENGRAMD_SERVICE ENGRAMD ENGRAM_SYNTH
set -uo pipefail
unit=$1 engramd=$2 synth=$3
user=65534
[[ $(id -u) == 0 ]] || { echo "SKIP: running engramd as another user needs root"; exit 77; }
command -v setpriv >/dev/null || { echo "SKIP: setpriv (util-linux) is not installed"; exit 77; }
[[ $(cat /proc/sys/fs/leases-enable 2>/dev/null) == 1 ]] ||
  { echo "SKIP: file leases are disabled (fs.leases-enable)"; exit 77; }
work=$(mktemp -d /tmp/engram-lease-XXXXXX)
pid=
cleanup() { [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for l in "$work"/*.log; do echo "--- $l"; cat "$l"; done; exit 1; }

# The unit's capability list ("CAP_LEASE CAP_X") as setpriv's ",+lease,+x".
caps_of() {
  local out= c
  for c in $(sed -n "s/^$1=//p" "$unit"); do c=${c#CAP_}; out+=",+${c,,}"; done
  echo "$out"
}
bounding=$(caps_of CapabilityBoundingSet)
ambient=$(caps_of AmbientCapabilities)
grep -q "^User=engram$" "$unit" || fail "the unit no longer runs engramd as the user engram"

chmod 755 "$work"
"$synth" "$work/model" --rows 4000 --seed 5 -q || fail "engram-synth"
mkdir "$work/run" && chown "$user:$user" "$work/run"

# Starts engramd as $user with capability bounding set $1 and ambient set $2 (setpriv lists),
# logging to $work/$3.log; waits for its socket.
start() {
  local sock=$work/run/$3.sock
  local args=(--reuid="$user" --regid="$user" --clear-groups --bounding-set="-all$1"
              --inh-caps="-all$2")
  [[ -n $2 ]] && args+=(--ambient-caps="${2#,}")
  setpriv "${args[@]}" "$engramd" --model "$work/model" --socket "$sock" --log-level info \
    2>"$work/$3.log" &
  pid=$!
  # The socket answers "starting" before the tables are watched: wait until it serves.
  for _ in $(seq 600); do grep -q "engramd serving " "$work/$3.log" && return 0; sleep 0.05; done
  fail "engramd ($3) did not start"
}
stop() {
  kill -TERM "$pid"
  local status=0
  wait "$pid" || status=$?
  pid=
  [[ $status == 0 ]] || fail "engramd ($1) exited with $status after SIGTERM"
}
leases_of() { awk -v p="$1" '$2 == "LEASE" && $4 == "READ" && $5 == p' /proc/locks | wc -l; }

# As the unit runs it.
start "$bounding" "$ambient" unit
held=$(leases_of "$pid")
[[ $held == 2 ]] || fail "engramd as the unit runs it holds $held read leases, not 2 (one per table file); unit sets: bounding '$bounding', ambient '$ambient'"
grep -q "no read lease" "$work/unit.log" && fail "engramd as the unit runs it reports no lease"
# Opening a table file for writing, without writing: only the lease can see this.
for f in "$work"/model/*.safetensors; do timeout 30 bash -c ': >>"$1"' _ "$f" || fail "open $f"; done
for _ in $(seq 100); do
  (($(grep -c "was opened for writing or truncated" "$work/unit.log") == 2)) && break
  sleep 0.05
done
(($(grep -c "was opened for writing or truncated" "$work/unit.log") == 2)) ||
  fail "opening both served files for writing was not noticed through the leases"
stop unit

# Without capabilities (the unit's sets empty): refused, said once, still serving.
start "" "" nocap
held=$(leases_of "$pid")
[[ $held == 0 ]] || fail "engramd without CAP_LEASE holds $held leases on files it does not own"
grep -q "no read lease on 2 of 2 table file(s).*Permission denied.*CAP_LEASE" "$work/nocap.log" ||
  fail "engramd without CAP_LEASE does not say that it has no lease"
grep -q "engramd serving 2 table(s)" "$work/nocap.log" || fail "engramd without CAP_LEASE is not serving"
stop nocap
echo "as the unit runs it: 2 read leases, an open for writing noticed; without CAP_LEASE: refused, said, serving"
