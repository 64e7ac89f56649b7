#!/usr/bin/env python3
"""Writes shell completion (bash, zsh) for a CLI11 program, from the program's own --help and
each subcommand's --help, so that it describes the binary that was built and cannot fall behind
its flags. man/make_page.py reads the help with the functions here too.

    cli_docs.py --name engramctl --exe build/tools/engramctl/engramctl \\
        [--runner qemu-aarch64-static] [--bash OUT] [--zsh OUT]

--runner runs the program (a cross build's emulator). The help format read is CLI11's: sections
"Positionals:", "Options:" (or an option group's name), "Subcommands:"; an entry's name and
type in the first 30 columns, its description after them or on the next lines.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

COLUMN = 30  # CLI11's column width: descriptions start here
VALUE_TYPE = re.compile(r"^[A-Z][A-Z0-9_]*")
CHOICES = re.compile(r":\{([^}]*)\}")


class HelpError(Exception):
    """The program's help could not be run or read; the message names the command."""


NUMBER_TYPES = {"N", "INT", "UINT", "FLOAT", "NUMBER", "ID", "SIZE", "SECONDS"}


class Option:
    def __init__(self, names, value_type, choices, description):
        self.names = names  # e.g. ["-q", "--quiet"]
        self.value_type = value_type  # e.g. "TEXT", "UINT"; "" for a flag
        self.choices = choices  # values the option accepts, when the help lists them
        self.description = description

    @property
    def takes_value(self):
        return bool(self.value_type)

    @property
    def number(self):
        return self.value_type in NUMBER_TYPES


class Command:
    def __init__(self, name, description=""):
        self.name = name
        self.description = description
        self.options = []
        self.subcommands = []  # Command, for the top level
        self.positionals = []  # names


