# Tables read in place by the GPU from Python (engram._gpu.GpuTables, GpuDecodeStep and
# EngramLookup with in_place): an engramd serving layer 14 resident and layer 1 from its row
# cache.
#   - everywhere: the ctypes layouts of the C structs, and the route each table takes (mapped and
#     registered, or the arena with one warning) decided through the stand-in CUDA runtime
#     (tests/gpu/fake_cudart.cc) in a child process: pinned, pageable, refused, kernels too old,
#     the daemon gone;
#   - on a GPU: GpuDecodeStep and EngramLookup byte-exact against the arena path and the
#     reference, captured and replayed, the two-phase draft step, the hits reported to the
#     cache's policy, and the fallbacks (registration refused, table withdrawn).
import errno
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import engram
from engram import _lib
from conftest import REPO, Daemon, SYNTH_ROWS, engramctl_json, program_env
from test_hashing import hash_model, hash_tables, hasher  # noqa: F401 (fixtures)

TIERS = ["--tier", "14=resident", "--tier", "1=cache", "--cache-bytes", "64M"]


def _table_entry(daemon, command, layer):
    return next(t for t in engramctl_json(daemon, command)["tables"] if t["layer"] == layer)


def _wait_resident(daemon, layer=14):
    deadline = time.monotonic() + 60
    while not _table_entry(daemon, "tables", layer)["resident_loaded"]:
        assert time.monotonic() < deadline, f"layer {layer} did not become resident"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def tier_daemon(checkpoint, tmp_path_factory):
    d = Daemon(checkpoint, tmp_path_factory.mktemp("engramd-gpu-in-place"), TIERS)
    _wait_resident(d)
    yield d
    d.stop()


# ---- everywhere --------------------------------------------------------------------------

def test_ctypes_structs_have_the_c_layouts():
    """The sizes engram.h / gpu.h assert (ENGRAM_ASSERT_SIZE) and the offsets the kernels and
    the client library read, so that a field added on one side only fails here."""
    assert _lib.struct_size_mismatches() == []
    offsets = {
        _lib.TableMapInfo: {"layer": 8, "covered_begin": 16, "base": 32, "map_bytes": 40,
                            "kind": 48},
        _lib.GpuRowCache: {"cache": 8, "layer": 16, "buckets_offset": 24, "slots_offset": 32,
                           "max_slots": 40, "slot_bytes": 44, "covered_begin": 48,
                           "guard_page_bytes": 64},
        _lib.GpuCacheHit: {"key": 0, "slot": 8},
        _lib.GpuCacheMisses: {"rows": 8, "slots": 16, "count": 24, "hits": 32, "hit_count": 40,
                              "hit_total": 48},
    }
    for struct, fields in offsets.items():
        for name, offset in fields.items():
            assert getattr(struct, name).offset == offset, (struct.__name__, name)
    with pytest.warns(DeprecationWarning):  # the older field name, kept for old callers
        assert _lib.TableMapInfo(layer=3).layer_id == 3


def _fake_cudart():
    """The stand-in runtime: $FAKE_CUDART, in $ENGRAM_LIB_DIR (a bundle), or a build folder's."""
    if os.environ.get("FAKE_CUDART"):
        return pathlib.Path(os.environ["FAKE_CUDART"])
    candidates = []
    if os.environ.get("ENGRAM_LIB_DIR"):
        candidates.append(pathlib.Path(os.environ["ENGRAM_LIB_DIR"]) / "libfake_cudart.so")
    builds = [pathlib.Path(os.environ["ENGRAM_BUILD_DIR"])] if os.environ.get(
        "ENGRAM_BUILD_DIR") else sorted(REPO.glob("build*"))
    candidates += [b / "tests" / "gpu" / "libfake_cudart.so" for b in builds]
    return next((p for p in candidates if p.is_file()), None)


