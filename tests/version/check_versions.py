#!/usr/bin/env python3
"""Every place that states engramd's release agrees with meson.build's project version:
engram_version() of the built libengram_client (and ENGRAM_VERSION of the generated header it
returns), `engramctl --version`, `engramd --version`, the Python package's __version__ and
`python -m engram --version`, the first entry of debian/changelog, and pyproject.toml (whose
version is meson's when it is dynamic, else must match).

usage: check_versions.py --meson-version V --source DIR --client-lib LIB --engramctl EXE
                         --engramd EXE
"""

import argparse
import ctypes
import os
import pathlib
import re
import subprocess
import sys
import tomllib


def program_version(exe, name):
    """The release a program's --version prints as "<name> <release> ..."; exit status 0."""
    run = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        return f"exit status {run.returncode}: {run.stderr.strip()}"
    match = re.match(rf"{re.escape(name)} (\S+)", run.stdout)
    return match.group(1) if match else f"unexpected output {run.stdout!r}"


def python_versions(source, client_lib):
    env = dict(os.environ, PYTHONPATH=str(source / "python"), PYTHONDONTWRITEBYTECODE="1",
               ENGRAM_LIB_DIR=str(pathlib.Path(client_lib).parent))
    attr = subprocess.run([sys.executable, "-c", "import engram; print(engram.__version__)"],
                          capture_output=True, text=True, timeout=60, env=env)
    module = subprocess.run([sys.executable, "-m", "engram", "--version"], capture_output=True,
                            text=True, timeout=60, env=env)
    found = {"engram.__version__": attr.stdout.strip() if attr.returncode == 0 else
             f"import failed: {attr.stderr.strip()[-400:]}"}
    match = re.fullmatch(r"engram (\S+)\n", module.stdout)
    found["python -m engram --version"] = (
        match.group(1) if module.returncode == 0 and match else
        f"exit status {module.returncode}: {module.stdout!r} {module.stderr.strip()[-400:]}")
    return found


def debian_version(source):
    """The upstream part of the first debian/changelog entry's version ([epoch:]V[-revision])."""
    first = (source / "debian" / "changelog").read_text().splitlines()[0]
    match = re.match(r"engramd \((?:\d+:)?([^)\s]+?)(?:-[^-)]+)?\)", first)
    return match.group(1) if match else f"unparsable first line {first!r}"


def pyproject_version(source, meson_version):
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    if "version" in project.get("dynamic", []):
        if "version" in project:
            return "both dynamic and static"
        return meson_version  # meson-python takes meson's project version
    return project.get("version", "none")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option in ("--meson-version", "--source", "--client-lib", "--engramctl", "--engramd"):
        parser.add_argument(option, required=True)
    args = parser.parse_args()
    source = pathlib.Path(args.source)
    lib = ctypes.CDLL(args.client_lib)
    lib.engram_version.restype = ctypes.c_char_p
    found = {
        f"engram_version() of {args.client_lib}": lib.engram_version().decode(),
        "engramctl --version": program_version(args.engramctl, "engramctl"),
        "engramd --version": program_version(args.engramd, "engramd"),
        **python_versions(source, args.client_lib),
        "debian/changelog, first entry": debian_version(source),
        "pyproject.toml": pyproject_version(source, args.meson_version),
    }
    wrong = 0
    for where, version in found.items():
        ok = version == args.meson_version
        wrong += not ok
        print(f"{'ok' if ok else 'MISMATCH'}: {where}: {version}")
    if wrong:
        print(f"{wrong} place(s) disagree with meson.build's project version "
              f"{args.meson_version}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
