#!/usr/bin/env bash
# tools/quickstart.sh's build step on a fresh machine: it says what it is doing, for about how
# long and where the log is, shows ninja's step counter while building, keeps every line of the
# build's output in the log, and on a failed build says so and exits non-zero. The real script
# runs in a copy of tools/ with setup.sh (package installation) replaced, and a meson on PATH
# that plays a long build of 200 steps whose last one fails.
# Usage: quickstart_build.sh SOURCE_ROOT
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$work/repo/tools" "$work/bin"
cp "$src/tools/quickstart.sh" "$src/tools/build_progress.sh" "$work/repo/tools/"
echo 'exit 0' >"$work/repo/tools/setup.sh"
cat >"$work/bin/meson" <<'FAKE'
#!/usr/bin/env bash
case $1 in
  setup) mkdir -p "$2"; touch "$2/build.ninja"; echo "The Meson build system" ;;
  compile)
    for i in $(seq 200); do
      echo "[$i/200] Compiling C++ object step$i.o"
      ((i % 50 == 0)) && sleep 1.5
    done
    echo "compiler diagnostic: the last line of the build"
    exit 1 ;;
esac
FAKE
chmod +x "$work/bin/meson"

status=0
(cd "$work/repo" && PATH="$work/bin:$PATH" ENGRAM_BUILD_DIR="$work/b" ENGRAM_QUICKSTART_PROGRESS_INTERVAL=1 bash tools/quickstart.sh) \
  >"$work/out" 2>&1 || status=$?
cat "$work/out"
log=$work/b/quickstart-build.log
[[ $status -ne 0 ]] || fail "a failed build did not stop the quickstart"
grep -q "about 15 minutes" "$work/out" || fail "no word on how long the build takes"
grep -qF "$log" "$work/out" || fail "the output does not name the build log $log"
[[ -f $log ]] || fail "no build log at $log"
for i in 1 137 200; do
  grep -qxF "[$i/200] Compiling C++ object step$i.o" "$log" || fail "line $i is not in the log"
done
grep -q "The Meson build system" "$log" || fail "meson setup's output is not in the log"
grep -q "compiler diagnostic" "$log" || fail "the build's last line is not in the log"
grep -q "build: step 1 of 200 (0%)" "$work/out" || fail "no progress line at the start"
grep -q "build: step 200 of 200 (100%)" "$work/out" || fail "no progress line at the end"
[[ $(grep -c "build: step" "$work/out") -lt 100 ]] || fail "progress is printed for every step"
grep -q "the build failed" "$work/out" || fail "the failure is not reported"
grep -q "compiler diagnostic" "$work/out" || fail "the failure does not show the log's end"
[[ $(grep -c "Compiling C++ object" "$work/out") -le 25 ]] || fail "the build output is printed"
grep -q "build: step 1[0-9][0-9] of 200 (.*%), 0:[0-9][0-9] elapsed, about 0:[0-9][0-9] left" \
  "$work/out" || fail "no progress line with an estimate in the middle of the build"
echo "ok"
