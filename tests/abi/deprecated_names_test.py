#!/usr/bin/env python3
"""The older names of the C ABI (engram.h, conventions 8-9) are marked deprecated: a program
that uses one fails to compile under -Werror=deprecated-declarations, the message naming the
current name, while the current names (aggregate and designated initialisation, `= {}`,
memset, offsetof in a static assertion) compile without a warning. Checked with the project's
own C and C++ compilers (and nvcc where the kernels are built) against the source tree's headers.

usage: deprecated_names_test.py --include DIR... --cc CMD... --cxx CMD... [--nvcc CMD...]
"""

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

HEADERS = """#include <stddef.h>
#include <string.h>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"
#include "engram/hash.h"
"""

# (the use of an older name, on a line of its own; the current name the message must give)
OLD_USES = [
    ("  (void)engram_connect(NULL, &s);", "engram_session_open"),
    ("  engram_close(s);", "engram_session_close"),
    ("  (void)engram_map_table(s, 14, &m);", "engram_table_map_open"),
    ("  engram_unmap_table(m);", "engram_table_map_close"),
    ("  (void)engram_hash_last_error();", "engram_last_error"),
    ("  (void)engram_gpu_last_error();", "engram_last_error"),
    ("  (void)engram_kernels_last_error();", "engram_last_error"),
    ("  gather.table = 14;", "layer"),
    ("  (void)info.layer_id;", "layer"),
    ("  (void)map_info.layer_id;", "layer"),
    ("  tokens.table = 1;", "layer"),
    ("  (void)layer_info.layer_id;", "layer"),
    ("  hash_args.layer_id = 14;", "layer"),
    ("  gpu_request.table = 14;", "layer"),
]

OLD_PROLOGUE = """
void use_old_names(engram_session* s, engram_table_map* m) {
  struct engram_gather_request gather;
  struct engram_table_info info;
  struct engram_table_map_info map_info;
  struct engram_token_request tokens;
  struct engram_hash_layer_info layer_info;
  struct engram_gpu_hash_args hash_args;
  struct engram_gpu_request gpu_request;
  memset(&gather, 0, sizeof gather);
  memset(&info, 0, sizeof info);
  memset(&map_info, 0, sizeof map_info);
  memset(&tokens, 0, sizeof tokens);
  memset(&layer_info, 0, sizeof layer_info);
  memset(&hash_args, 0, sizeof hash_args);
  memset(&gpu_request, 0, sizeof gpu_request);
"""

# Every struct with a deprecated alias, through the current names only.
CURRENT = HEADERS + """
#ifdef __cplusplus
#define STATIC_ASSERT static_assert
#else
#define STATIC_ASSERT _Static_assert
#endif
STATIC_ASSERT(offsetof(struct engram_gather_request, layer) == 8, "layer");
STATIC_ASSERT(offsetof(struct engram_table_info, layer) == 8, "layer");
STATIC_ASSERT(offsetof(struct engram_table_map_info, layer) == 8, "layer");
STATIC_ASSERT(offsetof(struct engram_token_request, layer) == 8, "layer");
STATIC_ASSERT(offsetof(struct engram_hash_layer_info, layer) == 8, "layer");
STATIC_ASSERT(offsetof(struct engram_gpu_hash_args, layer) == 8, "layer");
STATIC_ASSERT(offsetof(struct engram_gpu_request, layer) == 8, "layer");

unsigned use_current_names(engram_session* s, engram_table_map* m) {
  struct engram_gather_request gather = {.size = sizeof gather, .layer = 14};
  struct engram_gather_request zeroed = {};
  struct engram_gather_request copy = gather;
  struct engram_table_info info;
  memset(&info, 0, sizeof info);
  struct engram_table_info infos[2] = {{sizeof(struct engram_table_info)}};
  struct engram_table_map_info map_info = {sizeof map_info};
  struct engram_token_request tokens = {.size = sizeof tokens, .layer = 1};
  struct engram_hash_layer_info layer_info = {};
  struct engram_gpu_hash_args hash_args = {.size = sizeof hash_args, .layer = 14};
  struct engram_gpu_request gpu_request = {sizeof gpu_request, {14}};
  zeroed = copy;
  infos[1] = info;
  (void)engram_session_open(NULL, &s);
  engram_session_close(s);
  (void)engram_table_map_open(s, 14, &m);
  engram_table_map_close(m);
  (void)engram_last_error();
  return gather.layer + zeroed.layer + infos[1].layer + map_info.layer + tokens.layer +
         layer_info.layer + hash_args.layer + gpu_request.layer;
}
"""

