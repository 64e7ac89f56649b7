# Prefetch from Python: Client.prefetch and EngramLookup.prefetch against an engramd whose tables
# are cached, checked through engramctl's statistics (rows fetched, then used by gathers).
import time

import numpy as np
import pytest

import engram
from conftest import Daemon, SYNTH_ROWS, engramctl_json


@pytest.fixture(scope="module")
def cached_daemon(checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("engramd-prefetch")
    d = Daemon(checkpoint, folder,
               ["--tier", "1=cache", "--tier", "14=cache", "--cache-bytes", "4M"])
    yield d
    d.stop()


ctl = engramctl_json


def table_stats(daemon, layer):
    return next(t for t in ctl(daemon, "stats")["tables"] if t["layer"] == layer)


def wait_prefetched(daemon):
    deadline = time.monotonic() + 60
    while ctl(daemon, "status")["prefetch"]["queue_rows"] != 0:
        assert time.monotonic() < deadline, "the prefetch queue did not drain"
        time.sleep(0.02)


def test_client_prefetch_then_gather_hits(cached_daemon, expected_rows):
    ids = np.random.default_rng(3).permutation(SYNTH_ROWS)[:300]
    before = table_stats(cached_daemon, 1)
    with engram.Client(cached_daemon.socket) as c:
        assert c.prefetch(1, ids) == 300
        wait_prefetched(cached_daemon)
        after = table_stats(cached_daemon, 1)
        assert after["prefetch_fetched_rows"] - before["prefetch_fetched_rows"] == 300
        # Through engramd: hits read in place do not count as prefetch uses.
        rows = c.gather(1, ids, array="numpy", in_place=False)
        assert np.array_equal(rows, expected_rows(1, ids))
        c.release(rows)
    after = table_stats(cached_daemon, 1)
    assert after["store_hit_rows"] - before["store_hit_rows"] == 300
    assert after["prefetch_used_rows"] - before["prefetch_used_rows"] == 300


def test_client_prefetch_refuses_a_bad_row_naming_it(cached_daemon):
    with engram.Client(cached_daemon.socket) as c:
        with pytest.raises(engram.RowOutOfRangeError) as info:
            c.prefetch(14, [1, SYNTH_ROWS + 5])
        assert f"row {SYNTH_ROWS + 5}" in str(info.value) and "layer 14" in str(info.value)
        with pytest.raises(engram.UnknownTableError, match="layer 99"):
            c.prefetch(99, [1])
        with pytest.raises(engram.RowOutOfRangeError, match="negative"):
            c.prefetch(1, [-3])
        assert c.prefetch(1, []) == 0


def test_lookup_prefetch_skips_padding_and_checks_rows(cached_daemon, expected_rows):
    heads = 4
    ids = np.arange(8 * heads, dtype=np.int64).reshape(8, heads) * 97 + 11
    ids[2, 1] = -1  # padding is not prefetched
    before = table_stats(cached_daemon, 14)
    with engram.EngramLookup([14], heads, 16, device="cpu", socket=cached_daemon.socket,
                             in_place=False) as lk:
        assert lk.prefetch({14: ids}) == ids.size - 1
        with pytest.raises(ValueError, match=r"token 3, head 2"):
            bad = ids.copy()
            bad[3, 2] = SYNTH_ROWS
            lk.prefetch([bad])
        with pytest.raises(ValueError, match="not layers of this lookup"):
            lk.prefetch({1: ids})
        wait_prefetched(cached_daemon)
        after = table_stats(cached_daemon, 14)
        assert after["prefetch_requested_rows"] - before["prefetch_requested_rows"] == ids.size - 1
        # The step itself then reads the prefetched rows from the cache.
        lk.prepare({14: ids})
        got = lk.get(14)
        assert got.shape == (8, heads, 256)
    after = table_stats(cached_daemon, 14)
    assert after["prefetch_used_rows"] - before["prefetch_used_rows"] == ids.size - 1
