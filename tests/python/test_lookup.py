# EngramLookup on the CPU, and the package's dequantisation, against the plain reference.
import numpy as np
import pytest
import torch

import engram
import reference
from conftest import LAYERS, SYNTH_ROWS


def step_ids(rng, tokens, heads, padding=0.1, hot=64):
    """Row ids of one step: uniform rows, a few hot rows repeated, some -1 padding slots."""
    ids = rng.integers(0, SYNTH_ROWS, size=(tokens, heads))
    repeat = rng.random((tokens, heads)) < 0.3
    ids[repeat] = rng.integers(0, hot, size=int(repeat.sum()))
    ids[rng.random((tokens, heads)) < padding] = -1
    return ids


def test_dequantize_rows_every_byte_and_scale():
    # Every E4M3 byte under several scales (0, 1, 120, 127, 134, 200, 254) and NaN scale 255.
    values = np.tile(np.arange(256, dtype=np.uint8), (8, 1))
    scales = np.array([[0, 1, 120, 127, 134, 200, 254, 255]] * 8, dtype=np.uint8)
    scales = np.stack([np.roll(scales[0], i) for i in range(8)])
    rows = np.concatenate([values, scales], axis=1)
    got = engram.dequantize_rows(torch.from_numpy(rows))
    want = reference.dequantize(rows)
    assert torch.equal(reference.bits(got), reference.bits(want))
    nan_bits = reference.bits(got)[torch.isnan(got.float())]
    assert bool((nan_bits == 0x7FC0).all())  # the kernel's NaN pattern


def test_dequantize_rows_rejects_a_bad_shape():
    with pytest.raises(ValueError, match="264"):
        engram.dequantize_rows(torch.zeros(2, 256, dtype=torch.uint8))


def test_lookup_cpu_equals_reference_over_steps(daemon, tables):
    heads, max_tokens = 24, 64
    rng = np.random.default_rng(11)
    with engram.EngramLookup(LAYERS, heads, max_tokens, device="cpu",
                             socket=daemon.socket) as lookup:
        for step, tokens in enumerate([64, 1, 17, 64, 5, 33]):
            ids = {layer: step_ids(rng, tokens, heads) for layer in LAYERS}
            # Vary the input types across steps: tensors, arrays, lists.
            given = {layer: (torch.from_numpy(a) if step % 3 == 0 else
                             a if step % 3 == 1 else a.tolist()) for layer, a in ids.items()}
            lookup.prepare(given)
            for layer in reversed(LAYERS):  # layers read in any order
                got = lookup.get(layer)
                assert got.dtype == torch.bfloat16 and tuple(got.shape) == (tokens, heads, 256)
                want = reference.embeddings(tables, layer, ids[layer])
                assert torch.equal(reference.bits(got), reference.bits(want)), (step, layer)
        stats = lookup.stats()
        assert stats.requests_ok == 2 * 6 and stats.requests_failed == 0


def test_lookup_all_padding_step(daemon):
    with engram.EngramLookup([14], 6, 8, device="cpu", socket=daemon.socket) as lookup:
        lookup.prepare([np.full((3, 6), -1)])
        got = lookup.get(14)
        assert tuple(got.shape) == (3, 6, 256) and not bool(got.float().any())
    assert lookup._client._closed  # close() ended the session at once
    with pytest.raises(RuntimeError, match="closed"):
        lookup.prepare([np.zeros((1, 6), dtype=np.int64)])


def test_lookup_refuses_bad_steps(daemon):
    with engram.EngramLookup(LAYERS, 4, 8, device="cpu", socket=daemon.socket) as lookup:
        good = np.zeros((2, 4), dtype=np.int64)
        with pytest.raises(engram.RowOutOfRangeError, match=r"layer 14: row 4096 \(token 1, "
                                                            r"head 2\)"):
            bad = good.copy()
            bad[1, 2] = SYNTH_ROWS
            lookup.prepare({1: good, 14: bad})
        with pytest.raises(ValueError, match=r"shape \[tokens, 4\]"):
            lookup.prepare({1: good, 14: np.zeros((2, 5), dtype=np.int64)})
        with pytest.raises(ValueError, match="max_tokens"):
            lookup.prepare({1: good, 14: np.zeros((9, 4), dtype=np.int64)})
        with pytest.raises(engram.InvalidArgumentError, match="expected"):
            lookup.prepare({1: good})
        with pytest.raises(engram.InvalidArgumentError, match="3 row id arrays for 2 layers"):
            lookup.prepare([good, good, good])
        # A layer the lookup does not serve is an EngramError naming it, in each entry point.
        with pytest.raises(engram.UnknownTableError, match=r"layers \[7\], not layers"):
            lookup.prepare({1: good, 14: good, 7: good})
        with pytest.raises(engram.UnknownTableError, match=r"layers \[7\], not layers"):
            lookup.prefetch({7: good})
        with pytest.raises(engram.UnknownTableError, match="layer 7 is not one of"):
            lookup.get(7)
        with pytest.raises(TypeError):
            lookup.prepare({1: good, 14: good.astype(np.float32)})
        with pytest.raises(RuntimeError, match="before any prepare"):
            lookup.get(1)
        # After the refusals a good step still works.
        lookup.prepare({1: good, 14: good})
        assert tuple(lookup.get(14).shape) == (2, 4, 256)


def test_lookup_unknown_layer(daemon):
    with pytest.raises(engram.UnknownTableError, match=r"\[7\]"):
        engram.EngramLookup([1, 7], 4, 8, device="cpu", socket=daemon.socket)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU")
def test_lookup_on_cuda_where_torch_has_no_device_is_refused(daemon):
    with pytest.raises(engram.GpuUnavailableError, match="device='cpu'"):
        engram.EngramLookup([14], 6, 8, device="cuda", socket=daemon.socket)


def test_lookup_wait_and_gather_agree(daemon, expected_rows):
    rng = np.random.default_rng(12)
    with engram.EngramLookup([1], 3, 10, device="cpu", socket=daemon.socket) as lookup:
        ids = step_ids(rng, 10, 3, padding=0.0)
        lookup.prepare([ids])
        lookup.wait(timeout=10)
        with engram.Client(daemon.socket) as client:
            rows = client.gather(1, ids.reshape(-1))
            want = engram.dequantize_rows(rows).view(10, 3, 256)
        assert torch.equal(lookup.get(1).view(torch.int16), want.view(torch.int16))
