#!/usr/bin/env bash
# The Debian packages end to end: builds the amd64 (host) packages with tools/build-debs.sh
# (lintian errors fail it; no -dbgsym packages), installs them with apt, verifies the installed
# units with systemd-analyze, runs `engramd --check-config`, builds a C program against the
# installed headers with `pkg-config --cflags --libs engram` and gathers rows with it from an
# engramd started from the installed binary (checked against `engramctl rows`), imports the
# installed Python package, then purges the packages and checks that nothing is left.
# Usage: deb_install.sh SOURCE_ROOT
# Skips (77) when not root, without dpkg-buildpackage or apt-get, or where engramd packages are
# already installed (purging them would remove someone's installation).
set -uo pipefail
root=$1
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "installing packages needs root"
command -v dpkg-buildpackage >/dev/null || skip "dpkg-buildpackage is missing (tools/setup.sh installs it)"
command -v apt-get >/dev/null || skip "apt-get is missing"
packages=(engramd libengram-client0 libengram-dev python3-engram)
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    skip "$p is installed on this machine; the test would purge it"
  fi
done

work=$(mktemp -d /tmp/engramd-deb-test-XXXXXX)
pid=
installed=0
# The package's sysctl drop-in is applied at install; the machine gets its own value back.
overcommit=/proc/sys/vm/nr_overcommit_hugepages
overcommit_before=$(cat "$overcommit")
cleanup() {
  [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null
  ((installed)) && DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${packages[@]}" >/dev/null 2>&1
  [[ -w $overcommit ]] && echo "$overcommit_before" >"$overcommit" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "== $*"; }

step "building the packages"
# As a release would, less the -dbgsym packages, which nothing here installs (without them
# debian/rules compiles without -g), and without optimisation (noopt: Debian's option for it,
# which also leaves out _FORTIFY_SOURCE): what this test checks (the files, units, users,
# linking through pkg-config, a gather byte for byte, the Python package, the purge) does not
# depend on the optimiser, the native run tests the optimised code, and this test took 493
# CPU seconds so against 782 at -O2. The build runs no tests (nocheck: the native run has) and
# uses every core (tools/build-debs.sh).
DEB_BUILD_OPTIONS="noautodbgsym noopt" bash "$root/tools/build-debs.sh" --out "$work/debs" ||
  fail "tools/build-debs.sh failed"
ls "$work/debs"

step "installing them with apt"
installed=1
debs=()
for p in "${packages[@]}"; do
  debs+=("$(ls "$work"/debs/"$p"_*.deb)") || fail "no $p package was built"
done
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}" \
  >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt-get install failed"; }
for f in /usr/sbin/engramd /usr/bin/engramctl /lib/systemd/system/engramd.service \
  /lib/systemd/system/engramd.socket /usr/lib/sysusers.d/engramd.conf \
  /usr/lib/tmpfiles.d/engramd.conf /usr/lib/sysctl.d/60-engramd.conf /etc/engramd/engramd.toml \
  /usr/include/engram/engram.h; do
  [[ -e $f ]] || fail "$f was not installed"
done
getent passwd engram >/dev/null || fail "the engram user was not created (sysusers)"
want=$(sed -n 's/^vm.nr_overcommit_hugepages = //p' /usr/lib/sysctl.d/60-engramd.conf)
[[ -n $want ]] || fail "60-engramd.conf sets no vm.nr_overcommit_hugepages"
# Where this machine lets root write vm settings, the postinst must have applied it.
if echo "$overcommit_before" >"$overcommit" 2>/dev/null; then
  DEBIAN_FRONTEND=noninteractive dpkg-reconfigure engramd >/dev/null 2>&1 ||
    fail "dpkg-reconfigure engramd failed"
  [[ $(cat "$overcommit") == "$want" ]] ||
    fail "vm.nr_overcommit_hugepages is $(cat "$overcommit") after the postinst, not $want"
fi

step "the installed programs report the packaged release"
release=$(dpkg-query -W -f '${Version}' engramd)
release=${release%%-*}  # a Debian revision, if the package ever gets one
engramctl --version | grep -qx "engramctl $release (libengram_client $release)" ||
  fail "engramctl --version says '$(engramctl --version)', not release $release"
/usr/sbin/engramd --version | grep -q "^engramd $release " ||
  fail "engramd --version says '$(/usr/sbin/engramd --version)', not release $release"

