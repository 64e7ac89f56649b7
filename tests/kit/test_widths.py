"""Everything the programs print for a terminal fits 80 columns: every --help (engramd, engramctl
and each of its subcommands, the tools), and every listing of engramctl (status, stats, stats -w,
tables, clients, config, hash, rows) run against a real engramd serving a resident and a
cache-tier table while a client is connected."""

import signal
import subprocess
import time

import pytest

from conftest import build_dir, program, run

COLUMNS = 80
NAME = "a-client-name-as-long-as-allowed"[:31]  # engramd keeps 31 characters of a name
TOOLS = {"engram-synth": "tools/tables/engram-synth", "engram-pack": "tools/tables/engram-pack",
         "engram-inspect": "tools/tables/engram-inspect", "engram-demo": "tools/demo/engram-demo",
         "engram-soak": "tools/soak/engram-soak"}


def too_wide(text):
    """The lines of `text` wider than COLUMNS characters (code points, as a terminal shows them),
    with their widths."""
    return [(len(line), line) for line in text.splitlines() if len(line) > COLUMNS]


def help_text(exe, *args):
    r = run([exe, *args, "--help"])
    assert r.returncode == 0, r.stderr
    return r.stdout


def subcommands(ctl):
    top = help_text(ctl)
    lines = top.split("Subcommands:", 1)[1].splitlines()
    return [line.split()[0] for line in lines if line.startswith("  ") and line[2] != " "]


def test_the_check_can_fail():
    assert too_wide("x" * 81) and not too_wide("x" * 80 + "\n" + "é" * 80)


def test_every_help_fits():
    ctl = program("ENGRAMCTL")
    helps = {"engramd": help_text(program("ENGRAMD")), "engramctl": help_text(ctl)}
    subs = subcommands(ctl)
    assert {"status", "stats", "tables", "clients", "hash", "rows", "config"} <= set(subs)
    for sub in subs:
        helps[f"engramctl {sub}"] = help_text(ctl, sub)
    for name, path in TOOLS.items():
        helps[name] = help_text(build_dir() / path)
    wide = {name: too_wide(text) for name, text in helps.items() if too_wide(text)}
    assert not wide


@pytest.fixture(scope="module")
def client(daemon):
    """A connected session that gathered from both tables (a cache-tier and a resident one), so
    that every listing has a session and counters to show."""
    import engram
    with engram.Client(daemon.socket, client_name=NAME) as c:
        for layer in (1, 14):
            for rows in ([0, 1, 2, 1000], [3, 4, 5, 1000, 16000]):
                c.release(c.gather(layer, rows, array="numpy"))
        yield c


@pytest.mark.parametrize("args", [["status"], ["stats"], ["tables"], ["clients"], ["config"],
                                  ["rows", "14", "0", "1"],
                                  ["rows", "1", "0", "1000", "--dequant"]])
def test_every_listing_fits(daemon, client, args):
    r = daemon.ctl(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") >= 2
    assert not too_wide(r.stdout), r.stdout


def test_wide_listings_are_only_on_request(daemon, client):
    """-o wide adds what the 80 columns leave out (the slots) and prints names whole."""
    narrow, wide = daemon.ctl("clients"), daemon.ctl("clients", "-o", "wide")
    assert narrow.returncode == 0 and wide.returncode == 0
    assert "SLOTS" not in narrow.stdout and "SLOTS" in wide.stdout and NAME in wide.stdout


def watched(daemon, seconds):
    """engramctl stats -w's output over `seconds`, stopped with Ctrl-C (stdout is no terminal:
    it fits 80 by 24)."""
    p = subprocess.Popen([program("ENGRAMCTL"), "stats", "-w", "-i", "0.2", "--socket",
                          daemon.socket], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 0, err
    return out


def test_stats_watch_fits_and_shows_each_tier_its_own_hits(daemon, client):
    out = watched(daemon, 1.0)
    assert not too_wide(out), out
    frame = out.split("engramd stats:")[-1]
    header = next(line for line in frame.splitlines() if line.lstrip().startswith("LAYER"))
    assert "NOWAIT" not in header and {"TIER", "HIT", "MISS/S"} <= set(header.split())
    tiers = {line.split()[0]: line.split()[1] for line in frame.splitlines()
             if line.split() and line.split()[0] in ("1", "14")}
    assert tiers == {"1": "cache", "14": "resident"}
    # The cache-tier table's HIT is its row cache's: the gathers above hit rows 1000 (and
    # 0..2 of the first) again, so it is above 0, which its NOWAIT share (no NOWAIT pass on
    # O_DIRECT misses) never is.
    cache_line = next(line for line in frame.splitlines() if line.split()[:2] == ["1", "cache"])
    hit = cache_line.split()[header.split().index("HIT")]
    assert hit.endswith("%") and float(hit[:-1]) > 0, cache_line


def test_hash_fits(hashable_model):
    r = run([program("ENGRAMCTL"), "hash", "--model", hashable_model, "--layer", "14",
             *range(5, 40, 3)])
    assert r.returncode == 0, r.stderr
    assert not too_wide(r.stdout), r.stdout
    # Every head's row is printed: 24 per position.
    positions = r.stdout.split("\n", 2)[2]
    assert len(positions.split()) == 12 * (3 + 24)
