# Fixtures for the engram package's tests: a synthetic checkpoint, a real engramd serving it, and
# the checkpoint's rows read straight from its safetensors shards (independent of the C++ code).
#
# Programs and libraries are found through, in order: $ENGRAMD / $ENGRAM_SYNTH (the programs),
# $ENGRAM_BIN_DIR (a folder with both), $ENGRAM_BUILD_DIR (a meson build folder), the newest
# build*/ folder of this source tree. $ENGRAM_LIB_DIR is added to the programs' library path
# (a bundle of built libraries on a machine without our -dev packages).
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import engram  # noqa: E402

SYNTH_ROWS = 4096
SYNTH_SEED = 7
LAYERS = (1, 14)


def _find_program(name, env_var, build_subdir):
    explicit = os.environ.get(env_var)
    if explicit:
        return pathlib.Path(explicit)
    bin_dir = os.environ.get("ENGRAM_BIN_DIR")
    if bin_dir:
        return pathlib.Path(bin_dir) / name
    build_dir = os.environ.get("ENGRAM_BUILD_DIR")
    builds = [pathlib.Path(build_dir)] if build_dir else sorted(REPO.glob("build*"))
    found = [b / build_subdir / name for b in builds if (b / build_subdir / name).is_file()]
    if not found:
        pytest.fail(f"{name} not found: build it (ninja -C BUILD {build_subdir}/{name}) or set "
                    f"${env_var}, $ENGRAM_BIN_DIR or $ENGRAM_BUILD_DIR")
    return max(found, key=lambda p: p.stat().st_mtime)


def program_env():
    env = dict(os.environ)
    lib_dir = os.environ.get("ENGRAM_LIB_DIR")
    if lib_dir:
        env["LD_LIBRARY_PATH"] = lib_dir + (":" + env["LD_LIBRARY_PATH"]
                                            if env.get("LD_LIBRARY_PATH") else "")
    return env


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("checkpoint") / "model"
    synth = _find_program("engram-synth", "ENGRAM_SYNTH", "tools/tables")
    subprocess.run([str(synth), str(out), "--rows", str(SYNTH_ROWS), "--seed", str(SYNTH_SEED),
                    "-q"], check=True, env=program_env(), timeout=120)
    return out


def read_engram_tables(model_dir):
    """{layer: (weight uint8 [N, 256], scale uint8 [N, 8])} read from the safetensors shards."""
    model_dir = pathlib.Path(model_dir)
    weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    tables = {}
    for layer in LAYERS:
        parts = []
        for suffix, dtype, width in (("weight", "F8_E4M3", 256), ("scale", "F8_E8M0", 8)):
            name = f"layers.{layer}.engram.embed.{suffix}"
            path = model_dir / weight_map[name]
            with open(path, "rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(header_len))
            entry = header[name]
            assert entry["dtype"] == dtype and entry["shape"][1] == width, entry
            begin, end = entry["data_offsets"]
            data = np.fromfile(path, dtype=np.uint8, count=end - begin,
                               offset=8 + header_len + begin)
            parts.append(data.reshape(entry["shape"]))
        tables[layer] = tuple(parts)
    return tables


@pytest.fixture(scope="session")
def tables(checkpoint):
    return read_engram_tables(checkpoint)


@pytest.fixture(scope="session")
def expected_rows(tables):
    """expected_rows(layer, ids) -> uint8 [n, 264] as the checkpoint holds them."""
    def rows(layer, ids):
        weight, scale = tables[layer]
        ids = np.asarray(ids, dtype=np.int64)
        return np.concatenate([weight[ids], scale[ids]], axis=1)
    return rows


class Daemon:
    """engramd serving `model_dir` on `folder`/engramd.sock, logging to `folder`/engramd.log."""

    def __init__(self, model_dir, folder, extra_args=()):
        self.socket = str(folder / "engramd.sock")
        self.log_path = log_path = folder / "engramd.log"
        engramd = _find_program("engramd", "ENGRAMD", "daemon")
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [str(engramd), "--model", str(model_dir), "--socket", self.socket,
             "--log-level", "warning", "--workers", "2", *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, env=program_env())
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"engramd exited with {self.process.returncode}: "
                                   f"{pathlib.Path(log_path).read_text()}")
            try:
                engram.Client(self.socket, timeout=2).close()
                return
            except engram.EngramConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def engramctl_json(daemon, command):
    """`engramctl COMMAND --json` against `daemon`, parsed."""
    engramctl = _find_program("engramctl", "ENGRAMCTL", "tools/engramctl")
    out = subprocess.run([str(engramctl), *command.split(), "--json", "--socket", daemon.socket],
                         check=True, capture_output=True, env=program_env(), timeout=30)
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def daemon(checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("engramd")
    d = Daemon(checkpoint, folder)
    yield d
    d.stop()


@pytest.fixture
def private_daemon(checkpoint, tmp_path):
    """A daemon of the test's own, which the test may kill."""
    d = Daemon(checkpoint, tmp_path)
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    with engram.Client(daemon.socket) as c:
        yield c


# ---- GPU tests: skipped, visibly, where the machine lacks what they need ----------------------

def gpu_skip_reason():
    import torch
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else (
            f"HIP {torch.version.hip}" if getattr(torch.version, "hip", None) else "no GPU support")
        return f"torch {torch.__version__} ({build}) sees no GPU"
    try:
        from engram import _gpu
        _gpu.Kernels()
        engram._lib.gpu_register_lib()
    except engram.EngramError as e:
        return f"the GPU libraries are not usable: {e}"
    return None


_GPU_REASON = []


@pytest.fixture(autouse=True)
def _gpu_gate(request):
    """Tests marked `gpu` skip with the reason when no GPU path exists here; with
    ENGRAM_REQUIRE_GPU=1 (on a GPU machine) that reason is a failure instead."""
    if request.node.get_closest_marker("gpu") is None:
        return
    if not _GPU_REASON:
        _GPU_REASON.append(gpu_skip_reason())
    reason = _GPU_REASON[0]
    if reason is None:
        return
    if os.environ.get("ENGRAM_REQUIRE_GPU") == "1":
        pytest.fail(f"ENGRAM_REQUIRE_GPU=1 but {reason}")
    pytest.skip(f"GPU test skipped: {reason}")


def pytest_collection_modifyitems(config, items):
    # Skip at collection, so that a machine without a GPU starts no daemon for these tests.
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or os.environ.get("ENGRAM_REQUIRE_GPU") == "1":
        return
    if not _GPU_REASON:
        _GPU_REASON.append(gpu_skip_reason())
    if _GPU_REASON[0] is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"GPU test skipped: {_GPU_REASON[0]}"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA/ROCm GPU and the engram kernel library")
    config.addinivalue_line("markers", "wheel: builds the wheel and installs it into a venv "
                                       "(meson test python-wheel)")


def pytest_sessionfinish(session, exitstatus):
    # Run by meson: a run in which everything was skipped reports 77 (meson's SKIP), not OK.
    if os.environ.get("ENGRAM_PYTEST_SKIP_EXIT") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    passed = len(reporter.stats.get("passed", []))
    skipped = len(reporter.stats.get("skipped", []))
    if exitstatus == 0 and passed == 0 and skipped > 0:
        session.exitstatus = 77
