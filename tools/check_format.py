#!/usr/bin/env python3
"""Checks that the production tree's C, C++ and CUDA sources are as clang-format writes them.

The style is the repository's .clang-format (Google base, 100 columns), applied by Debian 12's
clang-format 14: another release can lay out the same code differently, so the check names the
release it ran and the files it would change, and tools/setup.sh installs that release.

Production means the libraries, programs, kernels and public headers: every source file under
the folders given on the command line, except tests (tests/, daemon/tests/) and benchmarks,
whose layout serves reading a case at once more than a formatter. Generated files live in build
directories and are not walked. A region a person laid out by hand on purpose (a table) is
fenced with `// clang-format off` / `// clang-format on`, which clang-format itself honours.

Usage:
  check_format.py [--root DIR] [--fix] FOLDER...
Exits 0 when every file is formatted, 1 listing the files that are not (with --fix it rewrites
them instead), 77 (skipped) when clang-format is not installed.
"""

import argparse
import os
import shutil
import subprocess
import sys

SOURCE_SUFFIXES = ('.c', '.cc', '.cpp', '.h', '.hpp', '.cu', '.cuh')
# Folders inside the production roots that hold tests rather than production code.
EXCLUDED_DIRS = {os.path.join('daemon', 'tests')}
SKIP_EXIT = 77


def sources(root, folders):
    """Paths, relative to root and sorted, of the production sources under folders."""
    found = []
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames
                                 if os.path.join(rel_dir, d) not in EXCLUDED_DIRS)
            found.extend(os.path.join(rel_dir, f) for f in filenames
                         if f.endswith(SOURCE_SUFFIXES))
    return sorted(found)


def unformatted(clang_format, root, paths):
    """The paths clang-format would change. One run over every file: it reports each change as
    `path:line:col: error: code should be clang-formatted`."""
    run = subprocess.run([clang_format, '--dry-run', '-Werror', '--style=file', *paths],
                         cwd=root, capture_output=True, text=True)
    reported = {line.split(':', 1)[0] for line in run.stderr.splitlines()
                if ': error: code should be clang-formatted' in line}
    if run.returncode != 0 and not reported:
        raise RuntimeError(f'clang-format failed without naming a file:\n{run.stderr}')
    return sorted(reported)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--root', default='.', help='repository root (holds .clang-format)')
    parser.add_argument('--fix', action='store_true', help='rewrite the files in place')
    parser.add_argument('folders', nargs='+')
    args = parser.parse_args()
    clang_format = shutil.which('clang-format')
    if clang_format is None:
        print('check_format: clang-format is not installed (tools/setup.sh installs it); skipped')
        return SKIP_EXIT
    version = subprocess.run([clang_format, '--version'], capture_output=True,
                             text=True).stdout.strip()
    paths = sources(args.root, args.folders)
    if not paths:
        print(f'check_format: no sources under {args.folders} in {args.root}')
        return 1
    if args.fix:
        subprocess.run([clang_format, '-i', '--style=file', *paths], cwd=args.root, check=True)
        print(f'check_format: formatted {len(paths)} files with {version}')
        return 0
    bad = unformatted(clang_format, args.root, paths)
    print(f'check_format: {len(paths)} files checked with {version}')
    if bad:
        print(f'{len(bad)} files are not as clang-format writes them '
              f'(tools/check_format.py --fix {" ".join(args.folders)} rewrites them):')
        for path in bad:
            print(f'  {path}')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
