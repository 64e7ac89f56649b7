#!/usr/bin/env python3
"""Writes a copy of include/engram/engram.h whose structs are those of an older or a newer
release: `older` drops the last field of the options, request and output structs (as a header
from before those fields existed), `newer` appends one field to each (as a header from after).
engram_session_stats' counters are first written out from their list (session_stats.h, beside
IN) so that its fields can be cut like the others'.

usage: make_header.py older|newer IN OUT
"""

import os
import re
import sys

# struct -> (the declaration of the first field `older` cuts (it and all after it: the fields of
# the latest release), the field a newer header adds)
STRUCTS = {
    "engram_connect_options": ("int64_t timeout_ns;", "uint64_t future_option;"),
    "engram_gather_request": ("const uint64_t* dest_offsets;", "uint64_t future_flags;"),
    "engram_table_info": ("uint32_t tier;", "uint64_t future_field;"),
    "engram_session_stats": ("uint64_t client_sleeps;", "uint64_t future_counter;"),
}


def counter_names(session_stats_h):
    """The fields of ENGRAM_SESSION_COUNTERS, in order."""
    with open(session_stats_h) as f:
        text = f.read()
    match = re.search(r"#define ENGRAM_SESSION_COUNTERS\(X\)((?:.*\\\n)*.*\n)", text)
    if match is None:
        sys.exit(f"make_header.py: no ENGRAM_SESSION_COUNTERS list in {session_stats_h}")
    return re.findall(r"\bX\((\w+),", match.group(1))


def expand_counters(text, names):
    macro = "  ENGRAM_SESSION_COUNTERS(ENGRAM_SESSION_STATS_FIELD_)"
    if macro not in text:
        sys.exit("make_header.py: engram_session_stats does not use ENGRAM_SESSION_COUNTERS")
    return text.replace(macro, "\n".join(f"  uint64_t {n};" for n in names))


def rewrite(text, mode):
    for name, (last, added) in STRUCTS.items():
        match = re.search(r"struct %s \{\n(.*?)\n\};" % name, text, re.S)
        if match is None:
            sys.exit(f"make_header.py: struct {name} not found")
        body = match.group(1)
        if mode == "older":
            start = body.find("  " + last)
            if start < 0:
                sys.exit(f"make_header.py: struct {name} has no field '{last}'")
            # The field and its comment lines, up to the end of the struct.
            new_body = body[:start].rstrip("\n")
        else:
            new_body = body + "\n  " + added
        text = text[:match.start(1)] + new_body + text[match.end(1):]
        # The copy stands for another release, whose struct has another size: its pinned size
        # goes with the change.
        assert_line = re.compile(r"^ENGRAM_ASSERT_SIZE\(struct %s, \d+\);\n" % name, re.M)
        text, found = assert_line.subn("", text)
        if found != 1:
            sys.exit(f"make_header.py: struct {name} has no ENGRAM_ASSERT_SIZE line")
    # The include guard stays: a test that includes this copy first gets it in place of the real
    # header wherever "engram/engram.h" is included after it.
    return text


def main():
    mode, src, dst = sys.argv[1:4]
    if mode not in ("older", "newer"):
        sys.exit("make_header.py: mode is older or newer")
    with open(src) as f:
        text = f.read()
    text = expand_counters(text, counter_names(os.path.join(os.path.dirname(src),
                                                            "session_stats.h")))
    with open(dst, "w") as f:
        f.write(rewrite(text, mode))


if __name__ == "__main__":
    main()