# The C++ wrapper's own struct with an alias, and the copies a C++ caller makes.
CURRENT_CXX = """
#include <vector>

#include "engram/engram.hpp"

unsigned use_the_wrapper() {
  engram::TokenRequest request;
  request.layer = 14;
  engram::TokenRequest copy = request;
  engram::TokenRequest zeroed{};
  zeroed = copy;
  std::vector<engram_table_info> tables(2);
  tables.push_back(engram_table_info{});
  return zeroed.layer + tables[2].layer;
}
"""

OLD_CXX = """
#include "engram/engram.hpp"

unsigned use_the_wrappers_old_name(engram::TokenRequest request) {
  return request.table;
}
"""


def old_source():
    """The source, and {line number: current name} of each older name's use."""
    text = HEADERS + OLD_PROLOGUE
    expected = {}
    for use, current in OLD_USES:
        expected[text.count("\n") + 1] = current
        text += use + "\n"
    return text + "}\n", expected


def compile_source(cmd, path):
    result = subprocess.run(cmd + [str(path)], capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def check_old(name, cmd, path, expected):
    """Fails unless the compile fails and each expected line has its deprecation message."""
    rc, out = compile_source(cmd, path)
    failures = []
    if rc == 0:
        failures.append(f"{name}: {path.name} compiled, though it uses deprecated names")
    for line, current in sorted(expected.items()):
        pattern = re.compile(r"%s:%d:\d+: (error|warning):.*deprecated: use %s\b" %
                             (re.escape(path.name), line, re.escape(current)))
        if not pattern.search(out):
            failures.append(f"{name}: no deprecation naming {current} at {path.name}:{line}")
    return failures, out


def check_current(name, cmd, path):
    rc, out = compile_source(cmd, path)
    if rc != 0 or "deprecated" in out:
        return [f"{name}: {path.name} (current names only) did not compile cleanly"], out
    return [], out


def parse_args(argv):
    """--include, --cc, --cxx and --nvcc each take every argument up to the next of them: a
    compiler's command line has options of its own (nvcc -ccbin c++)."""
    keys = {"--include": "include", "--cc": "cc", "--cxx": "cxx", "--nvcc": "nvcc"}
    args = argparse.Namespace(include=None, cc=None, cxx=None, nvcc=None)
    current = None
    for arg in argv:
        if arg in keys:
            current = keys[arg]
            setattr(args, current, [])
        elif current is None:
            sys.exit(__doc__)
        else:
            getattr(args, current).append(arg)
    if not (args.include and args.cc and args.cxx):
        sys.exit(__doc__)
    return args


def main():
    args = parse_args(sys.argv[1:])
    includes = [f"-I{d}" for d in args.include]
    strict = ["-Wall", "-Wextra", "-Wno-missing-field-initializers", "-Werror"]
    werror = ["-Werror=deprecated-declarations"]
    c = args.cc + ["-std=c11", "-fsyntax-only"] + includes
    cxx = args.cxx + ["-std=c++20", "-fsyntax-only"] + includes

    old, expected = old_source()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        files = {}
        for stem, text in [("old.c", old), ("old.cc", old), ("current.c", CURRENT),
                           ("current.cc", CURRENT + CURRENT_CXX), ("old_wrapper.cc",
                           OLD_CXX), ("old.cu", old), ("current.cu", CURRENT)]:
            files[stem] = tmp / stem
            files[stem].write_text(text)
        wrapper_line = OLD_CXX.splitlines().index("  return request.table;") + 1
        runs = [
            ("C", check_old, c + werror, "old.c", expected),
            ("C++", check_old, cxx + werror, "old.cc", expected),
            ("C++ wrapper", check_old, cxx + werror, "old_wrapper.cc", {wrapper_line: "layer"}),
            ("C", check_current, c + strict, "current.c", None),
            ("C++", check_current, cxx + strict, "current.cc", None),
        ]
        if args.nvcc:
            nvcc = args.nvcc + ["-std=c++17", "-c", "-o", str(tmp / "out.o")] + includes
            runs += [
                ("nvcc", check_old, nvcc + ["-Xcompiler", werror[0]], "old.cu", expected),
                ("nvcc", check_current, nvcc + ["-Xcompiler", ",".join(strict)], "current.cu",
                 None),
            ]
        for name, check, cmd, stem, lines in runs:
            found, out = (check(name, cmd, files[stem], lines) if lines is not None else
                          check(name, cmd, files[stem]))
            print(f"{name} {stem}: {'FAIL' if found else 'ok'}")
            if found:
                print(out)
            failures += found
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
