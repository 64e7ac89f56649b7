# Admission prefetch from Python: Client.admit / admit_done and EngramLookup.admit /
# admit_tokens / admit_done against an engramd whose tables are cached, checked through
# engramctl's status ("store"."admissions", "store"."cache") and stats (rows hit per table).
import errno
import time

import numpy as np
import pytest

import engram
from conftest import Daemon, SYNTH_ROWS, engramctl_json
from test_hashing import HEADS, _stream, hash_model  # noqa: F401  (module fixture)

# 1 MiB of row cache holds 2,835 rows: far fewer than the 8,192 of the two tables, so a pass
# over them evicts whatever is not pinned; admissions may pin a quarter of it (708 rows).
SMALL_CACHE = ["--tier", "1=cache", "--tier", "14=cache", "--cache-bytes", "1M"]


@pytest.fixture(scope="module")
def cached_daemon(checkpoint, tmp_path_factory):
    d = Daemon(checkpoint, tmp_path_factory.mktemp("engramd-admit"), SMALL_CACHE)
    yield d
    d.stop()


def store(daemon):
    return engramctl_json(daemon, "status")["store"]


def pinned(daemon):
    """(pins the admissions hold, rows the row cache has pinned)."""
    s = store(daemon)
    return s["admissions"]["pinned_rows"], s["cache"]["pinned_rows"]


def table_stats(daemon, layer):
    return next(t for t in engramctl_json(daemon, "stats")["tables"] if t["layer"] == layer)