def run_help(runner, exe, args):
    command = [*runner, exe, *args, "--help"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HelpError(f"cannot run {' '.join(command)}: {e}") from e
    if out.returncode != 0:
        raise HelpError(f"{' '.join(command)} exited with {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def entries(lines):
    """(head, description) of each entry of a section. CLI11 pads a head (names and type) to
    COLUMN columns and writes the description after it; a head too long for that takes the
    whole line, and the description follows on lines indented COLUMN spaces (as do the further
    lines of a description that has several)."""
    out = []
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith(" " * COLUMN) and out:
            head, desc = out[-1]
            out[-1] = (head, (desc + " " + line.strip()).strip())
        elif len(line) > COLUMN and (line[COLUMN - 2:COLUMN] == "  " or (
                line[COLUMN - 1] == " " and not following.startswith(" " * COLUMN))):
            out.append((line[:COLUMN].strip(), line[COLUMN:].strip()))
        else:
            out.append((line.strip(), ""))
    return out


def sections(text):
    """{section title: its lines}: a title is a line at column 0 that ends in ':'; the section
    runs over the indented lines after it, until the next line at column 0."""
    found, current = {}, None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            current = line.rstrip()[:-1] if line.rstrip().endswith(":") else None
            if current is not None:
                found.setdefault(current, [])
        elif current is not None:
            found[current].append(line)
    return found


def parse_option(head, description):
    names_field, _, type_field = head.partition(" ")
    names = [n for n in names_field.split(",") if n.startswith("-")]
    type_field = type_field.strip()
    m = VALUE_TYPE.match(type_field)
    value_type = m.group(0) if m and m.group(0) != "REQUIRED" else ""
    choices = []
    m = CHOICES.search(type_field)
    if m:
        choices = [c.strip() for c in m.group(1).split(",") if c.strip()]
    return Option(names, value_type, choices, description)


def parse_help(name, text):
    """A Command from CLI11 --help text (subcommands named, not yet read)."""
    command = Command(name)
    for title, lines in sections(text).items():
        if title == "Subcommands":
            command.subcommands = [Command(h.split()[0], d) for h, d in entries(lines)]
        elif title == "Positionals":
            command.positionals = [h.split()[0] for h, _ in entries(lines)]
        else:
            command.options += [parse_option(h, d) for h, d in entries(lines)
                                if h.startswith("-")]
    if not command.options:
        raise HelpError(f"{name} --help lists no options: not CLI11 help text?\n{text}")
    return command


def read_program(name, runner, exe):
    """The program's options and subcommands, each subcommand with its own options."""
    top = parse_help(name, run_help(runner, exe, []))
    for sub in top.subcommands:
        parsed = parse_help(f"{name} {sub.name}", run_help(runner, exe, [sub.name]))
        sub.options, sub.positionals = parsed.options, parsed.positionals
    return top


# ---- bash ----------------------------------------------------------------------------------

def bash_words(options):
    words = " ".join(n for o in options for n in o.names)
    valued = " ".join(n for o in options if o.takes_value for n in o.names)
    return words, valued


def bash_value_arms(options):
    """case arms for the values of options whose help lists them (those), or that take a
    number (nothing to offer); any other value is completed as a file name."""
    arms, seen = [], set()
    for o in options:
        names = [n for n in o.names if n not in seen]
        seen.update(names)
        if not names or not (o.choices or o.number):
            continue
        reply = f"$(compgen -W '{' '.join(o.choices)}' -- \"$cur\")" if o.choices else ""
        arms.append(f"      {'|'.join(names)}) COMPREPLY=({reply}); return ;;")
    return arms


def write_bash(program, out):
    fn = "_" + re.sub(r"\W", "_", program.name)
    subs = " ".join(s.name for s in program.subcommands)
    words, valued = bash_words(program.options)
    lines = [
        f"# bash completion for {program.name}: generated from `{program.name} --help`"
        + (" and each subcommand's --help" if subs else "")
        + " by tools/completion/cli_docs.py when it was built.",
        f"{fn}() {{",
        '  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}',
        f"  local sub= opts='{words}' valued=' {valued} ' i",
    ]
    if subs:
        lines += ["  for ((i = 1; i < COMP_CWORD; i++)); do",
                  "    case ${COMP_WORDS[i]} in",
                  f"      {'|'.join(s.name for s in program.subcommands)}) "
                  "sub=${COMP_WORDS[i]}; break ;;",
                  "    esac",
                  "  done",
                  "  case $sub in"]
        for s in program.subcommands:
            w, v = bash_words(s.options)
            lines.append(f"    {s.name}) opts='{w}' valued=' {v} ' ;;")
        lines.append("  esac")
    lines.append("  if [[ $valued == *\" $prev \"* ]]; then")
    arms = bash_value_arms(program.options + [o for s in program.subcommands for o in s.options])
    if arms:
        lines += ["    case $prev in", *arms, "    esac"]
    lines += ["    COMPREPLY=($(compgen -f -- \"$cur\"))",
              "    return",
              "  fi",
              "  if [[ $cur == -* ]]; then",
              "    COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))"]
    if subs:
        lines += ["  elif [[ -z $sub ]]; then",
                  f"    COMPREPLY=($(compgen -W '{subs}' -- \"$cur\"))"]
    lines += ["  else",
              "    COMPREPLY=($(compgen -f -- \"$cur\"))",
              "  fi",
              "}",
              f"complete -o filenames -F {fn} {program.name}",
              ""]
    write(out, "\n".join(lines))


# ---- zsh -----------------------------------------------------------------------------------

def zsh_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def zsh_desc(text):
    """An _arguments description: its first sentence, brackets and colons escaped."""
    text = re.split(r"\.\s+(?=[A-Z])", text)[0]
    return re.sub(r"([\[\]:\\])", r"\\\1", text)


def zsh_option_specs(options):
    specs = []
    for o in options:
        for n in o.names:
            if n in ("-h", "--help"):
                specs.append(zsh_quote(f"(- *){n}[{zsh_desc(o.description)}]"))
                continue
            spec = f"*{n}" + ("=" if o.takes_value and n.startswith("--") else "")
            spec += f"[{zsh_desc(o.description)}]"
            if o.takes_value:
                action = (f"({' '.join(o.choices)})" if o.choices
                          else " " if o.number else "_files")
                spec += f":{n.lstrip('-')}:{action}"
            specs.append(zsh_quote(spec))
    return specs


def write_zsh(program, out):
    fn = "_" + re.sub(r"\W", "_", program.name)
    lines = [f"#compdef {program.name}",
             f"# zsh completion for {program.name}: generated from `{program.name} --help`"
             + (" and each subcommand's --help" if program.subcommands else "")
             + " by tools/completion/cli_docs.py when it was built.",
             "",
             f"{fn}() {{"]
    specs = zsh_option_specs(program.options)
    if not program.subcommands:
        lines += ["  _arguments -s \\", *[f"    {s} \\" for s in specs], "    '*:file:_files'", "}"]
    else:
        lines += ["  local context state state_descr line",
                  "  typeset -A opt_args",
                  "  local -a subcommands",
                  "  subcommands=("]
        lines += [f"    {zsh_quote(s.name + ':' + s.description.replace(':', ' '))}"
                  for s in program.subcommands]
        lines += ["  )",
                  "  _arguments -C \\", *[f"    {s} \\" for s in specs],
                  "    '1: :->command' \\",
                  "    '*:: :->arguments'",
                  "  case $state in",
                  f"    command) _describe -t commands {zsh_quote(program.name + ' command')} "
                  "subcommands ;;",
                  "    arguments)",
                  "      case $words[1] in"]
        for s in program.subcommands:
            sub_specs = zsh_option_specs(s.options)
            lines += [f"        {s.name}) _arguments -s \\",
                      *[f"            {x} \\" for x in sub_specs],
                      "            '*:argument:_files' ;;"]
        lines += ["      esac ;;", "  esac", "}"]
    lines += ["", f'{fn} "$@"', ""]
    write(out, "\n".join(lines))


def write(path, text):
    """Atomically, so that a failed run leaves no half-written output for the build to keep."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".cli_docs.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="the program's name as users type it")
    ap.add_argument("--exe", required=True, help="the built program")
    ap.add_argument("--runner", action="append", default=[],
                    help="a command (word by word) that runs the program, e.g. an emulator")
    ap.add_argument("--bash", help="bash completion file to write")
    ap.add_argument("--zsh", help="zsh completion file to write")
    args = ap.parse_args(argv)
    try:
        program = read_program(args.name, args.runner, args.exe)
        if args.bash:
            write_bash(program, args.bash)
        if args.zsh:
            write_zsh(program, args.zsh)
    except HelpError as e:
        print(f"cli_docs: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
