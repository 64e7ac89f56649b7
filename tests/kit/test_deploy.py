"""deploy/: the Grafana dashboard and the Prometheus alert rules use only metrics a running
engramd exports (scraped while a client gathers, with resident and cached tables), the rules are
well formed and behave as their unit tests say (promtool where installed), the scrape and the
textfile pass `promtool check metrics`, and the example configurations pass
`engramd --check-config` with their model pointed at a synthetic one."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest
import yaml

from conftest import REPO, Daemon, program, run

DEPLOY = REPO / "deploy"
METRIC = re.compile(r"\bengram_[a-z0-9_]+")
# Families that exist only where engramd finds its memory cgroup (the memory.high and pressure
# ones only under cgroup v2): absent from this machine's scrape, they are checked against their
# definitions instead.
CGROUP_ONLY = re.compile(r"^engram_memory_cgroup_")
# Families only the textfile carries (when it was written): test_the_textfile_says_when_it_was_
# written reads them from a real one; here they are checked against their definitions.
TEXTFILE_ONLY = re.compile(r"^engram_textfile_")


def dashboard_exprs():
    doc = json.loads((DEPLOY / "grafana" / "engramd-dashboard.json").read_text())
    exprs = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            exprs.append((panel["title"], target["expr"]))
    for variable in doc["templating"]["list"]:
        if "definition" in variable:
            exprs.append((f"variable {variable['name']}", variable["definition"]))
    return doc, exprs


def alert_rules():
    doc = yaml.safe_load((DEPLOY / "prometheus" / "engramd-alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def scraped_names(daemon):
    """Sample names of engramd's exposition while a client that gathered from both tables is
    connected (its per-client series exist only then)."""
    import engram
    with engram.Client(daemon.socket) as client:
        for layer in (1, 14):
            client.release(client.gather(layer, [0, 1, 2, 1000], array="numpy"))
        r = daemon.ctl("metrics")
    assert r.returncode == 0, r.stderr
    return {line.split("{")[0].split(" ")[0] for line in r.stdout.splitlines()
            if line and not line.startswith("#")}, r.stdout


def defined_cgroup_names():
    source = (REPO / "daemon" / "ops" / "cgroup_memory.cc").read_text()
    names = set(METRIC.findall(source))
    return names | {n + suffix for n in names for suffix in ("_bucket", "_sum", "_count")}


def defined_textfile_names():
    return set(METRIC.findall((REPO / "daemon" / "ops" / "metrics.cc").read_text()))


def check_names(used, exported, exposition):
    missing = []
    for where, name in sorted(used):
        if name in exported:
            continue
        if CGROUP_ONLY.match(name) and name in defined_cgroup_names():
            continue  # not exported in this machine's cgroup setup: the definition vouches
        if TEXTFILE_ONLY.match(name) and name in defined_textfile_names():
            continue  # in the textfile only
        missing.append(f"{where}: {name}")
    assert not missing, ("metrics engramd does not export:\n  " + "\n  ".join(missing)
                         + "\n--- the scrape ---\n" + exposition)


def test_dashboard_panels_cover_the_operator_questions():
    doc, exprs = dashboard_exprs()
    titles = " | ".join(p["title"] for p in doc["panels"])
    for needed in ("up", "Requests per second", "Rows per second", "p50 / p99", "hit rate",
                   "against the budget", "Memory pressure", "load progress", "Errors",
                   "by client"):
        assert needed.lower() in titles.lower(), needed
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert all(METRIC.search(e) for _, e in exprs)


def test_counting_panels_show_zero_not_no_data():
    """A count() of nothing is no series at all: Grafana shows "No data" where 0 is meant."""
    _, exprs = dashboard_exprs()
    counts = [(title, e) for title, e in exprs if e.startswith("count(")]
    assert counts
    for title, expr in counts:
        assert expr.endswith("or vector(0)"), f"{title}: {expr}"


def test_alert_rules_are_well_formed():
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for wanted in ("EngramdDown", "EngramdTextfileStale", "EngramdNowaitHitRateFalling",
                   "EngramdMemoryPressure", "EngramdResidentLoadStalled", "EngramdSlowSteps"):
        assert wanted in names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert METRIC.search(rule["expr"]), rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


def test_promtool_accepts_the_rules():
    promtool = promtool_or_skip()
    r = run([promtool, "check", "rules", DEPLOY / "prometheus" / "engramd-alerts.yml"])
    assert r.returncode == 0, r.stdout + r.stderr


def promtool_or_skip():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: prometheus, which tools/setup.sh "
                    "installs); the YAML and metric names are checked by the other tests")
    return promtool


def test_promtool_unit_tests_of_the_rules():
    """tests/kit/engramd-alerts.test.yml: a killed engramd's textfile, a clean stop's, slow
    decode steps, and prefill chunks and demo traffic that must not page."""
    promtool = promtool_or_skip()
    r = run([promtool, "test", "rules", "engramd-alerts.test.yml"], cwd=REPO / "tests" / "kit")
    assert r.returncode == 0, r.stdout + r.stderr


def promtool_check_metrics(promtool, text):
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + "\n--- the exposition ---\n" + text


def test_the_scrape_passes_promtool_check_metrics(daemon):
    promtool = promtool_or_skip()
    promtool_check_metrics(promtool, scraped_names(daemon)[1])


def test_the_lint_can_fail():
    promtool = promtool_or_skip()
    with pytest.raises(AssertionError, match="nanoseconds"):
        promtool_check_metrics(promtool, "# HELP engram_wait_nanoseconds_total w\n"
                               "# TYPE engram_wait_nanoseconds_total counter\n"
                               "engram_wait_nanoseconds_total 1\n")


def samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = value
    return out


def test_process_start_time_is_to_the_second(daemon):
    """process_start_time_seconds against /proc: %.9g put it up to 5 s off."""
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    with open(f"/proc/{daemon.process.pid}/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    started = btime + start_ticks / os.sysconf("SC_CLK_TCK")
    value = samples(scraped_names(daemon)[1])["process_start_time_seconds"]
    assert abs(float(value) - started) < 0.02, (value, started)


def wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_textfile_says_when_it_was_written(hashable_model, tmp_path):
    """The textfile passes promtool check metrics, and carries the time it was written, which
    stops when engramd is killed (what EngramdTextfileStale watches)."""
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    prom = textfile_dir / "engramd.prom"
    d = Daemon(tmp_path, ["--model", hashable_model, "--metrics-textfile-dir", textfile_dir])
    try:
        wait_for(prom.exists, "engramd.prom was not written")
        text = prom.read_text()
        written = float(samples(text)["engram_textfile_written_timestamp_seconds"])
        assert abs(written - time.time()) < 30, written
        assert samples(text)["engram_textfile_interval_seconds"] == "15"
        assert samples(text)["engram_up"] == "1"
        if shutil.which("promtool"):
            promtool_check_metrics(shutil.which("promtool"), text)
        d.process.send_signal(signal.SIGKILL)
        d.process.wait()
        # Killed, it wrote no last file: up still 1, the written time no longer moves.
        assert samples(prom.read_text())["engram_up"] == "1"
    finally:
        d.stop()


def test_every_metric_used_is_exported(daemon):
    exported, exposition = scraped_names(daemon)
    used = {(title, name) for title, expr in dashboard_exprs()[1] for name in METRIC.findall(expr)}
    used |= {(rule["alert"], name) for rule in alert_rules()
             for name in METRIC.findall(rule["expr"])}
    assert len({n for _, n in used}) >= 30
    check_names(used, exported, exposition)


def test_the_name_check_can_fail(daemon):
    exported, exposition = scraped_names(daemon)
    for typo in ("engram_gather_rows_totl", "engram_memory_cgroup_pressure_avg10"):
        with pytest.raises(AssertionError, match=typo):
            check_names({("typo", typo)}, exported, exposition)


def mem_total():
    """This machine's MemTotal, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


