# Chunk pipelining from Python: EngramLookup.prepare(..., next_row_ids=) and
# prepare_tokens(..., next_tokens=, next_history=) hand engramd the next chunk's rows once the
# step's gathers are submitted, against an engramd whose tables are cached; checked through
# engramctl's statistics (rows hinted and fetched, then hit by the next chunk's gathers).
import time

import numpy as np
import pytest
import torch

import engram
import reference
from conftest import Daemon, SYNTH_ROWS, engramctl_json
from test_hashing import HEADS as HASH_HEADS, _stream, hash_model  # noqa: F401  (fixture)

LAYERS = (1, 14)
HEADS, CHUNK = 4, 8  # a chunk: CHUNK tokens of HEADS rows per layer
# Every row fits in the cache; no hint is shed (a loaded machine's reads can fall a second
# behind), so that every row hinted is read.
CACHED = ["--tier", "1=cache", "--tier", "14=cache", "--cache-bytes", "4M", "--miss-shed-ms", "0"]

# Each test takes rows no earlier test touched: a row once gathered or hinted stays cached.
_ORDER = iter(np.random.default_rng(23).permutation(SYNTH_ROWS))


def fresh_chunk():
    """A chunk's row ids [CHUNK, HEADS], distinct rows no test has used yet."""
    return np.array([next(_ORDER) for _ in range(CHUNK * HEADS)],
                    dtype=np.int64).reshape(CHUNK, HEADS)


@pytest.fixture(scope="module")
def cached_daemon(checkpoint, tmp_path_factory):
    d = Daemon(checkpoint, tmp_path_factory.mktemp("engramd-next-chunk"), CACHED)
    yield d
    d.stop()


def table_stats(daemon):
    return {t["layer"]: t for t in engramctl_json(daemon, "stats")["tables"]}


def grown(before, after, key):
    """{layer: how much `key` grew} between two table_stats()."""
    return {layer: after[layer][key] - before[layer][key] for layer in before}


def wait_hints_worked(daemon, timeout=60):
    """Waits until every row ever hinted was fetched, held, dropped or failed; the stats."""
    deadline = time.monotonic() + timeout
    while True:
        now = table_stats(daemon)
        if all(t["prefetch_requested_rows"] == sum(t[f"prefetch_{what}_rows"] for what in
                                                   ("fetched", "held", "dropped", "failed"))
               for t in now.values()):
            return now
        assert time.monotonic() < deadline, "the hints were not worked"
        time.sleep(0.02)


def lookup(daemon, in_place, max_tokens=CHUNK):
    return engram.EngramLookup(LAYERS, HEADS, max_tokens, device="cpu", socket=daemon.socket,
                               in_place=in_place)


def assert_step_is(lk, tables, ids):
    for layer in LAYERS:
        want = reference.embeddings(tables, layer, ids)
        assert torch.equal(reference.bits(lk.get(layer)), reference.bits(want)), layer


BOTH = pytest.mark.parametrize("in_place", [False, True], ids=["through-engramd", "in-place"])


@BOTH
def test_the_next_chunk_is_fetched_and_then_hits(cached_daemon, tables, in_place):
    """The chunk named as the next one is read into the row cache while the step computes
    (padding left out), and its own step then finds every row there; a chunk no step named is
    not read ahead, and misses."""
    first, second, third = fresh_chunk(), fresh_chunk(), fresh_chunk()
    second[2, 1] = -1  # padding: not hinted
    hinted = second.size - 1
    with lookup(cached_daemon, in_place) as lk:
        before = table_stats(cached_daemon)
        lk.prepare({1: first, 14: first}, next_row_ids={1: second, 14: second})
        assert_step_is(lk, tables, first)
        after = wait_hints_worked(cached_daemon)
        assert grown(before, after, "prefetch_requested_rows") == {1: hinted, 14: hinted}
        assert grown(before, after, "prefetch_fetched_rows") == {1: hinted, 14: hinted}

        for chunk, hits in ((second, hinted), (third, 0)):
            before, session = table_stats(cached_daemon), lk.stats()
            lk.prepare([chunk, chunk])  # names no next chunk
            lk.wait()
            assert_step_is(lk, tables, chunk)
            after, rows = table_stats(cached_daemon), int((chunk >= 0).sum())
            assert grown(before, after, "store_rows") == {1: rows, 14: rows}
            assert grown(before, after, "store_hit_rows") == {1: hits, 14: hits}
            assert grown(before, after, "prefetch_requested_rows") == {1: 0, 14: 0}
            # In place, the hits are copied here (not prefetch uses); only the misses reach
            # engramd.
            through_engramd = 2 * (rows - hits) if in_place else 2 * rows
            assert lk.stats().rows - session.rows == through_engramd
            used = 0 if in_place else hits
            assert grown(before, after, "prefetch_used_rows") == {1: used, 14: used}


