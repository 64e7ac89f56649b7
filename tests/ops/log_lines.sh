#!/usr/bin/env bash
# engramd's log as an operator reads it. Outside journald (stderr a file): every line starts
# with an ISO-8601 UTC timestamp and the level's name. At log.level = debug: accepted
# connections, engramctl's sessions and each control command with its arguments, and the steps
# of a reload. An engramctl call that only reads logs one debug line and nothing at info; one
# that changes state (load) logs one info line. Under journald (JOURNAL_STREAM names stderr) the
# "<N>" priority prefix instead.
# Usage: log_lines.sh ENGRAMD ENGRAMCTL ENGRAM_SYNTH
set -uo pipefail
engramd=$1 engramctl=$2 synth=$3
work=$(mktemp -d /tmp/engram-log-XXXXXX)
pid=
cleanup() { [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/log"; exit 1; }
ctl() { timeout 30 "$engramctl" "$@" --socket "$work/engramd.sock"; }

"$synth" "$work/model" --rows 20000 --seed 3 -q || fail "engram-synth"
printf '[log]\nlevel = "debug"\n' >"$work/engramd.toml"
env -u JOURNAL_STREAM "$engramd" --config "$work/engramd.toml" --model "$work/model" \
  --socket "$work/engramd.sock" --tier 14=resident >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 200); do ctl status >/dev/null 2>&1 && break; sleep 0.05; done
ctl status >/dev/null || fail "engramd does not answer"
ctl load 14 -q >/dev/null || fail "engramctl load 14"

stamp='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z'
bad=$(grep -Ev "$stamp (error|warning|notice|info|debug): " "$work/log")
[[ -z $bad ]] || fail "lines without a timestamp and a level: $bad"
grep -q '<[0-9]>' "$work/log" && fail "a syslog priority prefix outside journald"
session="session [0-9]+ \(pid [0-9]+, uid [0-9]+, 'engramctl'\)"
grep -Eq "Z debug: accepted a connection on $work/engramd.sock from pid [0-9]+" "$work/log" ||
  fail "no debug line for an accepted connection"
grep -Eq "Z debug: $session connected" "$work/log" || fail "engramctl's session not at debug"
grep -Eq "Z debug: $session closed" "$work/log" || fail "engramctl's close not at debug"
grep -Eq "Z debug: $session: control command 'status' \{\}" "$work/log" ||
  fail "no debug line for the status call"
grep -Eq "Z info: $session: control command 'load' \{\"action\":\"start\",\"table\":14\}" \
  "$work/log" || fail "no info line for the load call"
grep -E "Z info: .*'engramctl'" "$work/log" | grep -v "control command 'load'" &&
  fail "an engramctl call logged at info besides load"

# The level back to info on SIGHUP, with the reload's steps at debug: then a status call logs
# nothing.
printf '[log]\nlevel = "info"\n' >"$work/engramd.toml"
kill -HUP "$pid"
for _ in $(seq 100); do grep -q "configuration re-read" "$work/log" && break; sleep 0.05; done
grep -q "Z debug: SIGHUP: re-reading the configuration" "$work/log" ||
  fail "no debug line for the reload's start"
grep -q "Z debug: SIGHUP: configuration read; applying the live settings" "$work/log" ||
  fail "no debug line for the reload's apply step"
before=$(wc -l <"$work/log")
ctl status >/dev/null || fail "engramctl status"
ctl stats >/dev/null || fail "engramctl stats"
sleep 0.3
after=$(tail -n +$((before + 1)) "$work/log")
[[ -z $after ]] || fail "read-only engramctl calls logged at info: $after"

kill -TERM "$pid"
wait "$pid" || fail "engramd exited with $? after SIGTERM"
pid=

# Under journald: systemd's JOURNAL_STREAM names stderr's device and inode.
printf '[limits]\nspeed = 9\n' >"$work/bad.toml"
: >"$work/journal"
journal_stream=$(stat -c '%d:%i' "$work/journal")
JOURNAL_STREAM=$journal_stream "$engramd" --config "$work/bad.toml" --check-config \
  2>"$work/journal" >/dev/null
head -c 3 "$work/journal" | grep -qx '<3>' || fail "no <3> prefix under journald: $(cat "$work/journal")"
# A JOURNAL_STREAM that names another stream (inherited, stderr since redirected): plain lines.
JOURNAL_STREAM=1:1 "$engramd" --config "$work/bad.toml" --check-config 2>"$work/plain" >/dev/null
grep -Eq "$stamp error: " "$work/plain" || fail "a foreign JOURNAL_STREAM: $(cat "$work/plain")"
echo "log lines: timestamps and levels outside journald, <N> under it, debug lines, one per call"