# Run in a child whose only CUDA runtime is the stand-in (named libcudart.so.13 in a folder on
# LD_LIBRARY_PATH, which the loader reads at start): maps the tables, prints what was decided.
_CHILD = r"""
import ctypes, errno, json, sys, warnings
import engram
from engram import _gpu, _lib
socket, layers, row_cache, kernels, stop_pid = sys.argv[1:6]
client = engram.Client(socket)
tables = _gpu.GpuTables(client, json.loads(layers), kernels == "1", row_cache=row_cache == "1")
out = {"routes": tables.routes, "reasons": tables.reasons, "warning": tables.warning,
       "maps": {}}
for layer, t in tables.maps.items():
    entry = {"kind": t.kind, "base": t.base, "covered": [t.covered_begin, t.covered_end],
             "check": t.check()}
    if t.table_d is not None:
        entry["table_d"] = t.table_d
    if t.cache is not None:
        c = t.cache
        entry["cache"] = {"size": c.size, "cache": c.cache, "layer": c.layer,
                          "bucket_count": c.bucket_count, "slot_bytes": c.slot_bytes,
                          "max_slots": c.max_slots, "covered": [c.covered_begin, c.covered_end]}
        t.report_hits(0, None, 0)  # nothing read yet: accepted, nothing counted
    out["maps"][layer] = entry
if stop_pid != "0":
    import os, signal, time
    os.kill(int(stop_pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while len(tables.stale()) < len(tables.maps) and time.monotonic() < deadline:
        time.sleep(0.01)
    out["stale"] = tables.stale()
tables.close()
client.close()
print(json.dumps(out))
"""