@BOTH
def test_the_next_chunk_is_hinted_after_the_step_is_submitted(cached_daemon, in_place):
    """The step's gathers reach engramd before the hint, which names the layers in the order
    given."""
    first, second = fresh_chunk(), fresh_chunk()
    calls = []
    with lookup(cached_daemon, in_place) as lk:
        client, hints = lk._client, lk._hint_client()
        gather = client.gather_in_arena if in_place else client.submit_in_arena
        prefetch = hints.prefetch

        def gathering(layer, *args, **kwargs):
            calls.append(("gather", layer))
            return gather(layer, *args, **kwargs)

        def hinting(layer, rows):
            calls.append(("hint", layer, len(rows)))
            return prefetch(layer, rows)
        setattr(client, "gather_in_arena" if in_place else "submit_in_arena", gathering)
        hints.prefetch = hinting
        lk.prepare({14: first, 1: first}, next_row_ids={1: second, 14: second[:3]})
        assert calls == [("gather", 1), ("gather", 14), ("hint", 1, second.size),
                         ("hint", 14, 3 * HEADS)]
        calls.clear()
        lk.prepare({1: second, 14: second})  # no next chunk: no hint
        assert calls == [("gather", 1), ("gather", 14)]
    wait_hints_worked(cached_daemon)  # before the next test counts hints


@BOTH
def test_a_bad_next_chunk_raises_before_anything_is_submitted(cached_daemon, tables, in_place):
    """A next chunk prefetch() would refuse raises from prepare() naming layer, token and head,
    with nothing of the step submitted or staged and no hint sent; the lookup goes on."""
    first, second, third = fresh_chunk(), fresh_chunk(), fresh_chunk()
    bad_row = second.copy()
    bad_row[3, 2] = SYNTH_ROWS
    cases = [
        ({1: second, 14: bad_row}, engram.RowOutOfRangeError,
         rf"layer 14: row {SYNTH_ROWS} \(token 3, head 2\)"),
        ({1: np.zeros((2, HEADS + 1), dtype=np.int64)}, ValueError, r"shape \[tokens, 4\]"),
        ({14: np.zeros((CHUNK + 1, HEADS), dtype=np.int64)}, ValueError, "max_tokens"),
        ({3: second}, engram.UnknownTableError, "not layers of this lookup"),
        ([second], engram.InvalidArgumentError, "1 row id arrays for 2 layers"),
    ]
    with lookup(cached_daemon, in_place) as lk:
        lk.prepare({1: first, 14: first})
        lk.wait()
        before, session = table_stats(cached_daemon), lk.stats().as_dict()
        for next_ids, error, match in cases:
            with pytest.raises(error, match=match):
                lk.prepare({1: second, 14: second}, next_row_ids=next_ids)
        after = lk.stats().as_dict()
        for key in ("requests_submitted", "rows", "rows_in_place"):
            assert after[key] == session[key], key
        assert grown(before, table_stats(cached_daemon), "prefetch_requested_rows") == \
            {1: 0, 14: 0}
        assert_step_is(lk, tables, first)  # the step in flight is still the first
        lk.prepare({1: second, 14: second}, next_row_ids=[third, third])
        assert_step_is(lk, tables, second)
        after = wait_hints_worked(cached_daemon)
        assert grown(before, after, "prefetch_fetched_rows") == {1: third.size, 14: third.size}


