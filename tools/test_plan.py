#!/usr/bin/env python3
"""The tests of some meson suites and the build targets they need, from meson's introspection.

A run that tests only part of the tree (the arm64 run of tools/test.sh, the sanitizer runs of
tools/sanitize.sh) builds only these targets: the test executables and the programs, libraries
and helpers those tests declare in `depends`, as `meson test` itself would rebuild them.

Usage:
  test_plan.py BUILD_DIR [--in-process] SUITE...

Prints one line per test ("test NAME") and per target ("target PATH", relative to BUILD_DIR, as
ninja names it). --in-process keeps only the tests that run C/C++ code in their own process:
it leaves out the Python ones (they would load a sanitizer runtime late, through ctypes) and the
libFuzzer runs (they build with clang on their own).
"""

import json
import os
import subprocess
import sys


def introspect(build_dir, what):
    out = subprocess.run(["meson", "introspect", build_dir, what], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def plan(build_dir, suites, in_process):
    """Returns (test names, target paths) of the tests in any of `suites`."""
    wanted = {"engramd:" + s for s in suites}
    files = {t["id"]: t["filename"] for t in introspect(build_dir, "--targets")}
    tests, targets = [], set()
    for test in introspect(build_dir, "--tests"):
        if not wanted & set(test["suite"]):
            continue
        program = os.path.basename(test["cmd"][0])
        if in_process and (program.startswith("python") or program == "run_fuzz.sh"):
            continue
        tests.append(test["name"])
        for dep in test["depends"]:
            targets.update(os.path.relpath(f, build_dir) for f in files.get(dep, []))
    return tests, sorted(targets)


def main(argv):
    args = argv[1:]
    in_process = "--in-process" in args
    args = [a for a in args if a != "--in-process"]
    if len(args) < 2:
        print(__doc__.strip().split("\n\n")[2], file=sys.stderr)
        return 2
    tests, targets = plan(args[0], args[1:], in_process)
    for name in tests:
        print("test", name)
    for path in targets:
        print("target", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