def wait_for(what, predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def wait_queue_empty(daemon):
    wait_for("the prefetch queue to drain",
             lambda: engramctl_json(daemon, "status")["prefetch"]["queue_rows"] == 0)


def hits_of(daemon, client, layer, ids, expected_rows):
    """Rows of a gather of `ids` through engramd that its row cache held; checks their bytes."""
    before = table_stats(daemon, layer)["store_hit_rows"]
    rows = client.gather(layer, ids, array="numpy", in_place=False)
    assert np.array_equal(rows, expected_rows(layer, ids))
    client.release(rows)
    return table_stats(daemon, layer)["store_hit_rows"] - before


def test_admitted_rows_stay_cached_through_a_flood(cached_daemon, expected_rows):
    """Admitted rows are read in and survive passes over every other row, more than the cache
    holds, where rows merely prefetched are evicted: all hits, then unpinned by admit_done."""
    order = np.random.default_rng(11).permutation(SYNTH_ROWS)
    admitted, control, others = order[:300], order[300:600], order[600:]
    with engram.Client(cached_daemon.socket) as c:
        assert c.admit(1, 1, admitted) == 300
        assert c.prefetch(1, control) == 300
        wait_queue_empty(cached_daemon)
        assert pinned(cached_daemon) == (300, 300)
        evictions = store(cached_daemon)["cache"]["evictions"]
        for _ in range(2):
            for layer, ids in ((1, others), (14, np.arange(SYNTH_ROWS))):
                rows = c.gather(layer, ids, array="numpy", in_place=False)
                c.release(rows)
        cache = store(cached_daemon)["cache"]
        assert cache["evictions"] - evictions > cache["capacity_rows"]
        assert cache["pinned_evictions"] == 0 and cache["pinned_rows"] == 300
        assert hits_of(cached_daemon, c, 1, admitted, expected_rows) == 300
        assert hits_of(cached_daemon, c, 1, control, expected_rows) < 30  # the flood works
        assert c.admit_done(1) is True
    assert pinned(cached_daemon) == (0, 0)


def test_admit_done_releases_once(cached_daemon):
    """admit_done is True once, then False; more calls add rows to one admission; the pins go
    back to 0 in the admissions' count and the row cache's."""
    before = store(cached_daemon)["admissions"]
    with engram.Client(cached_daemon.socket) as c:
        assert c.admit(2, 14, np.arange(0, 100)) == 100
        assert c.admit(2, 1, np.arange(100, 150)) == 50
        wait_queue_empty(cached_daemon)
        admissions = store(cached_daemon)["admissions"]
        assert admissions["active"] - before["active"] == 1
        assert admissions["reserved_rows"] == 150
        assert pinned(cached_daemon) == (150, 150)
        assert c.admit_done(2) is True
        assert pinned(cached_daemon) == (0, 0)
        assert c.admit_done(2) is False
        assert c.admit_done(99) is False  # never admitted
        after = store(cached_daemon)["admissions"]
        assert after["released"] - before["released"] == 1
        assert after["active"] == 0 and after["reserved_rows"] == 0
        assert c.admit(3, 1, []) == 0  # nothing to pin: no admission
        assert c.admit_done(3) is False


def test_session_end_and_ttl_release_pins(cached_daemon):
    """Pins go when the session ends, and when the ttl (seconds) passes: not before."""
    before = store(cached_daemon)["admissions"]
    with engram.Client(cached_daemon.socket) as c:
        c.admit(4, 1, np.arange(200, 260))
        wait_queue_empty(cached_daemon)
        assert pinned(cached_daemon) == (60, 60)
    wait_for("the ended session's pins to go", lambda: pinned(cached_daemon) == (0, 0))
    assert store(cached_daemon)["admissions"]["ended"] - before["ended"] == 1

    with engram.Client(cached_daemon.socket) as c:
        start = time.monotonic()
        c.admit(5, 14, np.arange(300, 340), ttl=2.0)
        wait_queue_empty(cached_daemon)
        assert pinned(cached_daemon) == (40, 40)
        wait_for("the admission to expire", lambda: pinned(cached_daemon) == (0, 0))
        assert time.monotonic() - start > 1.9
        assert store(cached_daemon)["admissions"]["expired"] - before["expired"] == 1
        assert c.admit_done(5) is False


def test_admit_refuses_bad_arguments(cached_daemon):
    with engram.Client(cached_daemon.socket) as c:
        for bad in (-1, 2**64, 1.5, True, "7"):
            with pytest.raises(engram.InvalidArgumentError, match="request id"):
                c.admit(bad, 1, [1])
        with pytest.raises(engram.InvalidArgumentError, match="ttl"):
            c.admit(6, 1, [1], ttl=-1)
        with pytest.raises(engram.RowOutOfRangeError, match=f"row {SYNTH_ROWS}"):
            c.admit(6, 14, [1, SYNTH_ROWS])
        with pytest.raises(engram.UnknownTableError, match="layer 99"):
            c.admit(6, 99, [1])
        with pytest.raises(engram.RowOutOfRangeError, match="negative"):
            c.admit(6, 1, [-3])
        assert c.admit_done(6) is False
    assert pinned(cached_daemon) == (0, 0)


class _WithoutAdmit:
    """A client library as one built before ENGRAM_0.8 looks: no engram_admit*."""

    def __init__(self, lib):
        self._real = lib

    def __getattr__(self, name):
        if name.startswith("engram_admit"):
            raise AttributeError(name)
        return getattr(self._real, name)


def test_a_library_without_admit_says_so(cached_daemon):
    with engram.Client(cached_daemon.socket) as c:
        c._lib = _WithoutAdmit(c._lib)
        for call in (lambda: c.admit(1, 1, [1]), lambda: c.admit_done(1)):
            with pytest.raises(engram.AdmissionUnsupportedError, match="ENGRAM_0.8") as info:
                call()
            assert isinstance(info.value, engram.PrefetchUnsupportedError)
            assert info.value.code == -errno.EOPNOTSUPP


def test_pin_bounds_raise_naming_the_setting(checkpoint, tmp_path):
    """memory.admit_session_rows bounds one session's pins, memory.admit_rows every session's;
    a refused call reserves nothing."""
    d = Daemon(checkpoint, tmp_path, SMALL_CACHE + ["--admit-session-rows", "100",
                                                    "--admit-rows", "150"])
    try:
        with engram.Client(d.socket) as a, engram.Client(d.socket) as b:
            with pytest.raises(engram.ResourceExhaustedError,
                               match="memory.admit_session_rows") as info:
                a.admit(1, 1, np.arange(101))
            assert info.value.code == -errno.ENOSPC
            admissions = store(d)["admissions"]
            assert admissions["reserved_rows"] == 0 and admissions["refused_rows"] == 101
            assert a.admit_done(1) is False
            assert a.admit(1, 1, np.arange(100)) == 100
            with pytest.raises(engram.ResourceExhaustedError, match="memory.admit_rows"):
                b.admit(1, 14, np.arange(60))
            assert a.admit_done(1) is True
            assert b.admit(1, 14, np.arange(60)) == 60
            wait_queue_empty(d)
            assert pinned(d) == (60, 60)
    finally:
        d.stop()


def test_lookup_admit_skips_padding_and_repeats(cached_daemon):
    """EngramLookup.admit pins each row of a layer once, skips padding, takes a whole prompt
    (more tokens than a step) and checks rows as prefetch() does."""
    heads = 4
    ids = np.arange(40 * heads, dtype=np.int64).reshape(40, heads) % 50 + 500
    ids[3, 2] = -1
    with engram.EngramLookup([1, 14], heads, 16, device="cpu", socket=cached_daemon.socket,
                             in_place=False) as lk:
        # Layer 1: rows 500..549; layer 14: 500..519 but for the padded slot's 514.
        assert lk.admit(1, {1: ids, 14: ids[:5]}) == 50 + 19
        wait_queue_empty(cached_daemon)
        assert pinned(cached_daemon) == (69, 69)
        bad = ids.copy()
        bad[7, 1] = SYNTH_ROWS
        with pytest.raises(ValueError, match=r"token 7, head 1"):
            lk.admit(2, {14: bad})
        with pytest.raises(ValueError, match="not layers of this lookup"):
            lk.admit(2, {3: ids})
        assert lk.admit_done(1) is True and lk.admit_done(1) is False
        assert pinned(cached_daemon) == (0, 0)
        lk.admit(3, [ids, ids])
    # close() ends the lookup's sessions, which releases their admissions.
    wait_for("the closed lookup's pins to go", lambda: pinned(cached_daemon) == (0, 0))


def test_lookup_hints_leave_its_completion_counter_alone(cached_daemon):
    """Prefetches and admissions complete on a session of their own: the lookup's completion
    counter, which the GPU waits on for a step's gathers, counts only its gathers."""
    ids = np.arange(8, dtype=np.int64).reshape(2, 4)
    with engram.EngramLookup([1, 14], 4, 16, device="cpu", socket=cached_daemon.socket,
                             in_place=False) as lk:
        assert lk.admit_done(1) is False  # nothing admitted yet
        counter = lk._counter.value
        lk.prefetch({1: ids, 14: ids})
        lk.admit(1, {1: ids, 14: ids})
        assert lk.admit_done(1) is True
        assert lk._counter.value == counter
        lk.prepare({1: ids, 14: ids})
        lk.wait()
        assert lk._counter.value == counter + 2 == lk._target.value


@pytest.fixture(scope="module")
def cached_hash_daemon(hash_model, tmp_path_factory):  # noqa: F811
    d = Daemon(hash_model[0], tmp_path_factory.mktemp("engramd-admit-hash"),
               ["--tier", "1=cache", "--tier", "14=cache", "--cache-bytes", "16M"])
    yield d
    d.stop()


def _recording(lookup):
    """{layer: row ids} the lookup hands Client.admit, recorded as it calls it."""
    calls = {}
    hints = lookup._hint_client()
    admit = hints.admit

    def record(request_id, layer, rows, **kwargs):
        assert layer not in calls, f"layer {layer} admitted twice"
        calls[layer] = np.asarray(rows).copy()
        return admit(request_id, layer, rows, **kwargs)
    hints.admit = record
    return calls


def test_lookup_admit_tokens_pins_what_its_prefill_gathers(cached_hash_daemon,
                                                           hash_model):  # noqa: F811
    """admit_tokens of a prompt admits, per layer, exactly the rows the lookup's chunked
    prefill of it then gathers (all heads, and a TP rank's), and the prefill finds every one
    of them in the row cache."""
    model, _, _, vocab_size = hash_model
    prompt = _stream(150, vocab_size, 5)
    chunks = [(0, 64), (64, 64), (128, 22)]
    with engram.Hasher(model) as hasher, \
            engram.EngramLookup([1, 14], HEADS, 64, device="cpu", in_place=False,
                                socket=cached_hash_daemon.socket) as full, \
            engram.EngramLookup([14, 1], 6, 64, device="cpu", in_place=False,
                                socket=cached_hash_daemon.socket) as rank:
        tp = {"tp_size": 4, "tp_rank": 2}
        admitted = {}
        for name, lookup, kwargs in (("full", full, {}), ("rank", rank, tp)):
            admitted[name] = _recording(lookup)
            queued = lookup.admit_tokens(1, hasher, prompt, **kwargs)
            assert queued == sum(rows.size for rows in admitted[name].values())
        wait_queue_empty(cached_hash_daemon)
        total = sum(rows.size for calls in admitted.values() for rows in calls.values())
        assert pinned(cached_hash_daemon)[0] == total
        before = {layer: table_stats(cached_hash_daemon, layer) for layer in (1, 14)}
        gathered = {name: {1: set(), 14: set()} for name in admitted}
        for at, n in chunks:
            new, history = prompt[at:at + n], prompt[max(0, at - 3):at]
            for name, lookup, kwargs in (("full", full, {}), ("rank", rank, tp)):
                lookup.prepare_tokens(hasher, new, history=history, **kwargs)
                lookup.wait()
                for layer in (1, 14):
                    staged = lookup._layers[layer]
                    gathered[name][layer].update(staged.ids[:staged.num_rows].tolist())
        for name, calls in admitted.items():
            for layer in (1, 14):
                assert np.array_equal(calls[layer], np.unique(calls[layer]))
                assert set(calls[layer].tolist()) == gathered[name][layer], (name, layer)
        # The rank's heads are 12..17 of the full lookup's.
        for layer in (1, 14):
            assert gathered["rank"][layer] < gathered["full"][layer]
            after = table_stats(cached_hash_daemon, layer)
            asked = after["store_rows"] - before[layer]["store_rows"]
            assert asked == (150 * HEADS + 150 * 6)
            assert after["store_hit_rows"] - before[layer]["store_hit_rows"] == asked
        assert full.admit_done(1) is True and rank.admit_done(1) is True
    assert pinned(cached_hash_daemon) == (0, 0)