step "systemd-analyze verify on the installed units"
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify /lib/systemd/system/engramd.service /lib/systemd/system/engramd.socket \
    >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "systemd-analyze verify failed"; }
  grep -i "engramd" "$work/verify.log" && fail "systemd-analyze verify complained about the units"
else
  echo "systemd-analyze is not installed: unit verification not run"
fi

step "engramd --check-config on a synthetic checkpoint"
engram-synth "$work/model" --rows 20000 --seed 11 >/dev/null || fail "engram-synth failed"
cat >"$work/engramd.toml" <<TOML
[tables]
models = ["$work/model"]
[socket]
path = "$work/engramd.sock"
TOML
engramd --config "$work/engramd.toml" --check-config || fail "engramd --check-config failed"

step "a C program built with pkg-config gathers from the installed engramd"
cat >"$work/gather.c" <<'C'
#include <engram/engram.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  struct engram_connect_options o;
  engram_connect_options_init(&o, sizeof o);
  o.socket_path = argv[1];
  engram_session* s;
  if (engram_session_open(&o, &s) < 0) { fprintf(stderr, "%s\n", engram_last_error()); return 1; }
  const uint64_t n = argc - 2;
  uint64_t* rows;
  uint8_t* out;
  if (engram_alloc(s, n * sizeof(uint64_t), (void**)&rows) < 0 ||
      engram_alloc(s, n * ENGRAM_ROW_BYTES, (void**)&out) < 0) {
    fprintf(stderr, "%s\n", engram_last_error());
    return 1;
  }
  for (uint64_t i = 0; i < n; ++i) rows[i] = strtoull(argv[i + 2], NULL, 10);
  struct engram_gather_request req = {.size = sizeof req, .layer = 14, .rows = rows,
                                      .num_rows = n, .dest = out};
  if (engram_gather(s, &req, 10000000000) < 0) { fprintf(stderr, "%s\n", engram_last_error()); return 1; }
  fwrite(out, ENGRAM_ROW_BYTES, n, stdout);
  engram_session_close(s);
  return 0;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$work/gather" "$work/gather.c" $(pkg-config --cflags --libs engram) ||
  fail "building against the installed headers and engram.pc failed"
ldd "$work/gather" | grep -Eq "libengram_client.so.0 => (/usr)?/lib/" ||
  fail "the program does not load the installed libengram_client.so.0"
/usr/sbin/engramd --config "$work/engramd.toml" --log-level warning &
pid=$!
# The socket answers "starting" (exit 3) until the tables are open: wait until it serves.
for _ in $(seq 200); do engramctl --socket "$work/engramd.sock" status >/dev/null 2>&1 && break; sleep 0.05; done
engramctl --socket "$work/engramd.sock" status >/dev/null || fail "the installed engramd did not start"
rows=(0 1 17 4095 19999)
"$work/gather" "$work/engramd.sock" "${rows[@]}" >"$work/rows.c.bin" || fail "the C program failed"
engramctl rows 14 "${rows[@]}" --socket "$work/engramd.sock" --out "$work/rows.ctl.bin" \
  >/dev/null || fail "engramctl rows failed"
[[ $(stat -c %s "$work/rows.c.bin") == $((264 * ${#rows[@]})) ]] || fail "wrong number of bytes"
cmp "$work/rows.c.bin" "$work/rows.ctl.bin" || fail "the C program's rows differ from engramctl's"
engramctl --socket "$work/engramd.sock" status >/dev/null || fail "engramctl status failed"
kill -TERM "$pid"
wait "$pid" || fail "engramd did not exit 0 on SIGTERM"
pid=

step "the installed Python package imports"
# Debian's interpreter: the one the package installs for (PATH may lead to another).
(cd / && /usr/bin/python3 -c 'import engram; print(engram.__file__)') |
  grep -q "^/usr/lib/python3/" || fail "/usr/bin/python3 does not import engram from the package"

step "purging the packages"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${packages[@]}" >"$work/purge.log" 2>&1 ||
  { cat "$work/purge.log"; fail "apt-get purge failed"; }
installed=0
for f in /usr/sbin/engramd /usr/bin/engramctl /lib/systemd/system/engramd.service \
  /etc/engramd /usr/include/engram /usr/lib/python3/dist-packages/engram; do
  [[ -e $f ]] && fail "$f is still there after purge"
done
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "installed" && fail "$p is still installed"
done
echo "OK: built, installed, verified, gathered and purged"
