#!/usr/bin/env python3
"""Every place that states engramd's release agrees with meson.build's project version:
engram_version() of the built libengram_client, ENGRAM_VERSION and its parts in the generated
engram/version.h, `--version` of engramd, engramctl and the table tools, the Python package's
__version__ and `python -m engram --version` both from the source tree and as `meson install`
installs the package (with its generated engram/_version.py), the first entry of
debian/changelog, and pyproject.toml (whose version is meson's when it is dynamic, else must
match).

usage: check_versions.py --meson-version V --source DIR --build DIR --client-lib LIB
                         --engramctl EXE --engramd EXE --tool NAME=EXE...
"""

import argparse
import ctypes
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib


def program_version(exe, name):
    """The release a program's --version prints as "<name> <release> ..."; exit status 0."""
    run = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        return f"exit status {run.returncode}: {run.stderr.strip()}"
    match = re.match(rf"{re.escape(name)} (\S+)", run.stdout)
    return match.group(1) if match else f"unexpected output {run.stdout!r}"


def header_version(build):
    """ENGRAM_VERSION of the generated engram/version.h, if its MAJOR/MINOR/PATCH agree."""
    text = (build / "include" / "engram" / "version.h").read_text()
    string = re.search(r'#define ENGRAM_VERSION "([^"]*)"', text)
    parts = [re.search(rf"#define ENGRAM_VERSION_{part} (\d+)", text)
             for part in ("MAJOR", "MINOR", "PATCH")]
    if string is None or None in parts:
        return "ENGRAM_VERSION or one of its parts is missing"
    joined = ".".join(part.group(1) for part in parts)
    return string.group(1) if joined == string.group(1) else f"{string.group(1)} but parts {joined}"


def python_versions(package_dir, client_lib, label):
    """engram.__version__ and `python -m engram --version` of the package in package_dir."""
    env = dict(os.environ, PYTHONPATH=str(package_dir), PYTHONDONTWRITEBYTECODE="1",
               ENGRAM_LIB_DIR=str(pathlib.Path(client_lib).parent))
    attr = subprocess.run([sys.executable, "-c", "import engram; print(engram.__version__)"],
                          capture_output=True, text=True, timeout=60, env=env)
    module = subprocess.run([sys.executable, "-m", "engram", "--version"], capture_output=True,
                            text=True, timeout=60, env=env)
    found = {f"engram.__version__ ({label})": attr.stdout.strip() if attr.returncode == 0 else
             f"import failed: {attr.stderr.strip()[-400:]}"}
    match = re.fullmatch(r"engram (\S+)\n", module.stdout)
    found[f"python -m engram --version ({label})"] = (
        match.group(1) if module.returncode == 0 and match else
        f"exit status {module.returncode}: {module.stdout!r} {module.stderr.strip()[-400:]}")
    return found


def installed_python_versions(build, client_lib):
    """The package as `meson install` puts it into site-packages (python-runtime files only,
    into a scratch folder): its __version__ must come from the generated engram/_version.py."""
    meson = shutil.which("meson")
    if meson is None:
        return {"installed engram package": "meson not found on PATH to install it"}
    with tempfile.TemporaryDirectory() as dest:
        run = subprocess.run([meson, "install", "-C", str(build), "--no-rebuild", "--quiet",
                              "--tags", "python-runtime", "--destdir", dest],
                             capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            return {"installed engram package": f"meson install failed: {run.stderr[-400:]}"}
        versions = sorted(pathlib.Path(dest).rglob("engram/_version.py"))
        if len(versions) != 1:
            return {"installed engram package": f"{len(versions)} engram/_version.py installed"}
        return python_versions(versions[0].parent.parent, client_lib, "installed")


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
    for option in ("--meson-version", "--source", "--build", "--client-lib", "--engramctl",
                   "--engramd"):
        parser.add_argument(option, required=True)
    parser.add_argument("--tool", action="append", default=[], metavar="NAME=EXE",
                        help="another program whose --version prints NAME RELEASE")
    args = parser.parse_args()
    source = pathlib.Path(args.source)
    build = pathlib.Path(args.build)
    lib = ctypes.CDLL(args.client_lib)
    lib.engram_version.restype = ctypes.c_char_p
    programs = dict(tool.split("=", 1) for tool in args.tool)
    programs.update(engramctl=args.engramctl, engramd=args.engramd)
    found = {
        f"engram_version() of {args.client_lib}": lib.engram_version().decode(),
        "engram/version.h (generated)": header_version(build),
        **{f"{name} --version": program_version(exe, name) for name, exe in programs.items()},
        **python_versions(source / "python", args.client_lib, "source tree"),
        **installed_python_versions(build, args.client_lib),
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
