"""bench/model/plot_model_step.py draws engram-model-step's JSON output: the kept H200 run and
a run whose cache tier is far slower than the rest (the timeline axis must stop short of it)."""

import copy
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "model" / "plot_model_step.py"
KEPT = ROOT / "bench" / "results" / "model-step-h200.json"


def plot(tmp_path, data):
    pytest.importorskip("matplotlib")
    src, out = tmp_path / "in.json", tmp_path / "out.png"
    src.write_text(json.dumps(data))
    subprocess.run([sys.executable, str(SCRIPT), str(src), str(out)], check=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return out


def test_plots_the_kept_run(tmp_path):
    plot(tmp_path, json.loads(KEPT.read_text()))


def test_a_method_far_slower_than_the_rest(tmp_path):
    data = copy.deepcopy(json.loads(KEPT.read_text()))
    for shape in data["shapes"]:
        slow = next(m for m in shape["methods"] if m["name"] == "cache half")
        for k in slow["timeline_us"]:
            slow["timeline_us"][k] *= 100
    plot(tmp_path, data)


def test_refuses_wrong_arguments():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode != 0 and "usage" in r.stderr