@pytest.mark.parametrize("name", ["h200-tp4.toml", "dgx-spark.toml"])
def test_example_config_passes_check_config(name, hashable_model, tmp_path):
    text = (DEPLOY / "examples" / name).read_text()
    pointed, n = re.subn(r'(?m)^models = \[.*\]$', f'models = ["{hashable_model}"]', text)
    assert n == 1, "the example names its model on one 'models = [...]' line"
    config = tmp_path / name
    config.write_text(pointed)
    # A socket of its own: the check refuses a socket directory this user cannot make, as a
    # start would.
    socket = ["--socket", str(tmp_path / "engramd.sock")]
    r = run([program("ENGRAMD"), "--check-config", "--config", config, *socket])
    budget = int(re.search(r'(?m)^budget = "(\d+)G"', text).group(1)) << 30
    if budget > mem_total():
        # A budget larger than this machine is refused, naming the machine's memory; the rest of
        # the example is checked with a budget this machine has.
        assert r.returncode != 0 and "MemTotal" in r.stdout + r.stderr, r.stdout + r.stderr
        fits = max(1, mem_total() // 4 >> 30)
        config.write_text(re.sub(r'(?m)^budget = ".*"$', f'budget = "{fits}G"', pointed))
        r = run([program("ENGRAMD"), "--check-config", "--config", config, *socket])
    assert r.returncode == 0, r.stdout + r.stderr
    tier = re.search(r'(?m)^tier = "(\w+)"', text).group(1)
    assert tier in r.stdout, r.stdout


def test_check_config_refuses_a_bad_example(hashable_model, tmp_path):
    """The check above can fail: a key engramd does not know is refused, naming it."""
    config = tmp_path / "bad.toml"
    config.write_text(f'[tables]\nmodels = ["{hashable_model}"]\nteir = "cache"\n')
    r = run([program("ENGRAMD"), "--check-config", "--config", config])
    assert r.returncode != 0 and "tables.teir" in r.stdout + r.stderr


def test_operations_md_lists_the_kit():
    text = (REPO / "docs" / "operations.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != "meson.build":
            installed = "/usr/share/engramd/" + str(path.relative_to(DEPLOY))
            assert installed in text, installed


def test_no_per_session_labels_or_retired_names():
    """Per-client series are keyed by the client name only (a session label would multiply them
    on every reconnect); shares are ratios; the row store's budget is the split's piece."""
    exprs = [e for _, e in dashboard_exprs()[1]] + [r["expr"] for r in alert_rules()]
    for expr in exprs:
        assert "session" not in expr, expr
        assert "avg10" not in expr, expr
        assert "engram_store_budget_bytes" not in expr, expr
