#!/usr/bin/env python3
"""debian/libengram-client0.symbols lists exactly the symbols, with their version nodes, that the
built libengram_client.so exports (objdump -T), and no symbol's minimal version is later than
the release. Prints the difference as a diff of the two sorted lists. No package is built.

usage: check_symbols.py --symbols FILE --library LIB --release VERSION
"""

import argparse
import difflib
import re
import subprocess
import sys

# objdump -T: VALUE FLAGS SECTION SIZE [VERSION | (VERSION)] NAME; a version in parentheses is
# a non-default one (name@VERSION rather than name@@VERSION), which the symbols file lists alike.
_DYNAMIC = re.compile(r"^[0-9a-f]+\s.{7}\s(?P<section>\S+)\s+[0-9a-f]+\s+"
                      r"\(?(?P<version>[^\s()]+)\)?\s+(?P<name>\S+)$")


def exported(library):
    """name@VERSION of each symbol the library defines in its dynamic table (the version nodes'
    own names included, as dpkg-gensymbols lists them)."""
    out = subprocess.run(["objdump", "-T", library], capture_output=True, text=True,
                         check=True).stdout
    symbols = set()
    for line in out.splitlines():
        match = _DYNAMIC.match(line)
        if match is None or match.group("section") == "*UND*":
            continue
        if match.group("version") in ("Base", "*local*"):
            symbols.add(f"{match.group('name')}@Base")
        else:
            symbols.add(f"{match.group('name')}@{match.group('version')}")
    return symbols


def listed(path):
    """{name@VERSION: minimal version} of a deb-symbols(5) file's one library."""
    symbols = {}
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        if not line[:1].isspace() or not line.strip():
            continue  # the header, meta fields (* Field:), comments (#)
        fields = re.sub(r"^\s*(\([^)]*\))?", "", line).split()  # tags like (optional)
        if len(fields) < 2 or "@" not in fields[0]:
            raise SystemExit(f"{path}:{number}: not `name@VERSION minver`: {line.rstrip()}")
        if fields[0] in symbols:
            raise SystemExit(f"{path}:{number}: {fields[0]} is listed twice")
        symbols[fields[0]] = fields[1]
    return symbols


def version_key(version):
    return [int(part) if part.isdigit() else part for part in re.split(r"[.~+-]", version)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--symbols", required=True)
    parser.add_argument("--library", required=True)
    parser.add_argument("--release", required=True)
    args = parser.parse_args()
    have = exported(args.library)
    want = listed(args.symbols)
    failed = False
    if have != set(want):
        failed = True
        print(f"{args.symbols} (-) differs from what {args.library} exports (+):")
        sys.stdout.writelines(difflib.unified_diff(
            [s + "\n" for s in sorted(want)], [s + "\n" for s in sorted(have)],
            fromfile=args.symbols, tofile=args.library, n=0))
    for symbol, minver in sorted(want.items()):
        if version_key(minver) > version_key(args.release):
            failed = True
            print(f"{symbol}: minimal version {minver} is later than the release {args.release}")
    if not failed:
        print(f"{len(have)} symbols of {args.library} match {args.symbols}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