def _decide(daemon, tmp_path, layers=(1, 14), env=None, row_cache=True, kernels=True,
            stop_pid=0):
    fake = _fake_cudart()
    if fake is None:
        pytest.skip("libfake_cudart.so not found: build tests/gpu/libfake_cudart.so, or set "
                    "$FAKE_CUDART or $ENGRAM_BUILD_DIR")
    runtime_dir = tmp_path / "cudart"
    runtime_dir.mkdir(exist_ok=True)
    link = runtime_dir / "libcudart.so.13"
    if not link.exists():
        link.symlink_to(fake.resolve())
    child_env = program_env()
    child_env["LD_LIBRARY_PATH"] = str(runtime_dir) + (
        ":" + child_env["LD_LIBRARY_PATH"] if child_env.get("LD_LIBRARY_PATH") else "")
    child_env["PYTHONPATH"] = str(REPO / "python")
    for name in ("FAKE_CUDART_REFUSE_PIN", "FAKE_CUDART_PAGEABLE",
                 "FAKE_CUDART_HOST_PAGE_TABLES", "ENGRAM_GPU_PIN"):
        child_env.pop(name, None)
    child_env.update(env or {})
    run = subprocess.run([sys.executable, "-c", _CHILD, daemon.socket, json.dumps(list(layers)),
                          "1" if row_cache else "0", "1" if kernels else "0", str(stop_pid)],
                         env=child_env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    for key in ("routes", "reasons", "maps", "stale"):
        if key in out:
            out[key] = {int(k): v for k, v in out[key].items()}
    return out


DEVICE_OFFSET = 1 << 44  # fake_cudart.cc: a pinned range's device address


def test_pinned_tables_are_read_in_place(tier_daemon, tmp_path):
    out = _decide(tier_daemon, tmp_path)
    assert out["routes"] == {14: "resident", 1: "row cache"}
    assert out["warning"] is None and out["reasons"] == {}
    resident, cached = out["maps"][14], out["maps"][1]
    assert resident["kind"] == _lib.TABLE_MAP_RESIDENT and resident["check"] == 0
    assert resident["covered"] == [0, SYNTH_ROWS]
    assert resident["table_d"] == resident["base"] + DEVICE_OFFSET
    assert cached["kind"] == _lib.TABLE_MAP_ROW_CACHE and cached["check"] == 0
    cache = cached["cache"]
    assert cache["size"] == 72 and cache["layer"] == 1 and cache["slot_bytes"] == 288
    assert cache["cache"] == cached["base"] + DEVICE_OFFSET
    assert cache["bucket_count"] & (cache["bucket_count"] - 1) == 0 and cache["max_slots"] > 0
    assert cache["covered"] == [0, SYNTH_ROWS]


def test_a_driver_that_refuses_to_pin_falls_back_to_pageable_access(tier_daemon, tmp_path):
    out = _decide(tier_daemon, tmp_path, env={"FAKE_CUDART_REFUSE_PIN": "1",
                                              "FAKE_CUDART_PAGEABLE": "1"})
    assert out["routes"] == {14: "resident", 1: "row cache"} and out["warning"] is None
    assert out["maps"][14]["table_d"] == out["maps"][14]["base"]  # nothing pinned
    assert out["maps"][1]["cache"]["cache"] == out["maps"][1]["base"]


def test_registration_refused_routes_through_the_arena_with_one_warning(tier_daemon, tmp_path):
    out = _decide(tier_daemon, tmp_path, env={"FAKE_CUDART_REFUSE_PIN": "1",
                                              "FAKE_CUDART_PAGEABLE": "0"})
    assert out["routes"] == {14: "arena", 1: "arena"} and out["maps"] == {}
    warning = out["warning"]
    assert warning.startswith("engram: reading in place on the GPU refused for layer(s) [1, 14]")
    for layer in (1, 14):
        assert out["reasons"][layer].startswith("registering")
        assert f"layer {layer}: registering" in warning


def test_kernels_without_the_in_place_calls_route_through_the_arena(tier_daemon, tmp_path):
    out = _decide(tier_daemon, tmp_path, kernels=False)
    assert out["routes"] == {14: "arena", 1: "arena"}
    assert "ENGRAM_KERNELS_0.7" in out["warning"]


def test_resident_only_leaves_the_row_cache_quietly(tier_daemon, tmp_path):
    """Resident tables only (EngramLookup's choice where the kernels lack the row cache call):
    the cache-tier table is refused by engram_table_map_open (-EOPNOTSUPP) and goes through the
    arena without a warning."""
    out = _decide(tier_daemon, tmp_path, row_cache=False)
    assert out["routes"] == {14: "resident", 1: "arena"}
    assert out["warning"] is None and 1 in out["reasons"]


def test_storage_tier_tables_take_the_arena_quietly(daemon, tmp_path):
    out = _decide(daemon, tmp_path)  # the default tier: storage
    assert out["routes"] == {14: "arena", 1: "arena"} and out["warning"] is None


def test_a_stopped_daemon_makes_the_maps_stale(checkpoint, tmp_path):
    d = Daemon(checkpoint, tmp_path, TIERS)
    try:
        _wait_resident(d)
        out = _decide(d, tmp_path, stop_pid=d.process.pid)
    finally:
        d.stop()
    assert set(out["routes"].values()) == {"resident", "row cache"}
    assert set(out["stale"]) == {1, 14}
    assert set(out["stale"].values()) <= {-errno.ESTALE, -errno.ENOTCONN}


# ---- on a GPU ------------------------------------------------------------------------------

SEQS, PER_SEQ = 8, 6


@pytest.fixture(scope="module")
def tier_hash_daemon(hash_model, tmp_path_factory):
    d = Daemon(hash_model[0], tmp_path_factory.mktemp("hashd-in-place"), TIERS)
    _wait_resident(d)
    yield d
    d.stop()


def _host_step(hasher, tokens, history, layer, tp):
    seqs = [tokens[i * PER_SEQ:(i + 1) * PER_SEQ] for i in range(SEQS)]
    return hasher.hash(seqs, [list(h) for h in history], layer=layer, tp_size=tp[0],
                       tp_rank=tp[1])


def _assert_first_step(step, hasher, hash_tables, tokens):
    """step's outputs for layers 1 and 14 equal the host reference of a first step of `tokens`
    (no history), bit for bit."""
    import torch
    import reference
    hist = [[] for _ in range(SEQS)]
    for layer in (1, 14):
        want = reference.embeddings(hash_tables, layer,
                                    _host_step(hasher, tokens, hist, layer, (1, 0)))
        assert torch.equal(reference.bits(step.output(layer).cpu()), reference.bits(want))


def _step_inputs(rng, vocab_size, replay, pool):
    """Tokens and history of a replay: every third replay repeats an earlier one, so that the
    row cache holds its rows and the step reads hits."""
    if replay % 3 == 2 and pool:
        return pool[(replay // 3) % len(pool)]
    tokens = rng.integers(0, vocab_size, size=SEQS * PER_SEQ).astype(np.int32)
    history = rng.integers(0, vocab_size, size=(SEQS, 3)).astype(np.int32)
    history[replay % SEQS, :2] = -1
    pool.append((tokens, history))
    return tokens, history


@pytest.mark.gpu
def test_in_place_step_equals_the_arena_step(tier_hash_daemon, hash_model, hash_tables,
                                             hasher):
    import torch
    import reference
    _, _, _, vocab_size = hash_model
    rng, pool, tp = np.random.default_rng(17), [], (4, 1)
    socket = tier_hash_daemon.socket
    with engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ, tp_size=tp[0], tp_rank=tp[1],
                              socket=socket) as in_place, \
            engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ, tp_size=tp[0], tp_rank=tp[1],
                                 socket=socket, in_place=False) as arena:
        assert in_place.routes == {1: "row cache", 14: "resident"}
        assert arena.routes == {1: "arena", 14: "arena"}
        graphs = {}
        for step in (in_place, arena):
            graphs[step] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[step]):
                step.run()
        hit_rows = 0
        for replay in range(30):
            tokens, history = _step_inputs(rng, vocab_size, replay, pool)
            for step in (in_place, arena):
                step.tokens.copy_(torch.from_numpy(tokens))
                step.history.copy_(torch.from_numpy(history))
                graphs[step].replay()
            torch.cuda.synchronize()
            assert in_place.error == 0 and arena.error == 0
            hit_rows += in_place.report_hits().get(1, 0)
            hist = [[int(x) for x in h if x >= 0] for h in history]
            for layer in (1, 14):
                got = reference.bits(in_place.output(layer).cpu())
                assert torch.equal(got, reference.bits(arena.output(layer).cpu())), \
                    (replay, layer)
                want = reference.embeddings(hash_tables, layer,
                                            _host_step(hasher, tokens, hist, layer, tp))
                assert torch.equal(got, reference.bits(want)), (replay, layer)
        assert in_place.hash_errors == 0
        # The repeated steps' rows were cached by the arena step's gathers before: hits.
        assert hit_rows > 0
        assert in_place.report_hits() == {1: 0}  # nothing new since


