#!/bin/bash
# The row cache kept across `systemctl restart` by systemd itself: engramd runs as a transient
# service (systemd-run, Type=notify, FileDescriptorStoreMax=4), gathers fill its cache, the
# service is restarted, and the new engramd must log that it adopted the region and serve the
# same rows from it. Needs systemd as the service manager (root's system instance) and skips,
# saying why, where there is none (containers, the development VM).
# Usage: cache_handoff_systemd.sh ENGRAMD ENGRAMCTL ENGRAM_SYNTH
set -uo pipefail
engramd=$1 engramctl=$2 synth=$3
[[ "$(ps -p 1 -o comm= 2>/dev/null)" == systemd ]] || { echo "SKIP: systemd is not PID 1"; exit 77; }
[[ $(id -u) -eq 0 ]] || { echo "SKIP: needs root for a system service"; exit 77; }
command -v systemd-run >/dev/null || { echo "SKIP: systemd-run not installed"; exit 77; }
work=$(mktemp -d /tmp/engram-fdstore-XXXXXX)
unit=engram-fdstore-test-$$
cleanup() { systemctl stop "$unit" 2>/dev/null; systemctl reset-failed "$unit" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; journalctl -u "$unit" --no-pager | tail -40; exit 1; }

"$synth" "$work/model" --rows 20000 --seed 4 -q || fail "engram-synth"
systemd-run --unit "$unit" -p Type=notify -p NotifyAccess=main -p FileDescriptorStoreMax=4 \
  -p Restart=no "$engramd" --model "$work/model" --socket "$work/engramd.sock" \
  --tier 14=cache --cache-bytes 64M --log-level info || fail "systemd-run"
for _ in $(seq 200); do [[ -S "$work/engramd.sock" ]] && break; sleep 0.05; done
ids=$(seq 0 7 7000)
"$engramctl" rows 14 $ids --out "$work/before" --socket "$work/engramd.sock" || fail "rows before"
systemctl restart "$unit" || fail "systemctl restart"
for _ in $(seq 200); do
  "$engramctl" status --socket "$work/engramd.sock" >/dev/null 2>&1 && break; sleep 0.05
done
journalctl -u "$unit" --no-pager | grep -q "row cache: adopted the region handed over" ||
  fail "the restarted engramd did not adopt the row cache from systemd's fd store"
"$engramctl" rows 14 $ids --out "$work/after" --socket "$work/engramd.sock" || fail "rows after"
cmp -s "$work/before" "$work/after" || fail "rows differ after the restart"
misses=$("$engramctl" status --json --socket "$work/engramd.sock" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["store"]["cache"]["misses"])')
[[ "$misses" == 0 ]] || fail "$misses misses right after the restart: the cache was not kept"
echo "systemctl restart: the row cache was kept through systemd's fd store, every row a hit"
