"""python/examples/engram_layer.py: the Engram layer fed by engramd is bit-identical to its
pure-PyTorch reference reading the same checkpoint, over prefill chunks and decode steps."""

import io
import pathlib
import subprocess
import sys

import numpy as np
import torch

from test_hashing import hash_daemon, hash_model  # noqa: F401  (module fixtures)

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "examples"))
import engram_layer  # noqa: E402


def test_example_layer_is_bit_identical_to_its_reference(hash_model, hash_daemon,  # noqa: F811
                                                         monkeypatch):
    """A 40-token prompt in chunks of 16, then decode steps; each chunk but the last names the
    next one (its tokens, and this chunk's last ids as its history), no decode step does."""
    import engram
    steps = []
    prepare_tokens = engram.EngramLookup.prepare_tokens

    def recording(self, hasher, tokens, history=None, **kwargs):
        steps.append((list(tokens), list(history), kwargs))
        return prepare_tokens(self, hasher, tokens, history, **kwargs)
    monkeypatch.setattr(engram.EngramLookup, "prepare_tokens", recording)
    out = io.StringIO()
    same = engram_layer.run(hash_model[0], hash_daemon.socket, 14, [40, 6, 6, 1], out=out,
                            chunk=16)
    lines = out.getvalue().splitlines()
    assert same, out.getvalue()
    assert len(lines) == 6 and all("bit-identical" in line for line in lines)
    assert [len(tokens) for tokens, _, _ in steps] == [16, 16, 8, 6, 6, 1]
    for at, (_, _, kwargs) in enumerate(steps):
        if at < 2:
            tokens, history, _ = steps[at + 1]
            assert list(kwargs["next_tokens"]) == tokens
            assert list(kwargs["next_history"]) == history
        else:
            assert kwargs["next_tokens"] is None and kwargs["next_history"] is None


def test_reference_dequantize_matches_the_package():
    import engram
    rows = torch.from_numpy(np.random.default_rng(5).integers(0, 256, (64, 264), dtype=np.uint8))
    rows[0, :8] = torch.tensor([0x7F, 0xFF, 0x00, 0x80, 0x01, 0x7E, 0x08, 0x87])
    rows[1, 256:] = torch.tensor([0, 1, 127, 254, 255, 200, 60, 128])
    want = engram.dequantize_rows(rows).view(torch.int16)
    assert torch.equal(engram_layer.dequantize_reference(rows).view(torch.int16), want)


def test_example_detects_a_different_table(hash_model, hash_daemon):  # noqa: F811
    """The comparison can fail: a reference reading layer 1's table differs."""
    import engram
    hasher = engram.Hasher(hash_model[0])
    mixer = engram_layer.EngramMixer(16, heads=hasher.heads_per_layer)
    wrong = engram_layer.CheckpointEngramLayer(mixer,
                                               engram_layer.read_table(hash_model[0], 1))
    tokens = np.arange(5)
    with engram.EngramLookup([14], hasher.heads_per_layer, 8, device="cpu",
                             socket=hash_daemon.socket) as lookup, torch.no_grad():
        layer = engram_layer.EngramdEngramLayer(mixer, lookup, 14)
        layer.prepare_step(hasher, tokens)
        hidden = torch.randn(5, 1, 16)
        got = layer(hidden, torch.from_numpy(tokens))
        ids = hasher.hash(tokens, layer=14)
        ids = np.minimum(ids, wrong.table.shape[0] - 1)
        assert not torch.equal(got, wrong(hidden, torch.from_numpy(ids)))
    hasher.close()


def test_example_runs_as_a_program(hash_model, hash_daemon):  # noqa: F811
    import os
    import engram
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"),
               ENGRAM_CLIENT_LIB=os.path.abspath(engram.library_path()))
    run = subprocess.run([sys.executable, str(REPO / "python" / "examples" / "engram_layer.py"),
                          "--model", str(hash_model[0]), "--socket", hash_daemon.socket,
                          "--tokens", "16", "--chunk", "8"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("bit-identical") == 5
