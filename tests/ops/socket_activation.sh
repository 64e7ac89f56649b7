#!/usr/bin/env bash
# engramd started by socket activation: systemd-socket-activate holds the listening
# SOCK_SEQPACKET socket, starts engramd on the first connection and passes the socket
# (LISTEN_FDS); engramctl's connection queued before the start must be served, then SIGTERM
# must stop the daemon cleanly.
# Usage: socket_activation.sh ENGRAMD ENGRAMCTL ENGRAM_SYNTH
set -uo pipefail
engramd=$1 engramctl=$2 synth=$3
activate=$(command -v systemd-socket-activate) || { echo "SKIP: systemd-socket-activate is not installed"; exit 77; }
work=$(mktemp -d /tmp/engram-sockact-XXXXXX)
pid=
cleanup() { [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/log"; exit 1; }

"$synth" "$work/model" --rows 20000 --seed 3 -q || fail "engram-synth"
"$activate" --seqpacket -l "$work/engramd.sock" "$engramd" --model "$work/model" \
  --log-level info >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S "$work/engramd.sock" ]] && break; sleep 0.05; done
[[ -S "$work/engramd.sock" ]] || fail "no listening socket"
grep -q "Execing" "$work/log" && fail "engramd started before any connection"

out=$(timeout 30 "$engramctl" status --json --socket "$work/engramd.sock") || fail "engramctl status: $out"
grep -q '"schema_version"' <<<"$out" || fail "status reply: $out"
grep -q "using the socket passed by systemd" "$work/log" || fail "engramd did not use the passed socket"
rows=$(timeout 30 "$engramctl" rows 14 5 7 --socket "$work/engramd.sock") || fail "engramctl rows: $rows"
grep -q "layer 14 row 7" <<<"$rows" || fail "rows reply: $rows"

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=
[[ $status -eq 0 ]] || fail "engramd exited with $status after SIGTERM"
grep -q "engramd stopped" "$work/log" || fail "no clean stop"
echo "socket activation: served status and rows through the passed socket, stopped cleanly"