def test_a_next_chunk_past_the_sessions_bound_is_dropped(checkpoint, tmp_path, tables):
    """Rows engramd has no room for (limits.prefetch_session_rows) are a hint dropped: the step
    is prepared all the same, where prefetch() of the same rows raises."""
    d = Daemon(checkpoint, tmp_path, CACHED + ["--prefetch-session-rows", "100"])
    try:
        rng = np.random.default_rng(4)
        first, second = (rng.integers(0, SYNTH_ROWS, (32, HEADS)) for _ in range(2))
        with lookup(d, in_place=False, max_tokens=32) as lk:
            before = table_stats(d)
            with pytest.raises(engram.ResourceExhaustedError, match="prefetch_session_rows"):
                lk.prefetch({1: second})
            lk.prepare({1: first, 14: first}, next_row_ids={1: second, 14: second[:20]})
            assert_step_is(lk, tables, first)
            after = wait_hints_worked(d)
            # Layer 1's 128 rows were refused, layer 14's 80 queued.
            assert grown(before, after, "prefetch_requested_rows") == {1: 0, 14: 80}
    finally:
        d.stop()


@pytest.mark.gpu
def test_the_next_chunk_hits_in_the_row_cache_read_on_the_gpu(cached_daemon, tables):
    """On a GPU reading the row caches in place (the step's misses requested by get(), after
    the hint): the next chunk's rows are all hits of its own step, reported as such, where the
    chunk that was not named has none; the values are the reference's."""
    first, second, third = fresh_chunk(), fresh_chunk(), fresh_chunk()
    with engram.EngramLookup(LAYERS, HEADS, CHUNK, device="cuda",
                             socket=cached_daemon.socket) as lk:
        assert lk.routes == {1: "row cache", 14: "row cache"}
        for chunk, upcoming, hits in ((first, second, 0), (second, None, second.size),
                                      (third, None, 0)):
            lk.prepare([chunk, chunk], next_row_ids=None if upcoming is None else
                       [upcoming, upcoming])
            for layer in LAYERS:
                want = reference.embeddings(tables, layer, chunk)
                assert torch.equal(reference.bits(lk.get(layer).cpu()), reference.bits(want))
            torch.cuda.synchronize()
            assert lk.report_hits() == {1: hits, 14: hits}
            wait_hints_worked(cached_daemon)


@pytest.fixture(scope="module")
def cached_hash_daemon(hash_model, tmp_path_factory):  # noqa: F811
    d = Daemon(hash_model[0], tmp_path_factory.mktemp("engramd-next-chunk-hash"),
               ["--tier", "1=cache", "--tier", "14=cache", "--cache-bytes", "16M",
                "--miss-shed-ms", "0"])
    yield d
    d.stop()


def test_prepare_tokens_hints_the_next_chunk(cached_hash_daemon, hash_model):  # noqa: F811
    """A chunked prefill through prepare_tokens: the chunk named as next (with its history, the
    previous chunk's last ids) hits in the row cache for every row its step gathers; the chunk
    after it, named by no step, mostly misses. A next chunk whose ids the hasher refuses raises
    before anything is submitted."""
    model, _, _, vocab_size = hash_model
    prompt = _stream(96, vocab_size, 9)
    chunks = [prompt[at:at + 32] for at in (0, 32, 64)]
    rows = 32 * HASH_HEADS
    with engram.Hasher(model) as hasher, \
            engram.EngramLookup(LAYERS, HASH_HEADS, 32, device="cpu", in_place=False,
                                socket=cached_hash_daemon.socket) as lk:
        with pytest.raises(engram.InvalidArgumentError, match=f"{vocab_size}"):
            lk.prepare_tokens(hasher, chunks[0], next_tokens=[1, vocab_size],
                              next_history=chunks[0][-3:])
        assert lk.stats().requests_submitted == 0
        before = table_stats(cached_hash_daemon)
        lk.prepare_tokens(hasher, chunks[0], next_tokens=chunks[1], next_history=chunks[0][-3:])
        lk.wait()
        after = wait_hints_worked(cached_hash_daemon)
        assert grown(before, after, "prefetch_requested_rows") == {1: rows, 14: rows}
        for what in ("dropped", "failed"):
            assert grown(before, after, f"prefetch_{what}_rows") == {1: 0, 14: 0}, what
        for at, chunk in enumerate(chunks[1:], 1):
            before = table_stats(cached_hash_daemon)
            lk.prepare_tokens(hasher, chunk, history=chunks[at - 1][-3:])
            lk.wait()
            after = table_stats(cached_hash_daemon)
            assert grown(before, after, "store_rows") == {1: rows, 14: rows}
            hits = grown(before, after, "store_hit_rows")
            if at == 1:
                assert hits == {1: rows, 14: rows}
            else:  # only rows it shares with the chunks before it
                assert all(n < rows // 2 for n in hits.values()), hits
