#!/usr/bin/env python3
"""Lists source files longer than their area's limit: a file holds one concern (house style 13).

Limits: a production source file may have 800 lines, a benchmark file (under bench/) 1,000 (a
benchmark is its cases plus a shared driver; the driver's option table and report make its
files a little longer). A file's length is its number of lines, a last line without a newline
included.

What counts as source:
  - C, C++, CUDA and HIP sources and headers (.c .cc .cpp .cxx .h .hh .hpp .cu .cuh .hip);
  - Python (.py) and shell (.sh .bash), and any other file whose first line is a `#!` line
    naming sh, bash or python (scripts such as .ci/run, Debian maintainer scripts).
Data and prose do not: JSON (the Grafana dashboard), Markdown, meson.build, debian/rules and
control files, man pages, systemd units. Neither does the one JavaScript tool (tools/trace): it
is outside the languages the house style covers.

What is left out: tests/ and docs/ (tests may be long tables of cases; docs hold examples),
.git, and build output: a folder holding meson-private/, build.ninja, CMakeCache.txt or
pyvenv.cfg (a build or a virtual environment, whatever its name), __pycache__, node_modules,
*.egg-info and subprojects/ (third-party code meson fetches).

There is no allow-list: a file over its limit is split, not listed.

Usage:
  check_file_length.py [--root DIR] [--limit 800] [--bench-limit 1000] [PATH...]
PATHs (files or folders, relative to --root) default to the whole of --root. Prints every file
over its limit with its line count, the limit and the reason, and exits 1 if there is one.
"""

import argparse
import os
import re
import sys

SOURCE_SUFFIXES = ('.c', '.cc', '.cpp', '.cxx', '.h', '.hh', '.hpp', '.cu', '.cuh', '.hip',
                   '.py', '.sh', '.bash')
_SCRIPT_SHEBANG = re.compile(r'^#!\s*\S*(?:/|\benv\s+)(?:sh|bash|python3?)\b')

# Folders that are never looked into, by name, and marker files that make a folder build output.
SKIPPED_NAMES = ('.git', '__pycache__', 'node_modules', 'subprojects')
BUILD_MARKERS = ('meson-private', 'build.ninja', 'CMakeCache.txt', 'pyvenv.cfg')
# Top-level areas that are not checked at all.
UNCHECKED_AREAS = ('tests', 'docs')
BENCH_AREA = 'bench'

PRODUCTION_REASON = ('a file holds one concern (house style 13): split it where a reader would '
                     'look for each verb')
BENCH_REASON = ('a benchmark is its cases plus a shared driver (house style 13): split it into '
                'those')


def is_source(path):
    """True for a file of a language the check covers (see the module's docstring)."""
    name = os.path.basename(path)
    if name.endswith(SOURCE_SUFFIXES):
        return True
    try:
        with open(path, 'rb') as f:
            first = f.readline(200).decode('utf-8', errors='replace')
    except OSError:
        return False
    return bool(_SCRIPT_SHEBANG.match(first))


def is_build_output(folder, name):
    if name in SKIPPED_NAMES or name.endswith('.egg-info'):
        return True
    return any(os.path.exists(os.path.join(folder, marker)) for marker in BUILD_MARKERS)


def area(rel):
    """The top-level folder of a path relative to the root ('' for a file at the top)."""
    parts = rel.replace(os.sep, '/').split('/')
    return parts[0] if len(parts) > 1 else ''


def source_files(root, paths):
    """Paths relative to root of the source files under `paths`, outside unchecked areas."""
    for p in paths:
        full = os.path.normpath(os.path.join(root, p))
        if os.path.isfile(full):
            rel = os.path.relpath(full, root)
            if area(rel) not in UNCHECKED_AREAS and is_source(full):
                yield rel
            continue
        if not os.path.isdir(full):
            raise FileNotFoundError(f'{p}: no such file or folder under {root}')
        for dirpath, dirnames, filenames in os.walk(full):
            rel_dir = os.path.relpath(dirpath, root)
            keep = []
            for d in sorted(dirnames):
                rel = os.path.normpath(os.path.join(rel_dir, d))
                if rel in UNCHECKED_AREAS or is_build_output(os.path.join(dirpath, d), d):
                    continue
                keep.append(d)
            dirnames[:] = keep
            for f in sorted(filenames):
                rel = os.path.normpath(os.path.join(rel_dir, f))
                if area(rel) not in UNCHECKED_AREAS and is_source(os.path.join(dirpath, f)):
                    yield rel


def count_lines(path):
    """Lines in the file; a last line without a newline counts."""
    with open(path, 'rb') as f:
        data = f.read()
    return data.count(b'\n') + (1 if data and not data.endswith(b'\n') else 0)


def limit_for(rel, limit, bench_limit):
    """(limit, kind, reason) for a file by its area."""
    if area(rel) == BENCH_AREA:
        return bench_limit, 'benchmark file', BENCH_REASON
    return limit, 'production source file', PRODUCTION_REASON


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='.', help='the source tree the paths are relative to')
    parser.add_argument('--limit', type=int, default=800,
                        help='most lines a production source file may have')
    parser.add_argument('--bench-limit', type=int, default=1000,
                        help='most lines a file under bench/ may have')
    parser.add_argument('paths', nargs='*', default=['.'], help='files or folders to check')
    args = parser.parse_args(argv)
    if args.limit < 1 or args.bench_limit < 1:
        parser.error('--limit and --bench-limit must be at least 1')

    over = 0
    checked = 0
    for rel in source_files(args.root, args.paths):
        checked += 1
        lines = count_lines(os.path.join(args.root, rel))
        limit, kind, reason = limit_for(rel, args.limit, args.bench_limit)
        if lines > limit:
            over += 1
            print(f'error: {rel}: {lines} lines, over the limit of {limit} for a {kind}: {reason}',
                  file=sys.stderr)
    print(f'{checked} source files checked, {over} over their limit')
    return 1 if over else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
