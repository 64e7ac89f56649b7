"""The man pages help2man made from the built programs: every flag of engramd's and engramctl's
--help is on its page, every engramctl subcommand has a section with its own flags, no path of
the build machine leaks into a page, and man renders each page."""

import re
import shutil
import subprocess

import pytest

from conftest import build_dir, program, run

PAGES = {"engramd": "8", "engramctl": "1", "engram-synth": "1", "engram-pack": "1",
         "engram-inspect": "1"}


def page(name):
    path = build_dir() / "man" / f"{name}.{PAGES[name]}"
    if not path.is_file():
        if shutil.which("help2man") is None:
            pytest.skip("help2man is not installed (tools/setup.sh installs it): no man pages")
        pytest.fail(f"{path} was not made although help2man is installed")
    return path


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
    return found


def roff(flag):
    return flag.replace("-", "\\-")


def rendered(path):
    """The page as man renders it, with groff's warnings."""
    r = subprocess.run(["man", "--warnings", "-l", str(path)], capture_output=True, text=True,
                       timeout=60, env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin",
                                        "MAN_KEEP_FORMATTING": "0"})
    assert r.returncode == 0, r.stderr
    return re.sub(r".\x08", "", r.stdout), r.stderr  # overstrike bold, when man keeps it


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_is_well_formed_and_names_no_build_path(name):
    text = page(name).read_text()
    assert re.search(rf'^\.TH {name.upper()} "{PAGES[name]}"', text, re.M), text[:400]
    assert str(build_dir()) not in text and "/tmp/" not in text
    assert re.search(r"^\.SH NAME\n" + re.escape(name) + r" \\- \w", text, re.M), text[:600]
    if shutil.which("man") is None:
        return
    out, warnings = rendered(page(name))
    assert "NAME" in out and not warnings.strip(), warnings


def test_engramd_page_has_every_flag_and_the_config_file():
    text = page("engramd").read_text()
    expected = flags(help_text(program("ENGRAMD")))
    assert {"--model", "--check-config", "--memory-budget"} <= expected
    missing = [f for f in expected if roff(f) not in text]
    assert not missing
    # --help ran with an empty configuration file in place of the system's: the defaults shown
    # are engramd's own, and the page names the file engramd reads without --config (the
    # build's sysconfdir), in its synopsis of --config and under FILES.
    default = re.search(r"--config PATH=(\S+)", help_text(program("ENGRAMD"))).group(1)
    assert default.endswith("/engramd/engramd.toml")
    assert text.count(default) >= 2, default
    assert "SIGHUP" in text and "/usr/share/engramd/" in text


def test_engramctl_page_has_every_subcommand_with_its_flags():
    text = page("engramctl").read_text()
    ctl = program("ENGRAMCTL")
    top = help_text(ctl)
    subcommands = re.findall(r"(?m)^  (\S+)", top.split("Subcommands:", 1)[1])
    assert len(subcommands) >= 8
    sections = re.split(r'(?m)^\.SS "engramctl ', text)
    by_name = {s.split('"', 1)[0]: s for s in sections[1:]}
    assert sorted(by_name) == sorted(subcommands)
    for sub in subcommands:
        missing = [f for f in flags(help_text(ctl, sub)) if roff(f) not in by_name[sub]]
        assert not missing, (sub, missing)
    assert "EXIT STATUS" in text and "ENGRAM_SOCKET" in text