@pytest.mark.gpu
def test_in_place_hits_reach_the_cache_statistics(tier_hash_daemon, hash_model, hasher):
    import torch
    _, _, _, vocab_size = hash_model
    rng = np.random.default_rng(23)
    tokens = torch.from_numpy(rng.integers(0, vocab_size, SEQS * PER_SEQ).astype(np.int32))
    with engram.GpuDecodeStep(hasher, [1], SEQS, PER_SEQ, socket=tier_hash_daemon.socket) as step:
        step.tokens.copy_(tokens)
        for _ in range(3):  # the first runs fetch the misses (engramd admits them), then hits
            step.run()
            torch.cuda.synchronize()
            assert step.error == 0
            step.report_hits()
        before = _table_entry(tier_hash_daemon, "stats", 1)["store_hit_rows"]
        step.run()
        torch.cuda.synchronize()
        reported = step.report_hits()[1]
        assert reported > 0
        deadline = time.monotonic() + 10
        while _table_entry(tier_hash_daemon, "stats", 1)["store_hit_rows"] - before < reported:
            assert time.monotonic() < deadline, "the reported hits never reached the table"
            time.sleep(0.05)


DRAFT_SLEEP_CYCLES = 20_000_000


@pytest.mark.gpu
@pytest.mark.parametrize("draft_per_seq", [5, 2])
def test_two_phase_in_place_step_is_ordered(tier_hash_daemon, hash_model, hash_tables, hasher,
                                            draft_per_seq):
    """submit_accepted / submit_draft / finish with the tables read in place: the draft rows are
    the draft kernel's tokens' rows (never the tokens before it ran), equal to the whole step."""
    import torch
    import reference
    _, _, _, vocab_size = hash_model
    rng, tp = np.random.default_rng(29 + draft_per_seq), (4, 1)
    a = PER_SEQ - draft_per_seq
    with engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ, tp_size=tp[0], tp_rank=tp[1],
                              socket=tier_hash_daemon.socket, draft_per_seq=draft_per_seq) as step:
        assert step.routes == {1: "row cache", 14: "resident"}
        drafted = torch.zeros((SEQS, draft_per_seq), dtype=torch.int32, device="cuda")
        two_phase = torch.cuda.CUDAGraph()
        with torch.cuda.graph(two_phase):
            step.submit_accepted()
            torch.cuda._sleep(DRAFT_SLEEP_CYCLES)
            step.tokens.view(SEQS, PER_SEQ)[:, a:].copy_(drafted)
            step.submit_draft()
            step.finish()
        for replay in range(8):
            before = rng.integers(0, vocab_size, size=(SEQS, PER_SEQ)).astype(np.int32)
            draft = rng.integers(0, vocab_size, size=(SEQS, draft_per_seq)).astype(np.int32)
            history = rng.integers(0, vocab_size, size=(SEQS, 3)).astype(np.int32)
            after = before.copy()
            after[:, a:] = draft
            step.tokens.copy_(torch.from_numpy(before.reshape(-1)))
            step.history.copy_(torch.from_numpy(history))
            drafted.copy_(torch.from_numpy(draft))
            two_phase.replay()
            torch.cuda.synchronize()
            assert step.error == 0
            step.report_hits()
            hist = [[int(x) for x in h] for h in history]
            for layer in (1, 14):
                want = reference.embeddings(
                    hash_tables, layer, _host_step(hasher, after.reshape(-1), hist, layer, tp))
                assert torch.equal(reference.bits(step.output(layer).cpu()),
                                   reference.bits(want)), (replay, layer)


