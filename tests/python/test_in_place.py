# Client.gather's in-place path (the default, and in_place=True) against an engramd with a
# resident and a cached table: rows of the resident table are copied in this process from its
# mapping (the daemon never sees the requests), the cached table's hits from the mapped row cache
# with only its misses gathered by the daemon; bad ids fail as they fail through the daemon; the
# opt-outs (in_place=False, Client(in_place=False), ENGRAM_IN_PLACE=0) reach the daemon.
import time

import numpy as np
import pytest

import engram
from conftest import Daemon, SYNTH_ROWS, engramctl_json


@pytest.fixture(scope="module")
def store_daemon(checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("engramd-in-place")
    d = Daemon(checkpoint, folder,
               ["--tier", "14=resident", "--tier", "1=cache", "--cache-bytes", "4M"])
    yield d
    d.stop()


def table_entry(daemon, command, layer):
    return next(t for t in engramctl_json(daemon, command)["tables"] if t["layer"] == layer)


def wait_resident(daemon):
    deadline = time.monotonic() + 60
    while not table_entry(daemon, "tables", 14)["resident_loaded"]:
        assert time.monotonic() < deadline, "layer 14 did not become resident"
        time.sleep(0.02)


def test_in_place_reads_a_resident_table_without_the_daemon(store_daemon, expected_rows):
    wait_resident(store_daemon)
    ids = np.random.default_rng(5).integers(0, SYNTH_ROWS, 1152)
    before = table_entry(store_daemon, "stats", 14)["store_requests"]
    with engram.Client(store_daemon.socket) as c:
        for _ in range(3):
            rows = c.gather(14, ids, array="numpy", in_place=True)
            assert np.array_equal(rows, expected_rows(14, ids))
            c.release(rows)
        tensor = c.gather(14, ids[:8], in_place=True)
        assert np.array_equal(tensor.numpy(), expected_rows(14, ids[:8]))
        # The cached table: its hits here, its misses through the daemon.
        rows = c.gather(1, ids, array="numpy", in_place=True)
        assert np.array_equal(rows, expected_rows(1, ids))
        c.release(rows)
        stats = c.stats()
        assert stats.rows_in_place + stats.rows == 4 * 1152 + 8
    # The daemon served none of layer 14's gathers; it counts them from the session's touch page.
    assert table_entry(store_daemon, "stats", 14)["store_requests"] == before + 4


def test_in_place_reads_cached_rows_from_the_row_cache(store_daemon, expected_rows):
    ids = np.random.default_rng(6).integers(0, 2000, 1152)
    with engram.Client(store_daemon.socket) as c:
        for _ in range(2):  # through the daemon: every row cached afterwards
            c.release(c.gather(1, ids, array="numpy", in_place=False))
        before = c.stats()
        table_before = table_entry(store_daemon, "stats", 1)
        rows = c.gather(1, ids, array="numpy", in_place=True)
        assert np.array_equal(rows, expected_rows(1, ids))
        after = c.stats()
        table_after = table_entry(store_daemon, "stats", 1)
    # Every row copied here, no request sent; the daemon's statistics count them all the same.
    assert after.rows_in_place - before.rows_in_place == 1152
    assert after.rows == before.rows
    assert after.requests_submitted == before.requests_submitted
    for key, grew in [("store_requests", 1), ("store_all_hit_requests", 1), ("store_rows", 1152),
                      ("store_hit_rows", 1152)]:
        assert table_after[key] - table_before[key] == grew, key


def test_in_place_refuses_a_bad_row_as_the_daemon_does(store_daemon):
    wait_resident(store_daemon)
    with engram.Client(store_daemon.socket) as c:
        with pytest.raises(engram.RowOutOfRangeError) as in_place:
            c.gather(14, [1, SYNTH_ROWS + 5], in_place=True)
        with pytest.raises(engram.RowOutOfRangeError) as daemon:
            c.gather(14, [1, SYNTH_ROWS + 5], in_place=False)
    assert "read in place" in str(in_place.value)
    assert f"row {SYNTH_ROWS + 5} (index 1) is past the end of layer 14" in str(in_place.value)
    assert str(daemon.value).split("engramd: ")[-1] in str(in_place.value)


def test_lookup_in_place_equals_the_reference(store_daemon, tables):
    """EngramLookup(in_place=True): layer 14 (resident) copied by the lookup itself, layer 1
    (cached) from the row cache where it holds the rows, the rest through the daemon; every step
    bit-exact with the reference."""
    import torch
    import reference
    wait_resident(store_daemon)
    heads = 6
    rng = np.random.default_rng(9)
    before = table_entry(store_daemon, "stats", 14)["store_requests"]
    with engram.EngramLookup([1, 14], heads, 32, device="cpu", socket=store_daemon.socket,
                             in_place=True) as lookup:
        for tokens in [32, 1, 17]:
            ids = {layer: rng.integers(0, SYNTH_ROWS, size=(tokens, heads)) for layer in (1, 14)}
            ids[14][0, 0] = -1  # padding reads as zeros
            lookup.prepare(ids)
            for layer in (1, 14):
                want = reference.embeddings(tables, layer, ids[layer])
                assert torch.equal(reference.bits(lookup.get(layer)), reference.bits(want))
        stats = lookup.stats()
        assert stats.rows_in_place > 0
        # Layer 1's steps only, and only those with a row the cache did not hold.
        assert 1 <= stats.requests_ok <= 3
        # A bad row raises from prepare() itself, naming the layer.
        bad = {1: np.zeros((1, heads), dtype=np.int64), 14: np.zeros((1, heads), dtype=np.int64)}
        bad[14][0, 2] = SYNTH_ROWS
        with pytest.raises(engram.RowOutOfRangeError, match="layer 14"):
            lookup.prepare(bad)
    # Layer 14's three steps, read in place and counted from the touch page; the refused one not.
    assert table_entry(store_daemon, "stats", 14)["store_requests"] == before + 3


def test_plain_gather_reads_in_place_and_the_opt_outs_reach_the_daemon(store_daemon, expected_rows,
                                                                      monkeypatch):
    wait_resident(store_daemon)
    ids = np.random.default_rng(11).integers(0, 1500, 512)
    before = table_entry(store_daemon, "stats", 14)["store_requests"]
    with engram.Client(store_daemon.socket) as c:
        s0 = c.stats()
        plain = c.gather(14, ids, array="numpy")
        s1 = c.stats()
        assert (s1.rows_in_place - s0.rows_in_place, s1.rows - s0.rows) == (512, 0)
        # Read in place, and counted by engramd all the same (the session's touch page).
        assert table_entry(store_daemon, "stats", 14)["store_requests"] == before + 1
        daemon = c.gather(14, ids, array="numpy", in_place=False)
        s2 = c.stats()
        assert (s2.rows_in_place - s1.rows_in_place, s2.rows - s1.rows) == (0, 512)
        assert np.array_equal(plain, daemon)
        assert np.array_equal(plain, expected_rows(14, ids))
        # The cache tier: once engramd has read the rows, a plain gather copies the hits here.
        for _ in range(2):
            c.release(c.gather(1, ids, array="numpy", in_place=False))
        s3 = c.stats()
        cached = c.gather(1, ids, array="numpy")
        s4 = c.stats()
        assert np.array_equal(cached, expected_rows(1, ids))
        assert s4.rows_in_place - s3.rows_in_place > 256
        assert (s4.rows_in_place - s3.rows_in_place) + (s4.rows - s3.rows) == 512
        # gather_in_arena: the same defaults.
        with c.alloc(512 * 8) as buf_ids, c.alloc(512 * engram.ROW_BYTES) as dest:
            buf_ids.numpy(np.uint64, 512)[:] = ids
            c.gather_in_arena(14, buf_ids, 512, dest)
            s5 = c.stats()
            assert s5.rows_in_place - s4.rows_in_place == 512
            c.gather_in_arena(14, buf_ids, 512, dest, in_place=False)
            assert c.stats().rows - s5.rows == 512
            assert np.array_equal(dest.numpy(np.uint8, 512 * engram.ROW_BYTES),
                                  plain.reshape(-1))
    # A session whose default is the daemon; in_place=True still reads in place.
    with engram.Client(store_daemon.socket, in_place=False) as c:
        rows = c.gather(14, ids, array="numpy")
        assert np.array_equal(rows, plain)
        assert (c.stats().rows_in_place, c.stats().rows) == (0, 512)
        c.release(c.gather(14, ids, array="numpy", in_place=True))
        assert c.stats().rows_in_place == 512
    # ENGRAM_IN_PLACE=0: every new session's default is the daemon, the lookup's too.
    monkeypatch.setenv("ENGRAM_IN_PLACE", "0")
    with engram.Client(store_daemon.socket) as c:
        c.release(c.gather(14, ids, array="numpy"))
        assert (c.stats().rows_in_place, c.stats().rows) == (0, 512)
    with engram.EngramLookup([14], 4, 8, device="cpu", socket=store_daemon.socket) as lookup:
        assert not lookup.in_place
    monkeypatch.setenv("ENGRAM_IN_PLACE", "maybe")
    with pytest.raises(engram.InvalidArgumentError, match="ENGRAM_IN_PLACE"):
        engram.Client(store_daemon.socket)


def test_lookup_reads_in_place_by_default(store_daemon):
    wait_resident(store_daemon)
    heads = 4
    ids = {14: np.random.default_rng(12).integers(0, SYNTH_ROWS, size=(8, heads))}
    before = table_entry(store_daemon, "stats", 14)["store_requests"]
    with engram.EngramLookup([14], heads, 8, device="cpu", socket=store_daemon.socket) as lookup:
        assert lookup.in_place
        lookup.prepare(ids)
        lookup.get(14)
        stats = lookup.stats()
        assert stats.rows_in_place == 8 * heads
        assert stats.requests_submitted == 0
    # The one gather read in place, counted by engramd from the session's touch page.
    assert table_entry(store_daemon, "stats", 14)["store_requests"] == before + 1
