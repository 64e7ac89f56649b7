"""The generated bash and zsh completion of engramctl and engramd: bash, running the completion
function, offers every subcommand and every flag that the programs' own --help lists (read here
with a parser of this test's, not the generator's); zsh accepts the files and they name them."""

import re
import shlex
import shutil
import subprocess

import pytest

from conftest import build_dir, program, run

FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def help_text(exe, *args):
    r = run([exe, *args, "--help"])
    assert r.returncode == 0, r.stderr
    return r.stdout


def help_flags(text):
    """Flags in the name column of option lines ("  -q,--quiet ...", "  --rows TEXT ...")."""
    flags = set()
    for line in text.splitlines():
        m = re.match(r"^  (-[^\s]+)", line)
        if m:
            flags |= {n for n in m.group(1).split(",") if n.startswith("--")}
    return flags


def help_subcommands(text):
    block = text.split("Subcommands:", 1)[1]
    return {m.group(1) for m in re.finditer(r"(?m)^  (\S+)", block)}


def completion_file(kind, name):
    folder = build_dir() / "tools" / "completion"
    path = folder / (name if kind == "bash" else "_" + name)
    if not path.is_file():
        pytest.fail(f"{path} was not generated (is python3 there; a cross build without qemu?)")
    return path


def bash_complete(name, words):
    """COMPREPLY of the generated completion for the command line `words` (the last is the word
    being completed)."""
    script = (f"source {completion_file('bash', name)}\n"
              f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
              f"COMP_CWORD={len(words) - 1}\n"
              f"_{name.replace('-', '_')}\n"
              "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_bash_offers_every_engramctl_subcommand_and_flag():
    ctl = program("ENGRAMCTL")
    subcommands = help_subcommands(help_text(ctl))
    assert {"status", "tables", "stats", "hash", "rows", "warm", "load"} <= subcommands
    assert bash_complete("engramctl", ["engramctl", ""]) == subcommands
    assert bash_complete("engramctl", ["engramctl", "st"]) == {
        s for s in subcommands if s.startswith("st")}
    assert bash_complete("engramctl", ["engramctl", "--"]) == help_flags(help_text(ctl))
    for sub in sorted(subcommands):
        flags = help_flags(help_text(ctl, sub))
        assert flags, sub
        offered = bash_complete("engramctl", ["engramctl", "--json", sub, "--"])
        assert flags <= offered, (sub, flags - offered)
        assert offered <= flags | {"--help"}, (sub, offered - flags)


def test_bash_completes_values(tmp_path):
    ctl = program("ENGRAMCTL")
    (tmp_path / "engramd.sock").touch()
    # A path after --socket: file names; a number after --layer: nothing to offer.
    got = bash_complete("engramctl", ["engramctl", "status", "--socket", f"{tmp_path}/eng"])
    assert got == {f"{tmp_path}/engramd.sock"}
    assert "--layer" in help_flags(help_text(ctl, "hash"))
    assert bash_complete("engramctl", ["engramctl", "hash", "--layer", ""]) == set()


def test_bash_offers_every_engramd_flag():
    flags = help_flags(help_text(program("ENGRAMD")))
    assert {"--model", "--check-config", "--memory-budget", "--tier", "--pace"} <= flags
    assert bash_complete("engramd", ["engramd", "--"]) == flags
    assert bash_complete("engramd", ["engramd", "--no-"]) == {
        f for f in flags if f.startswith("--no-")}


@pytest.mark.parametrize("name", ["engramctl", "engramd"])
def test_zsh_files_parse_and_name_every_flag(name):
    path = completion_file("zsh", name)
    text = path.read_text()
    assert text.startswith(f"#compdef {name}\n")
    exe = program("ENGRAMCTL" if name == "engramctl" else "ENGRAMD")
    top = help_text(exe)
    expected = help_flags(top)
    if name == "engramctl":
        for sub in help_subcommands(top):
            assert re.search(rf"^\s+'{sub}:", text, re.M), sub
            assert re.search(rf"^\s+{sub}\) _arguments", text, re.M), sub
            expected |= help_flags(help_text(exe, sub))
    missing = [f for f in expected if f"'*{f}" not in text and f"){f}[" not in text]
    assert not missing
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed: the file's syntax is not checked")
    r = run([zsh, "-n", path])
    assert r.returncode == 0, r.stderr
