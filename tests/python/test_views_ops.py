"""Typed views (NumPy and torch), NumPy gathers, import hygiene, `python -m engram`, and the
torch custom ops (meta shapes, CPU values, torch.compile where torch has it)."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import engram
import reference
from conftest import LAYERS, SYNTH_ROWS

REPO = pathlib.Path(__file__).resolve().parents[2]
HAS_FLOAT8 = hasattr(torch, "float8_e4m3fn")
HAS_COMPILE = hasattr(torch, "compile")


def _python(*args, env=None):
    # The library this process loaded, absolute: the child runs from another folder.
    full_env = dict(os.environ, PYTHONPATH=str(REPO / "python"),
                    ENGRAM_CLIENT_LIB=os.path.abspath(engram.library_path()), **(env or {}))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env,
                          timeout=60, cwd=REPO)


# ---- import hygiene and the health check ---------------------------------------------------------

def test_import_engram_does_not_import_torch():
    run = _python("-c", "import sys, engram\n"
                        "c = engram.Client\n"
                        "v = engram.split_rows(__import__('numpy').zeros((1, 264), 'uint8'))\n"
                        "print('torch' in sys.modules)\n"
                        "engram.dequantize_rows\n"
                        "print('torch' in sys.modules)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"]


def test_lookup_uses_only_public_client_methods():
    source = (REPO / "python" / "engram" / "lookup.py").read_text()
    assert "_client._" not in source and "_lib." not in source


def test_health_check_against_the_daemon(daemon):
    run = _python("-m", "engram", "--socket", daemon.socket)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "running" in run.stdout and os.path.abspath(engram.library_path()) in run.stdout
    for layer in LAYERS:
        assert f"table {layer}: {SYNTH_ROWS} rows of 264 B" in run.stdout


def test_health_check_without_a_daemon(tmp_path):
    run = _python("-m", "engram", "--socket", str(tmp_path / "none.sock"), "--json")
    assert run.returncode == 3, run.stdout + run.stderr
    assert '"status": "not answering"' in run.stdout and "none.sock" in run.stdout


# ---- typed views ---------------------------------------------------------------------------------

def test_numpy_gather_and_views_are_zero_copy(client, expected_rows):
    ids = [5, 17, 99, 5, SYNTH_ROWS - 1]
    rows = client.gather(14, ids, array="numpy")
    assert isinstance(rows, np.ndarray) and rows.dtype == np.uint8 and rows.shape == (5, 264)
    assert np.array_equal(rows, expected_rows(14, ids))
    values, scales, raw = client.gather(14, ids, array="numpy", typed=True)
    assert values.shape == (5, 256) and scales.shape == (5, 8) and raw.shape == (5, 264)
    assert values.__array_interface__["data"][0] == raw.__array_interface__["data"][0]
    assert scales.__array_interface__["data"][0] == raw.__array_interface__["data"][0] + 256
    want = expected_rows(14, ids)
    assert np.array_equal(values, want[:, :256]) and np.array_equal(scales, want[:, 256:])
    client.release(rows)
    client.release(engram.RowView(values, scales, raw))
    with pytest.raises(engram.InvalidArgumentError, match="already released"):
        client.release(raw)


def test_numpy_dequantize_matches_the_reference(client):
    rows = client.gather(1, np.arange(0, SYNTH_ROWS, 7), array="numpy")
    got = engram.dequantize_numpy(rows)
    want = reference.dequantize(rows).float().numpy()  # bf16 of the exact float32 product
    got_bf16 = torch.from_numpy(reference.to_bf16_bits(got)).view(torch.bfloat16)
    assert np.array_equal(reference.bits(got_bf16).numpy(),
                          reference.bits(torch.from_numpy(want).to(torch.bfloat16)).numpy())
    # every byte value decodes like the reference's bit-field decode
    every = np.arange(256, dtype=np.uint8)
    for ours, theirs in ((engram.decode_e4m3, reference.decode_e4m3),
                         (engram.decode_e8m0, reference.decode_e8m0)):
        assert np.array_equal(ours(every), theirs(every).astype(np.float32), equal_nan=True)


def test_split_rows_refuses_bad_input():
    with pytest.raises(ValueError, match=r"uint8 \[\.\.\., 264\]"):
        engram.split_rows(np.zeros((2, 256), np.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        engram.split_rows(np.zeros((264, 2), np.uint8).T)
    with pytest.raises(TypeError, match="NumPy has no FP8"):
        engram.split_rows(np.zeros((1, 264), np.uint8), float8=True)
    with pytest.raises(ValueError, match="array must be one of"):
        engram.Client.__new__(engram.Client)._check_array("list")


@pytest.mark.skipif(HAS_FLOAT8, reason=f"torch {torch.__version__} has float8_e4m3fn")
def test_float8_views_refused_on_old_torch(client):
    rows = client.gather(14, [1, 2])
    with pytest.raises(engram.Float8UnavailableError, match="float8=False"):
        engram.split_rows(rows)
    values, scales, raw = engram.split_rows(rows, float8=False)
    assert values.dtype == torch.uint8 and values.data_ptr() == rows.data_ptr()


@pytest.mark.skipif(not HAS_FLOAT8, reason=f"torch {torch.__version__} has no float8_e4m3fn "
                                           f"(added in torch 2.1); runs on the GPU host")
def test_float8_typed_gather(client, expected_rows):
    ids = list(range(0, SYNTH_ROWS, 13))
    values, scales, raw = client.gather(14, ids, typed=True)
    assert values.dtype == torch.float8_e4m3fn and tuple(values.shape) == (len(ids), 256)
    assert scales.dtype == torch.uint8 and tuple(scales.shape) == (len(ids), 8)
    assert values.data_ptr() == raw.data_ptr() and scales.data_ptr() == raw.data_ptr() + 256
    want = expected_rows(14, ids)
    assert np.array_equal(values.view(torch.uint8).numpy(), want[:, :256])
    # torch's own float8 decode times the E8M0 scale gives the reference bit for bit
    scale = torch.from_numpy(engram.decode_e8m0(scales.numpy()))  # exact powers of two
    product = values.float().view(-1, 8, 32) * scale.unsqueeze(-1)
    got = product.view(-1, 256).to(torch.bfloat16)
    got.view(torch.int16)[torch.isnan(product.view(-1, 256))] = 0x7FC0
    assert torch.equal(reference.bits(got), reference.bits(reference.dequantize(want)))


# ---- custom ops ----------------------------------------------------------------------------------

def test_dequantize_op_values_and_meta(client):
    import engram.ops  # noqa: F401  registers torch.ops.engram
    rows = client.gather(1, np.arange(0, SYNTH_ROWS, 5))
    got = torch.ops.engram.dequantize(rows)
    assert torch.equal(reference.bits(got), reference.bits(reference.dequantize(rows.numpy())))
    batched = torch.ops.engram.dequantize(rows[:12].reshape(3, 4, 264))
    assert tuple(batched.shape) == (3, 4, 256)
    meta = torch.ops.engram.dequantize(torch.empty(7, 5, 264, dtype=torch.uint8, device="meta"))
    assert meta.device.type == "meta" and tuple(meta.shape) == (7, 5, 256)
    assert meta.dtype == torch.bfloat16
    with pytest.raises(Exception, match="264"):
        torch.ops.engram.dequantize(torch.zeros(2, 256, dtype=torch.uint8))


def test_gather_wait_op_cpu_and_meta(daemon, tables):
    rng = np.random.default_rng(3)
    with engram.EngramLookup(LAYERS, 6, 16, device="cpu", socket=daemon.socket) as lookup:
        ids = {layer: rng.integers(-1, SYNTH_ROWS, size=(9, 6)) for layer in LAYERS}
        lookup.prepare(ids)
        tokens = torch.zeros(9, dtype=torch.int64)
        for layer in LAYERS:
            got = lookup.embeddings(layer, tokens)
            want = reference.embeddings(tables, layer, ids[layer])
            assert torch.equal(reference.bits(got), reference.bits(want))
            again = torch.ops.engram.gather_wait(tokens, lookup.op_id, layer)
            assert torch.equal(reference.bits(again), reference.bits(want))
            assert again.data_ptr() != got.data_ptr()  # a new tensor every call
        meta = torch.ops.engram.gather_wait(torch.empty(9, device="meta"), lookup.op_id, 14)
        assert meta.device.type == "meta" and tuple(meta.shape) == (9, 6, 256)
        with pytest.raises(Exception, match="prepared step has 9 tokens"):
            lookup.embeddings(14, torch.zeros(4))
        with pytest.raises(Exception, match="not one of"):
            torch.ops.engram.gather_wait(torch.empty(9, device="meta"), lookup.op_id, 7)
    with pytest.raises(Exception, match="no live EngramLookup"):
        torch.ops.engram.gather_wait(tokens, 10**9, 14)


@pytest.mark.skipif(not HAS_COMPILE, reason=f"torch {torch.__version__} has no torch.compile "
                                            f"(torch 2.0 added it); runs on the GPU host")
def test_compile_fullgraph_through_the_lookup_on_cpu(daemon, tables):
    rng = np.random.default_rng(4)
    with engram.EngramLookup([14], 6, 16, device="cpu", socket=daemon.socket) as lookup:
        weight = torch.randn(6 * 256, 32)

        def layer(hidden, input_ids):
            memory = lookup.embeddings(14, input_ids).flatten(1).float()
            return hidden + memory @ weight

        compiled = torch.compile(layer, fullgraph=True)
        for step in range(3):
            ids = rng.integers(0, SYNTH_ROWS, size=(8, 6))
            lookup.prepare([ids])
            hidden = torch.randn(8, 32)
            input_ids = torch.zeros(8, dtype=torch.int64)
            got = compiled(hidden, input_ids)
            memory = reference.embeddings(tables, 14, ids).flatten(1).float()
            assert torch.allclose(got, hidden + memory @ weight, rtol=1e-4, atol=1e-3), step
