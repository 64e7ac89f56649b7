"""The man pages (man/): each is a man page (NAME, SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS,
SEE ALSO; no pasted --help), every flag of its program's --help and every engramctl command is
on it, the configuration file it names is the one engramd reads, no path of the build machine
leaks into it, and man renders it within 80 columns without a warning from groff.
engramd.toml(5) lists every setting a running engramd reports, with whether a SIGHUP applies it."""

import json
import re
import shutil
import subprocess

import pytest

from conftest import build_dir, program, run

PAGES = {"engramd": "8", "engramctl": "1", "engram-synth": "1", "engram-pack": "1",
         "engram-inspect": "1", "engram-demo": "1", "engram-soak": "1", "engramd.toml": "5"}
TOOLS = {"engram-synth": "tools/tables/engram-synth", "engram-pack": "tools/tables/engram-pack",
         "engram-inspect": "tools/tables/engram-inspect", "engram-demo": "tools/demo/engram-demo",
         "engram-soak": "tools/soak/engram-soak"}


def page(name):
    path = build_dir() / "man" / f"{name}.{PAGES[name]}"
    assert path.is_file(), f"{path} was not made"
    return path.read_text()


def help_text(exe, *args):
    r = run([exe, *args, "--help"])
    assert r.returncode == 0, r.stderr
    return r.stdout


def flags(text):
    found = set()
    for line in text.splitlines():
        m = re.match(r"^  (-[^\s]+)", line)
        if m:
            found |= {n for n in m.group(1).split(",") if n.startswith("--")}
    return found - {"--help"}


def roff(text):
    return text.replace("-", "\\-")


def sections(text):
    """{".SH title": its text} of a page."""
    parts = re.split(r'(?m)^\.SH "?([^"\n]+)"?\n', text)
    return dict(zip(parts[1::2], parts[2::2]))


def rendered(text, width=80):
    """The page as man renders it at `width` columns, and groff's warnings."""
    if shutil.which("man") is None:
        pytest.skip("man is not installed (tools/setup.sh installs man-db and groff-base)")
    r = subprocess.run(["man", "--warnings", "-l", "-"], input=text, capture_output=True,
                       text=True, timeout=60,
                       env={"MANWIDTH": str(width), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                            "MAN_KEEP_FORMATTING": "0"})
    assert r.returncode == 0, r.stderr
    return re.sub(r".\x08", "", r.stdout), r.stderr


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_is_a_man_page(name):
    text = page(name)
    assert re.search(rf'^\.TH {re.escape(name.upper())} {PAGES[name]} ', text, re.M), text[:200]
    have = sections(text)
    needed = {"NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"}
    needed |= {"SETTINGS", "FILES"} if PAGES[name] == "5" else {"OPTIONS", "EXIT STATUS"}
    assert needed <= set(have), sorted(have)
    assert re.match(re.escape(name.replace("-", "\\-")) + r" \\- \w", have["NAME"]), have["NAME"]
    # Written, not pasted: no usage line or help layout, and nothing of the build machine.
    assert "Usage:" not in text and not re.search(r"(?m)^  +\\?-", text)
    assert str(build_dir()) not in text and "/tmp/" not in text and "help2man" not in text


@pytest.mark.parametrize("name", sorted(PAGES))
def test_man_renders_it_within_80_columns_without_warnings(name):
    out, warnings = rendered(page(name))
    assert "NAME" in out and not warnings.strip(), warnings
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert not wide, wide


def test_the_lint_can_fail():
    _, warnings = rendered(".TH X 1\n.SH NAME\nx \\- y\n.BOGUS\n\\fQ\n")
    assert warnings.strip()


@pytest.mark.parametrize("name", ["engramd", *sorted(TOOLS)])
def test_page_has_every_flag(name):
    exe = program("ENGRAMD") if name == "engramd" else build_dir() / TOOLS[name]
    expected = flags(help_text(exe))
    assert len(expected) >= 3
    options = sections(page(name))["OPTIONS"]
    missing = [f for f in expected if f"\\fB{roff(f)}\\fR" not in options]
    assert not missing


def test_engramd_page_names_the_file_engramd_reads():
    """--config's default is engramd's own (its --help names it: the build's sysconfdir), whole,
    in OPTIONS and under FILES; the defaults shown are engramd's, not a configuration file's."""
    text = page("engramd")
    default = re.search(r"--config PATH=(\S+)", help_text(program("ENGRAMD"))).group(1)
    assert default.endswith("/engramd/engramd.toml")
    options, files = sections(text)["OPTIONS"], sections(text)["FILES"]
    assert f"Default: {default}." in options and f".I {default}\n" in files
    assert re.search(r"\\fB\\-\\-workers\\fR \\fIN\\fR\n.*Default: \d+\.", options)
    assert "engramd.toml (5)" in sections(text)["SEE ALSO"]


def test_engramctl_page_has_every_command_with_its_flags():
    text = page("engramctl")
    ctl = program("ENGRAMCTL")
    top = help_text(ctl)
    commands = re.findall(r"(?m)^  (\S+)", top.split("Subcommands:", 1)[1])
    assert len(commands) >= 8
    body = sections(text)["COMMANDS"]
    parts = re.split(r'(?m)^\.SS "engramctl ', body)
    by_name = {s.split('"', 1)[0]: s for s in parts[1:]}
    assert sorted(by_name) == sorted(commands)
    options = sections(text)["OPTIONS"]
    for sub in commands:
        missing = [f for f in flags(help_text(ctl, sub))
                   if f"\\fB{roff(f)}\\fR" not in by_name[sub] + options]
        assert not missing, (sub, missing)
    # The options every command that talks to engramd takes are listed once, in OPTIONS.
    for common in ("--socket", "--timeout"):
        assert f"\\fB{roff(common)}\\fR" in options
        assert f"\\fB{roff(common)}\\fR" not in body
    assert "ENGRAM_SOCKET" in text


def test_settings_page_lists_every_setting_engramd_reports(daemon):
    """Every setting of engramd's table (as `engramctl config` reports them) has an entry under
    its section, saying whether a SIGHUP applies it; no entry names a setting engramd lacks."""
    r = daemon.ctl("config", "--json")
    assert r.returncode == 0, r.stderr
    settings = {s["key"]: s["live"] for s in json.loads(r.stdout)["settings"]}
    assert len(settings) > 40
    body = sections(page("engramd.toml"))["SETTINGS"]
    listed = {}
    for part in re.split(r'(?m)^\.SS "\[', body)[1:]:
        section, _, entries = part.partition("]")
        for entry in re.split(r"(?m)^\.TP\n", entries)[1:]:
            key = re.match(r"\\fB([^\\]+)\\fR", entry).group(1)
            listed[f"{section}.{key.replace(chr(92) + '-', '-')}"] = entry
    assert sorted(listed) == sorted(settings)
    for key, live in settings.items():
        assert ("A SIGHUP applies a change" in listed[key]) == live, key
    default = re.search(r"--max-clients N=(\d+)", help_text(program("ENGRAMD"))).group(1)
    assert f"(integer from 1 to" in listed["limits.max_clients"]
    assert f"default \\fB{default}\\fR" in listed["limits.max_clients"]