def _ours(caught):
    return [w for w in caught if str(w.message).startswith("engram: ")]


def _refuse_registration(monkeypatch):
    from engram import _gpu

    def refuse(self, table):
        raise engram.EngramError(-22, "registering refused (test)")
    monkeypatch.setattr(_gpu.GpuTables, "_register", refuse)


@pytest.mark.gpu
def test_step_falls_back_to_the_arena_when_registration_is_refused(
        tier_hash_daemon, hash_model, hash_tables, hasher, monkeypatch):
    import torch
    import reference
    _refuse_registration(monkeypatch)
    _, _, _, vocab_size = hash_model
    rng = np.random.default_rng(31)
    with pytest.warns(RuntimeWarning, match=r"refused for layer\(s\) \[1, 14\]") as caught:
        step = engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ,
                                    socket=tier_hash_daemon.socket)
    assert len(_ours(caught)) == 1
    with step:
        assert step.routes == {1: "arena", 14: "arena"}
        tokens = rng.integers(0, vocab_size, size=SEQS * PER_SEQ).astype(np.int32)
        step.tokens.copy_(torch.from_numpy(tokens))
        step.run()
        torch.cuda.synchronize()
        assert step.error == 0 and step.report_hits() == {}
        _assert_first_step(step, hasher, hash_tables, tokens)


@pytest.mark.gpu
def test_a_withdrawn_table_is_reported_and_the_next_capture_reads_the_arena(
        tier_hash_daemon, hash_model, hash_tables, hasher, monkeypatch):
    """A table withdrawn after the capture (engram_table_map_check -ESTALE, stood in for here):
    error says DATA_LOSS (15) for the steps read in place; capturing again warns once and reads
    that layer through engramd, with correct rows."""
    import errno
    import torch
    import reference
    from engram import _gpu
    _, _, _, vocab_size = hash_model
    tokens = np.random.default_rng(37).integers(0, vocab_size, SEQS * PER_SEQ).astype(np.int32)
    with engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ,
                              socket=tier_hash_daemon.socket) as step:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step.run()
        step.tokens.copy_(torch.from_numpy(tokens))
        graph.replay()
        torch.cuda.synchronize()
        assert step.error == 0
        resident = step._tables.maps[14]
        monkeypatch.setattr(_gpu.GpuTableMap, "check",
                            lambda self: -errno.ESTALE if self is resident else 0)
        assert step.error == 15
        with pytest.warns(RuntimeWarning, match="layer.s. 14 .ESTALE.") as caught:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step.run()
        assert len(_ours(caught)) == 1
        assert step.routes == {1: "row cache", 14: "arena"}
        assert step.error == 0  # the latest capture no longer reads it
        graph.replay()
        torch.cuda.synchronize()
        assert step.error == 0
        _assert_first_step(step, hasher, hash_tables, tokens)


