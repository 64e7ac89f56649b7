"""The wheel: built by meson-python from this source tree (pyproject.toml), installed into a
fresh virtual environment, it loads its own libengram_client and gathers from engramd with
nothing pointing at the build (no ENGRAM_* variables, no PYTHONPATH, no LD_LIBRARY_PATH)."""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import SYNTH_ROWS

REPO = pathlib.Path(__file__).resolve().parents[2]


def _build_dir():
    build = os.environ.get("ENGRAM_BUILD_DIR")
    builds = [pathlib.Path(build)] if build else sorted(REPO.glob("build*"))
    builds = [b for b in builds if (b / "build.ninja").is_file()]
    return builds[0].resolve() if builds else None


def _skip_reason():
    if os.environ.get("ENGRAM_BIN_DIR"):
        return ("the programs come from a bundle ($ENGRAM_BIN_DIR): this machine has no "
                "build of the tree to make a wheel from")
    if _build_dir() is None:
        return "no meson build folder of this source tree (the wheel is built from it)"
    if importlib.util.find_spec("mesonpy") is None:
        return "meson-python is not installed (Debian: python3-mesonpy; tools/setup.sh)"
    if shutil.which("patchelf") is None:
        return "patchelf is not installed (tools/setup.sh)"
    if importlib.util.find_spec("venv") is None or importlib.util.find_spec("ensurepip") is None:
        return "the venv module with ensurepip is missing (Debian: python3-venv)"
    return None


_REASON = _skip_reason()
# Skipped at collection: no daemon or checkpoint is set up for nothing.
pytestmark = [pytest.mark.wheel,
              pytest.mark.skipif(_REASON is not None, reason=f"wheel test skipped: {_REASON}")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    build = _build_dir()
    kernels = (build / "kernels" / "libengram_kernels_cuda.so").is_file()
    # The wheel's own build folder sits inside the test build folder, so a second run only
    # relinks; the GPU kernels are built into it when the test build has them.
    settings = [f"--config-settings=builddir={build / 'python-wheel'}"]
    # One setup-args value: pip 23.0 keeps only the last of a repeated key. With the kernels, one
    # architecture: the test build has compiled them for every one already, and what this test
    # checks (the library in the wheel, found and loaded from it) is the same for any of them.
    arg = "-Dnv_sm=90" if kernels else "-Dcuda=disabled"
    settings += [f"--config-settings=setup-args={arg}"]
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                          "--no-deps", "--no-index", "-w", str(out), *settings, str(REPO)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    (found,) = out.glob("engramd_client-*.whl")
    return found, kernels


def _meson_version():
    """meson.build's project version, as `meson introspect` reads it from the build folder."""
    run = subprocess.run(["meson", "introspect", "--projectinfo", str(_build_dir())],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(run.stdout)["version"]


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ENGRAM_") and k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    folder = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(folder)],
                   check=True, timeout=300, env=_clean_env())
    python = folder / "bin" / "python"
    run = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index",
                          str(wheel[0])], capture_output=True, text=True, timeout=300,
                         env=_clean_env())
    assert run.returncode == 0, run.stdout + run.stderr
    return python


def test_wheel_holds_the_package_and_its_libraries(wheel):
    path, kernels = wheel
    # The distribution engramd-client at meson's release; no Python extension inside, so any
    # CPython 3 on a manylinux system of the building glibc or newer may install it.
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1].replace(".", "_")
    prefix = f"engramd_client-{_meson_version()}-py3-none-manylinux_{glibc}_"
    assert path.name.startswith(prefix), (path.name, prefix)
    names = zipfile.ZipFile(path).namelist()
    wheel_file = zipfile.ZipFile(path).read(f"engramd_client-{_meson_version()}.dist-info/WHEEL")
    assert f"Tag: py3-none-manylinux_{glibc}_".encode() in wheel_file, wheel_file
    assert "engram/__init__.py" in names and "engram/py.typed" in names
    # engram.__version__ from meson's project version, not read from a checkout's meson.build
    version_py = zipfile.ZipFile(path).read("engram/_version.py").decode()
    assert f'__version__ = "{_meson_version()}"' in version_py, version_py
    assert "engram/lib/libengram_client.so.0" in names
    assert any(n.startswith("engram/lib/libabsl_") for n in names)  # what the client loads
    assert ("engram/lib/libengram_kernels_cuda.so" in names) == kernels
    # nothing else of the project: no programs, headers, units or examples
    assert all(n.startswith(("engram/", f"engramd_client-{_meson_version()}.dist-info/"))
               for n in names), names
    assert not any("cudart" in n or "/libc.so" in n for n in names)


def test_installed_wheel_gathers_from_engramd(venv, daemon, expected_rows, tmp_path):
    ids = [0, 3, 4095 % SYNTH_ROWS, 17, 3]
    np.save(tmp_path / "want.npy", expected_rows(14, ids))
    script = f"""
import json, sys
import numpy as np
import engram
rows = engram.Client({daemon.socket!r}).gather(14, {ids!r}, array="numpy")
print(json.dumps({{"library": engram.library_path(), "package": engram.__file__,
                  "torch": "torch" in sys.modules,
                  "equal": bool(np.array_equal(rows, np.load("want.npy")))}}))
"""
    run = subprocess.run([str(venv), "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=_clean_env())
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    site = pathlib.Path(report["package"]).parent
    assert str(site).startswith(str(venv.parent.parent)), report  # the venv's copy
    assert report["library"] == str(site / "lib" / "libengram_client.so.0"), report
    assert report["equal"] and not report["torch"], report


def test_installed_health_check(venv, daemon, tmp_path):
    version = subprocess.run([str(venv), "-m", "engram", "--version"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path, env=_clean_env())
    assert version.returncode == 0, version.stdout + version.stderr
    assert version.stdout == f"engram {_meson_version()}\n", version.stdout
    run = subprocess.run([str(venv), "-m", "engram", "--socket", daemon.socket],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=_clean_env())
    assert run.returncode == 0, run.stdout + run.stderr
    assert "engram/lib/libengram_client.so.0" in run.stdout and "table 14:" in run.stdout
