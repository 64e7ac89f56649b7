#!/usr/bin/env python3
"""Writes a man page from its template (man/*.in, written as a man page) and the built program's
--help: the template's line "@OPTIONS@" becomes the program's options as tagged paragraphs, and
"@COMMANDS@" (engramctl) a subsection per subcommand with its synopsis, what it does and its own
options; options most subcommands share are listed once, under "@OPTIONS@". @NAME@-style words
given with --define are replaced throughout.

    make_page.py --template man/engramd.8.in --out engramd.8 --name engramd \\
        --exe build/daemon/engramd [--runner qemu-aarch64-static] [--empty-config PATH] \\
        [--define VERSION=1.2.0 ...]

--empty-config (engramd): --help runs with an empty configuration file, so that the defaults
shown are the program's own and not the build machine's /etc; the page names PATH (the file the
program reads without --config) as --config's default instead.
"""

import argparse
import os
import pathlib
import re
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools" / "completion"))
import cli_docs  # noqa: E402  (the --help reader the shell completion uses)

TYPE_AND_REST = re.compile(r"^([A-Z][A-Z0-9_]*)(?::\{([^}]*)\})?(?:=(\S+))?(.*)$")


class Entry:
    """An option or positional as the page shows it."""

    def __init__(self, names, value, default, repeats, description):
        self.names = names  # ["-o", "--output"]; a positional: ["LAYER"]
        self.value = value  # "PATH", "wide|json", "" for a flag
        self.default = default
        self.repeats = repeats
        self.description = description

    @property
    def positional(self):
        return not self.names[0].startswith("-")


def roff(text):
    """Text as roff prints it: backslashes and hyphens escaped, a leading control char defused."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def parse_entry(head, description):
    names_field, _, rest = head.partition(" ")
    names = [n for n in names_field.split(",") if n]
    value, default, repeats = "", "", False
    m = TYPE_AND_REST.match(rest.strip())
    if m and m.group(1) != "REQUIRED":
        value = "|".join(c.strip() for c in m.group(2).split(",")) if m.group(2) else m.group(1)
        default = m.group(3) or ""
        repeats = "..." in m.group(4)
    return Entry(names, value, default, repeats, description)


def parse_entries(text):
    """The options and positionals of a --help, in its order (--help itself left out)."""
    out = []
    for title, lines in cli_docs.sections(text).items():
        if title == "Subcommands":
            continue
        for head, description in cli_docs.entries(lines):
            if title != "Positionals" and not head.startswith("-"):
                continue
            entry = parse_entry(head, description)
            if "--help" not in entry.names:
                out.append(entry)
    return out


def tagged(entry):
    """One entry as a tagged paragraph: the names in bold, the value in italics."""
    if entry.positional:
        tag = f"\\fI{roff(entry.names[0])}\\fR"
    else:
        tag = ", ".join(f"\\fB{roff(n)}\\fR" for n in entry.names)
        if entry.value:
            tag += " " + "|".join(f"\\fI{roff(v)}\\fR" for v in entry.value.split("|"))
    if entry.repeats:
        tag += " ..."
    text = entry.description
    if text and not text.endswith((".", "]")):
        text += "."
    if entry.default:
        text += f" Default: {entry.default}."
    return f".TP\n{tag}\n{roff(text.strip())}\n"


def usage(text, name):
    """The synopsis of a --help's "Usage:" line, the program named `name`."""
    for line in text.splitlines():
        if line.startswith("Usage: "):
            words = line[len("Usage: "):].split(" ", len(name.split()))
            rest = words[len(name.split())] if len(words) > len(name.split()) else ""
            rest = re.sub(r"\b([A-Z][A-Z0-9_]+)\b", r"\\fI\1\\fR", roff(rest))
            return f"\\fB{roff(name)}\\fR {rest}".rstrip() + "\n"
    raise cli_docs.HelpError(f"{name} --help has no Usage line")


def commands_roff(runner, exe, name, top):
    """A subsection per subcommand, and the options more than half of them share (listed once
    under OPTIONS, not in each subsection)."""
    subs = [cli_docs.Command(h.split()[0], d) for h, d in
            cli_docs.entries(cli_docs.sections(top).get("Subcommands", []))]
    helps = {s.name: cli_docs.run_help(runner, exe, [s.name]) for s in subs}
    entries = {s.name: parse_entries(helps[s.name]) for s in subs}
    counts = {}
    for es in entries.values():
        for e in es:
            counts[tuple(e.names)] = counts.get(tuple(e.names), 0) + 1
    common = {k for k, n in counts.items() if not k[0][0].isupper() and 2 * n > len(subs)}
    shared, seen = [], set()
    out = []
    for s in subs:
        out.append(f'.SS "{name} {s.name}"\n' + usage(helps[s.name], f"{name} {s.name}"))
        out.append(f".PP\n{roff(s.description)}\n")
        own = [e for e in entries[s.name] if tuple(e.names) not in common]
        out += [tagged(e) for e in own]
        for e in entries[s.name]:
            if tuple(e.names) in common and tuple(e.names) not in seen:
                seen.add(tuple(e.names))
                shared.append(e)
    return "".join(out), shared


def make_page(args):
    runner, exe = args.runner, args.exe
    help_args = []
    work = None
    if args.empty_config:
        work = tempfile.mkdtemp()
        empty = os.path.join(work, "empty.toml")
        open(empty, "w").close()
        help_args = ["--config", empty]
    try:
        top = cli_docs.run_help(runner, exe, help_args)
    finally:
        if work:
            os.remove(os.path.join(work, "empty.toml"))
            os.rmdir(work)
    options = parse_entries(top)
    for o in options:
        if work and o.default.startswith(work):
            o.default = args.empty_config
    commands, shared = "", []
    with open(args.template) as f:
        template = f.read()
    if "@COMMANDS@" in template:
        commands, shared = commands_roff(runner, exe, args.name, top)
    page = []
    for line in template.splitlines(keepends=True):
        if line.strip() == "@OPTIONS@":
            page += [tagged(o) for o in options + shared]
        elif line.strip() == "@COMMANDS@":
            page.append(commands)
        else:
            page.append(line)
    text = "".join(page)
    for d in args.define:
        key, _, value = d.partition("=")
        text = text.replace(f"@{key}@", value)
    if work and work in text:
        raise cli_docs.HelpError(f"the page still names the temporary folder {work}")
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise cli_docs.HelpError(f"{args.template}: nothing given for {', '.join(set(left))}")
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True, help="the program's name as users type it")
    ap.add_argument("--exe", required=True, help="the built program")
    ap.add_argument("--runner", action="append", default=[],
                    help="a command (word by word) that runs the program, e.g. an emulator")
    ap.add_argument("--empty-config", default="",
                    help="run --help with an empty --config; the page names this path instead")
    ap.add_argument("--define", action="append", default=[], help="KEY=VALUE for @KEY@")
    args = ap.parse_args(argv)
    try:
        cli_docs.write(args.out, make_page(args))
    except cli_docs.HelpError as e:
        print(f"make_page: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
