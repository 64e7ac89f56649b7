#!/bin/bash
# Verifies engramd's systemd units with systemd-analyze verify: the service (with ExecStart
# pointed at the built engramd, which verify wants to exist) and the socket, together. A unit
# with a misspelt key must be reported, so that a silent verifier cannot pass this test.
set -u
service=$1 socket=$2 engramd=$3
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze is not installed"; exit 77; }
dir=$(mktemp -d /tmp/engramd-units-XXXXXX)
trap 'rm -rf "$dir"' EXIT
sed -E "s|^ExecStart=[^ ]+/engramd |ExecStart=$engramd |" "$service" > "$dir/engramd.service"
cp "$socket" "$dir/engramd.socket"
grep -q "^ExecStart=$engramd " "$dir/engramd.service" || { echo "ExecStart not substituted"; exit 1; }
fail=0
for want in 'Type=notify' 'LimitMEMLOCK=infinity' 'WatchdogSec=' 'User=engram' 'ExecReload=' 'FileDescriptorStoreMax='; do
  grep -q "^$want" "$dir/engramd.service" || { echo "engramd.service lacks $want"; fail=1; }
done
for want in 'ListenSequentialPacket=/run/engramd/engramd.sock' 'SocketGroup=engram' 'SocketMode=0660'; do
  grep -q "^$want" "$dir/engramd.socket" || { echo "engramd.socket lacks $want"; fail=1; }
done
cd "$dir"
out=$(systemd-analyze verify ./engramd.socket ./engramd.service 2>&1); rc=$?
echo "systemd-analyze verify: rc=$rc"
[ -n "$out" ] && echo "$out"
if [ $rc -ne 0 ] || echo "$out" | grep -q 'engramd\.\(service\|socket\)'; then fail=1; fi
# The verifier itself must catch a broken unit.
sed 's/^Type=notify/Type=notify\nTypo=yes/' engramd.service > broken.service
bad=$(systemd-analyze verify ./broken.service 2>&1)
if ! echo "$bad" | grep -q 'Typo'; then
  echo "systemd-analyze verify did not report an unknown key; cannot trust it: $bad"
  fail=1
fi
exit $fail
