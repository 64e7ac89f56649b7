"""README.md's code: every ```c, ```c++ and ```python block is a whole program; each is compiled
(with warnings as errors) and run against engramd serving a synthetic hashable model, with the
model path the snippets name pointed at that model and $ENGRAM_SOCKET at the daemon."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, build_dir

BLOCK = re.compile(r"^```(c|c\+\+|cpp|python)\n(.*?)^```$", re.M | re.S)
README_MODEL = "/models/DeepSeek-V4.1-Flash"


def snippets():
    found = [(lang, code) for lang, code in BLOCK.findall((REPO / "README.md").read_text())]
    kinds = {lang for lang, _ in found}
    assert {"c", "c++", "python"} <= kinds, f"README.md has blocks of {sorted(kinds)} only"
    return found


def client_lib_dir():
    path = build_dir() / "client"
    assert (path / "libengram_client.so").exists(), f"no libengram_client.so in {path}"
    return path


def compile_and_run(lang, code, folder, env):
    compiler = shutil.which("cc" if lang == "c" else "c++")
    if compiler is None:
        pytest.skip(f"no {'cc' if lang == 'c' else 'c++'} on PATH")
    source = folder / ("snippet.c" if lang == "c" else "snippet.cc")
    source.write_text(code)
    std = "-std=c11" if lang == "c" else "-std=c++20"
    lib = client_lib_dir()
    # engram/version.h is generated into the build tree's include/.
    generated = build_dir() / "include"
    build = subprocess.run([compiler, std, "-Wall", "-Wextra", "-Werror", "-I", str(generated),
                            "-I", str(REPO / "include"), str(source), "-o", str(folder / "snippet"),
                            "-L", str(lib), f"-Wl,-rpath,{lib}", "-lengram_client"],
                           capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, f"{lang} snippet does not compile:\n{build.stderr}\n{code}"
    return subprocess.run([str(folder / "snippet")], capture_output=True, text=True, env=env,
                          timeout=60)


def test_every_readme_snippet_compiles_and_runs(hashable_model, daemon, tmp_path):
    import engram
    env = dict(os.environ, ENGRAM_SOCKET=daemon.socket, PYTHONPATH=str(REPO / "python"),
               ENGRAM_CLIENT_LIB=os.path.abspath(engram.library_path()))
    ran = 0
    for i, (lang, code) in enumerate(snippets()):
        code = code.replace(README_MODEL, str(hashable_model))
        folder = tmp_path / f"snippet-{i}"
        folder.mkdir()
        if lang == "python":
            (folder / "snippet.py").write_text(code)
            r = subprocess.run([sys.executable, str(folder / "snippet.py")], capture_output=True,
                               text=True, env=env, timeout=120)
        else:
            r = compile_and_run(lang, code, folder, env)
        assert r.returncode == 0, f"{lang} snippet {i} failed:\n{r.stdout}{r.stderr}\n{code}"
        ran += 1
    assert ran >= 3


def test_a_broken_snippet_fails(tmp_path, daemon):
    """The harness can fail: a snippet gathering a row past the table exits non-zero."""
    code = next(code for lang, code in snippets() if lang == "c")
    broken = code.replace("rows[i] = 5 + 12 * i;", "rows[i] = 1u << 30;")
    assert broken != code
    r = compile_and_run("c", broken, tmp_path, dict(os.environ, ENGRAM_SOCKET=daemon.socket))
    assert r.returncode != 0 and "row" in r.stderr
