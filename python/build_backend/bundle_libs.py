#!/usr/bin/env python3
"""Copies shared libraries and the libraries they load into one folder that works on its own.

    bundle_libs.py --out DIR [--patchelf PATCHELF] LIB...

Each LIB is copied under its SONAME (libengram_client.so.0, the name engram._lib looks for
too); every library `ldd` resolves for them is copied too, except those of
the C runtime and of the GPU drivers and runtimes, which the target machine provides (the
process's torch loads its own CUDA runtime). Every copy gets RUNPATH $ORIGIN, so the folder can
sit anywhere (engram/lib/ of the wheel). Used by python/meson.build for the wheel build.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

# Libraries a Linux machine or its GPU stack provides: never bundled.
SYSTEM = re.compile(r"^(linux-vdso|linux-gate|ld-linux.*|libc|libm|libdl|libpthread|librt|"
                    r"libutil|libresolv|libstdc\+\+|libgcc_s|libcuda|libcudart|libnvidia-.*|"
                    r"libnvrtc|libamdhip64|libhsa-runtime64|libhiprtc|libdrm.*|libnuma)"
                    r"\.so(\..*)?$")


def run(command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def soname(patchelf, path):
    name = run([patchelf, "--print-soname", path]).strip()
    return name or os.path.basename(path)


def dependencies(path):
    """(name, resolved path) of every library the dynamic linker loads for `path`."""
    out = run(["ldd", path])
    found = []
    for line in out.splitlines():
        match = re.match(r"\s*(\S+) => (\S+) \(0x", line)
        if match:
            found.append((match.group(1), match.group(2)))
        elif "=> not found" in line:
            name = line.split()[0]
            if not SYSTEM.match(name):
                sys.exit(f"bundle_libs: {path} needs {name}, which ldd cannot find")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--patchelf", default="patchelf")
    parser.add_argument("libs", nargs="+")
    args = parser.parse_args()

    if os.path.isdir(args.out):
        shutil.rmtree(args.out)  # a fresh folder: ninja sees its new time stamp
    os.makedirs(args.out)
    copies = {}  # file name in the folder -> source path
    for lib in args.libs:
        copies[soname(args.patchelf, lib)] = lib
        for dep_name, dep_path in dependencies(lib):
            if not SYSTEM.match(dep_name):
                copies[dep_name] = os.path.realpath(dep_path)
    for name, source in sorted(copies.items()):
        target = os.path.join(args.out, name)
        shutil.copyfile(source, target)
        os.chmod(target, 0o755)
        run([args.patchelf, "--set-rpath", "$ORIGIN", target])


if __name__ == "__main__":
    main()
