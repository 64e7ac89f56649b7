# EngramLookup's GPU path (gpu.h through ctypes) against the plain reference: eager steps, and
# steps replayed from a captured CUDA graph. Skipped, with the reason, where no GPU path exists;
# ENGRAM_REQUIRE_GPU=1 turns that skip into a failure (run this on the GPU machine with it).
import numpy as np
import pytest
import torch

import engram
import reference
from conftest import LAYERS
from test_lookup import step_ids

pytestmark = pytest.mark.gpu


def test_gpu_lookup_equals_reference_over_steps(daemon, tables):
    heads, max_tokens = 24, 96
    rng = np.random.default_rng(21)
    with engram.EngramLookup(LAYERS, heads, max_tokens, device="cuda",
                             socket=daemon.socket) as lookup:
        for step, tokens in enumerate([96, 3, 50, 96, 1]):
            ids = {layer: step_ids(rng, tokens, heads) for layer in LAYERS}
            lookup.prepare(ids)
            outs = {layer: lookup.get(layer) for layer in reversed(LAYERS)}
            for layer, got in outs.items():
                assert got.is_cuda and got.dtype == torch.bfloat16
                assert tuple(got.shape) == (tokens, heads, 256)
                want = reference.embeddings(tables, layer, ids[layer])
                assert torch.equal(reference.bits(got.cpu()), reference.bits(want)), (step, layer)


def test_gpu_lookup_on_a_side_stream(daemon, tables):
    rng = np.random.default_rng(22)
    with engram.EngramLookup([14], 6, 32, device="cuda", socket=daemon.socket) as lookup:
        stream = torch.cuda.Stream()
        ids = step_ids(rng, 32, 6)
        lookup.prepare({14: ids})
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            got = lookup.get(14) * 1  # consumed on the side stream, behind the lookup's wait
        stream.synchronize()
        want = reference.embeddings(tables, 14, ids)
        assert torch.equal(reference.bits(got.cpu()), reference.bits(want))


def test_gpu_lookup_cuda_graph_capture_and_replay(daemon, tables):
    heads, tokens = 24, 48
    rng = np.random.default_rng(23)
    with engram.EngramLookup(LAYERS, heads, tokens, device="cuda",
                             socket=daemon.socket) as lookup:
        # Warm up eagerly on a side stream, as torch.cuda.graph expects.
        lookup.prepare({layer: step_ids(rng, tokens, heads) for layer in LAYERS})
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for layer in LAYERS:
                lookup.get(layer)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

        graph = torch.cuda.CUDAGraph()
        first = {layer: step_ids(rng, tokens, heads) for layer in LAYERS}
        lookup.prepare(first)
        with torch.cuda.graph(graph):
            # What an Engram layer does with the embeddings, captured with the lookup.
            mixed = {layer: lookup.get(layer).float() * 2.0 for layer in LAYERS}
        steps = [first] + [{layer: step_ids(rng, tokens, heads, padding=p) for layer in LAYERS}
                           for p in (0.0, 0.5, 1.0, 0.1)]
        for index, ids in enumerate(steps):
            if index:
                lookup.prepare(ids)
            graph.replay()
            torch.cuda.synchronize()  # the engine reads the step's results back
            for layer in LAYERS:
                want = reference.embeddings(tables, layer, ids[layer]).float() * 2.0
                got = mixed[layer].cpu()
                assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want)), (index, layer)


def test_gpu_get_does_not_wait_on_the_host(daemon, tables):
    """get() only queues work: with the stream blocked behind a long kernel, get() returns
    before the GPU has even started the wait, and the result is still right afterwards."""
    rng = np.random.default_rng(24)
    with engram.EngramLookup([1], 24, 64, device="cuda", socket=daemon.socket) as lookup:
        ids = step_ids(rng, 64, 24)
        lookup.prepare({1: ids})
        torch.cuda._sleep(200_000_000)  # keeps the stream busy for a while (GPU cycles)
        done = torch.cuda.Event()
        out = lookup.get(1)
        done.record()
        assert not done.query()  # the host got here while the GPU was still busy
        torch.cuda.synchronize()
        want = reference.embeddings(tables, 1, ids)
        assert torch.equal(reference.bits(out.cpu()), reference.bits(want))


def test_gpu_gather_wait_op_compiled_and_captured(daemon, tables):
    """A layer calling lookup.embeddings (torch.ops.engram.gather_wait) compiles with
    torch.compile(fullgraph=True) on the GPU, and the compiled layer captures into a CUDA graph
    that later steps replay with their own rows."""
    if not hasattr(torch, "compile"):
        pytest.skip(f"torch {torch.__version__} has no torch.compile (2.0 added it)")
    heads, tokens = 6, 16
    rng = np.random.default_rng(25)
    weight = torch.randn(heads * 256, 32, device="cuda")
    with engram.EngramLookup([14], heads, tokens, device="cuda", socket=daemon.socket) as lookup:
        def layer(hidden, input_ids):
            return hidden + lookup.embeddings(14, input_ids).flatten(1).float() @ weight

        compiled = torch.compile(layer, fullgraph=True)
        input_ids = torch.zeros(tokens, dtype=torch.int64, device="cuda")
        hidden = torch.randn(tokens, 32, device="cuda")

        def want(ids):
            memory = reference.embeddings(tables, 14, ids).flatten(1).float().cuda()
            return hidden + memory @ weight

        for _ in range(2):  # eager compiled steps (the second reuses the compiled graph)
            ids = step_ids(rng, tokens, heads, padding=0.0)
            lookup.prepare([ids])
            got = compiled(hidden, input_ids)
            torch.cuda.synchronize()
            assert torch.allclose(got, want(ids), rtol=1e-3, atol=1e-2)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            compiled(hidden, input_ids)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        first = step_ids(rng, tokens, heads, padding=0.0)
        lookup.prepare([first])
        with torch.cuda.graph(graph):
            captured = compiled(hidden, input_ids)
        for index, ids in enumerate([first] + [step_ids(rng, tokens, heads, padding=0.0)
                                               for _ in range(3)]):
            if index:
                lookup.prepare([ids])
            graph.replay()
            torch.cuda.synchronize()
            assert torch.allclose(captured, want(ids), rtol=1e-3, atol=1e-2), index
