#!/usr/bin/env python3
"""The public headers and the libraries agree on the C ABI: every function declared in
include/engram/*.h (and the generated engram/version.h) is marked ENGRAM_API, and the functions
declared are exactly those libengram_client and the kernel library export (the kernel library's
as its version script lists them when it is not built here).

usage: check_exports.py --headers DIR... --client-lib LIB --kernels-map MAP [--kernels-lib LIB]
"""

import argparse
import pathlib
import re
import subprocess
import sys

# A compatibility form of a function (client/abi_compat.cc): exported under its own name too,
# because the version script must name it to bind it to name@ENGRAM_0.N.
_COMPAT_FORM = re.compile(r"^(\w+)_v\d+_\d+$")
# Marks that are no part of a declaration's name or type: ENGRAM_API, ENGRAM_DEPRECATED("..."),
# __attribute__((...)), with or without an argument list.
_MARK = re.compile(r"\b(?:ENGRAM_[A-Z0-9_]+|__attribute__)\b\s*(\((?:[^()]|\([^()]*\))*\))?")
_DECLARATION = re.compile(r"^(?P<type>[\w\s\*]+?[\s\*])(?P<name>[A-Za-z_]\w*)\s*\((?P<args>.*)\)$",
                          re.S)


def strip_comments_and_directives(text):
    """The header's C code: comments blanked (newlines kept, for line numbers), preprocessor
    lines (with their continuations) dropped."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    lines = text.split("\n")
    out, continued = [], False
    for line in lines:
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        out.append("" if directive else line)
    return "\n".join(out).replace('extern "C" {', "")


def top_level_statements(code):
    """(first line, text) of each statement at file scope: split at `;` and at a `}` that
    closes to file scope; a `}` with nothing open (extern "C"'s) is a separator only."""
    depth, start, line, start_line = 0, 0, 1, 1
    for i, ch in enumerate(code):
        if ch == "\n":
            line += 1
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
        if (ch == ";" or ch == "}") and depth == 0:
            statement = code[start:i + (ch == "}")]
            if statement.strip():
                yield start_line + statement[:len(statement) - len(statement.lstrip())].count(
                    "\n"), statement.strip()
            start, start_line = i + 1, line
    if code[start:].strip():
        yield start_line, code[start:].strip()


def declared_functions(header):
    """{name: (line, marked)} of the functions a header declares (not defines) at file scope."""
    found = {}
    for line, statement in top_level_statements(strip_comments_and_directives(header.read_text())):
        if "{" in statement or statement.startswith("typedef") or "(" not in statement:
            continue
        marked = re.search(r"\bENGRAM_API\b", statement) is not None
        match = _DECLARATION.match(_MARK.sub(" ", statement).strip())
        if match is None or match.group("type").strip() in ("", "return"):
            continue  # a macro use (ENGRAM_ASSERT_SIZE(...);), not a declaration
        if "(" in match.group("type"):
            continue  # a function pointer variable
        found[match.group("name")] = (line, marked)
    return found


def exported_functions(library):
    """Names of the functions a shared library defines in its dynamic symbol table."""
    run = subprocess.run(["readelf", "--dyn-syms", "--wide", library], capture_output=True,
                         text=True, check=True)
    names = set()
    for row in run.stdout.splitlines():
        fields = row.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(fields) >= 8 and fields[3] == "FUNC" and fields[4] in ("GLOBAL", "WEAK") \
                and fields[6] != "UND":
            names.add(fields[7].split("@")[0])
    return names


def version_script_globals(path):
    """The names a version script exports (its global: entries)."""
    text = re.sub(r"/\*.*?\*/", "", pathlib.Path(path).read_text(), flags=re.S)
    names = set()
    for block in re.findall(r"global:(.*?)(?:local:|\})", text, flags=re.S):
        names.update(n.strip() for n in block.split(";") if n.strip())
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headers", nargs="+", required=True,
                        help="folders whose *.h are public headers")
    parser.add_argument("--client-lib", required=True)
    parser.add_argument("--kernels-map", required=True)
    parser.add_argument("--kernels-lib")
    args = parser.parse_args()

    declared, problems = {}, []
    headers = sorted(h for d in args.headers for h in pathlib.Path(d).glob("*.h"))
    for header in headers:
        for name, (line, marked) in declared_functions(header).items():
            declared.setdefault(name, f"{header.name}:{line}")
            if not marked:
                problems.append(f"{header.name}:{line}: {name} is declared without ENGRAM_API")
    if len(declared) < 50:  # engram.h alone declares more: the parser lost its way
        problems.append(f"only {len(declared)} functions found in {len(headers)} headers")

    client = {n for n in exported_functions(args.client_lib)
              if not (_COMPAT_FORM.match(n) and _COMPAT_FORM.match(n).group(1) in declared)}
    kernels_listed = version_script_globals(args.kernels_map)
    if args.kernels_lib:
        kernels = exported_functions(args.kernels_lib)
        for name in sorted(kernels ^ kernels_listed):
            where = "exports" if name in kernels else "does not export"
            problems.append(f"{args.kernels_lib} {where} {name}, which {args.kernels_map} "
                            f"{'does not list' if name in kernels else 'lists'}")
    for name in sorted(client & kernels_listed):
        problems.append(f"{name} is exported by both libengram_client and the kernel library")
    exported = client | kernels_listed
    for name in sorted(exported - set(declared)):
        source = "libengram_client" if name in client else "the kernel library"
        problems.append(f"{source} exports {name}, which no public header declares")
    for name in sorted(set(declared) - exported):
        problems.append(f"{declared[name]}: {name} is declared but no library exports it")

    print(f"{len(declared)} functions declared in {len(headers)} headers; "
          f"{len(client)} exported by libengram_client, {len(kernels_listed)} by the kernel "
          f"library ({'built' if args.kernels_lib else 'its version script'})")
    for problem in problems:
        print(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