@pytest.mark.gpu
def test_lookup_reads_resident_and_cached_rows_in_place_on_the_gpu(tier_daemon, tables):
    """EngramLookup on a GPU: layer 14 dequantised from its mapping, layer 1's hits from the row
    cache with its misses requested by the GPU; padding +0.0; equal to the arena lookup and the
    reference, eagerly (each step twice: the second time layer 1's rows are cached) and
    captured."""
    import torch
    import reference
    heads, rng = 6, np.random.default_rng(41)
    with engram.EngramLookup([1, 14], heads, 32, device="cuda", socket=tier_daemon.socket) as gpu, \
            engram.EngramLookup([1, 14], heads, 32, device="cuda", socket=tier_daemon.socket,
                                in_place=False) as arena:
        assert gpu.routes == {1: "row cache", 14: "resident"}
        assert arena.routes == {1: "arena", 14: "arena"}
        steps = []
        for tokens in (32, 1, 17):
            ids = {layer: rng.integers(0, SYNTH_ROWS, size=(tokens, heads)) for layer in (1, 14)}
            ids[14][0, 0] = ids[1][0, 1] = -1  # padding reads as +0.0
            steps.append(ids)
        hit_rows = 0
        for ids in steps + steps:
            for lookup in (gpu, arena):
                lookup.prepare(ids)
            for layer in (1, 14):
                got = reference.bits(gpu.get(layer).cpu())
                assert torch.equal(got, reference.bits(arena.get(layer).cpu()))
                want = reference.embeddings(tables, layer, ids[layer])
                assert torch.equal(got, reference.bits(want)), layer
            torch.cuda.synchronize()
            hit_rows += gpu.report_hits().get(1, 0)
        assert hit_rows > 0
        # Captured: the graph reads each later prepare()'s rows (same token count), and no
        # request for the resident table reaches the daemon.
        before = _table_entry(tier_daemon, "stats", 14)["store_requests"]
        ids = steps[0]
        gpu.prepare(ids)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = {layer: gpu.get(layer) for layer in (1, 14)}
        for replay in range(4):
            ids = {layer: rng.integers(0, SYNTH_ROWS, size=(32, heads)) for layer in (1, 14)}
            ids[14][5, 2] = ids[1][replay, 3] = -1
            gpu.prepare(ids)
            graph.replay()
            torch.cuda.synchronize()
            for layer in (1, 14):
                assert torch.equal(reference.bits(out[layer].cpu()),
                                   reference.bits(reference.embeddings(tables, layer,
                                                                       ids[layer]))), layer
        assert _table_entry(tier_daemon, "stats", 14)["store_requests"] == before


@pytest.mark.gpu
def test_lookup_falls_back_and_refuses_a_stale_captured_table(tier_daemon, tables, monkeypatch):
    import errno
    import torch
    import reference
    from engram import _gpu
    heads, rng = 4, np.random.default_rng(43)
    with engram.EngramLookup([14], heads, 8, device="cuda", socket=tier_daemon.socket) as lookup:
        assert lookup.routes == {14: "resident"}
        ids = {14: rng.integers(0, SYNTH_ROWS, size=(8, heads))}
        lookup.prepare(ids)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            lookup.get(14)
        graph.replay()
        torch.cuda.synchronize()
        monkeypatch.setattr(_gpu.GpuTableMap, "check", lambda self: -errno.ESTALE)
        with pytest.raises(engram.EngramError, match="capture it again"):
            lookup.prepare(ids)
        assert lookup.routes == {14: "arena"}
        lookup.prepare(ids)  # now through the arena (copied in place on the host)
        got = lookup.get(14)
        assert torch.equal(reference.bits(got.cpu()),
                           reference.bits(reference.embeddings(tables, 14, ids[14])))
    monkeypatch.undo()
    _refuse_registration(monkeypatch)
    with pytest.warns(RuntimeWarning, match="registering refused") as caught:
        lookup = engram.EngramLookup([14], heads, 8, device="cuda", socket=tier_daemon.socket)
    assert len(_ours(caught)) == 1
    with lookup:
        assert lookup.routes == {14: "arena"}
        lookup.prepare(ids)
        assert torch.equal(reference.bits(lookup.get(14).cpu()),
                           reference.bits(reference.embeddings(tables, 14, ids[14])))
