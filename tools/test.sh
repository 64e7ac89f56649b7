#!/usr/bin/env bash
# Builds engramd and runs every test (Catch2, pytest, fuzz smoke runs, unit-file checks).
# Usage: tools/test.sh [meson test args...]   e.g. tools/test.sh --suite table
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
builddir=${ENGRAM_BUILD_DIR:-build}
if [[ ! -f "$builddir/build.ninja" ]]; then
  meson setup "$builddir"
fi
meson compile -C "$builddir"
meson test -C "$builddir" --print-errorlogs --num-processes "$(nproc)" "$@"
