# engram.Client against a real engramd serving a synthetic checkpoint: gathered bytes equal the
# checkpoint's, the arena's lifetime rules hold, and every failure raises the right exception.
import errno
import gc
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import engram
from conftest import LAYERS, REPO, SYNTH_ROWS, Daemon, engramctl_json


def test_protocol_version_and_library_path():
    major, minor = engram.protocol_version()
    assert major >= 1 and minor >= 0
    assert os.path.isfile(engram.library_path())


def test_meson_install_lists_every_module():
    """`meson install` copies the modules python/meson.build names: a module missing there
    makes the installed package fail at import."""
    import re
    listed = set(re.findall(r"'engram/([A-Za-z0-9_]+\.py)'", (REPO / "python" / "meson.build")
                            .read_text()))
    modules = {p.name for p in (REPO / "python" / "engram").glob("*.py")}
    assert modules - listed == set(), "modules python/meson.build does not install"
    assert listed - modules == set(), "python/meson.build names modules that do not exist"


def test_deprecated_c_names_are_aliases():
    """engram.h conventions 8-9: the ctypes structs name a table's id `layer`, with the older
    field names as aliases, and the ENGRAM_0.6 function names fall back on the older ones in a
    library that predates them. The older field names warn, as the C compiler does."""
    from engram import _lib
    with pytest.warns(DeprecationWarning, match=r"use \.layer"):
        request = _lib.GatherRequest(table=14)
    assert request.layer == 14
    with pytest.warns(DeprecationWarning, match=r"GatherRequest"):
        assert request.table == 14
    info = _lib.TableInfoStruct(layer=1)
    with pytest.warns(DeprecationWarning):
        assert info.layer_id == 1
    with pytest.warns(DeprecationWarning):
        assert _lib.HashLayerInfo(layer=14).layer_id == 14
    with pytest.warns(DeprecationWarning):
        assert _lib.TokenRequest(table=1).layer == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current name does not warn
        assert _lib.GatherRequest(layer=14).layer == 14

    class OldLibrary:  # exports only the older names
        def __init__(self):
            self.engram_connect = lambda *a: 0
            self.engram_close = lambda *a: None
    old = OldLibrary()
    _lib._declare_renamed(old)
    assert old.engram_session_open is old.engram_connect
    assert old.engram_session_close is old.engram_close
    assert not hasattr(old, "engram_table_map_open")  # neither name: nothing declared
    lib = _lib.client_lib()
    assert lib.engram_session_open is not None and lib.engram_table_map_close is not None


def test_tables_lists_the_checkpoint(client):
    tables = client.tables()
    assert [t.layer for t in tables] == list(LAYERS)
    for t in tables:
        assert t.row_bytes == engram.ROW_BYTES
        assert t.num_rows == SYNTH_ROWS
        assert (t.covered_begin, t.covered_end) == (0, SYNTH_ROWS)
        assert t.layout == "checkpoint"
        assert t.tier == "storage"  # no row store: every table from the files
    assert client.table(14).layer == 14


def test_tables_show_each_tier_as_engramctl_does(checkpoint, tmp_path):
    d = Daemon(checkpoint, tmp_path,
               ["--tier", "14=resident", "--tier", "1=cache", "--cache-bytes", "16M"])
    try:
        with engram.Client(d.socket) as c:
            tiers = {t.layer: t.tier for t in c.tables()}
            assert c.table(1).tier == "cache"
        shown = {t["layer"]: t["tier"] for t in engramctl_json(d, "tables")["tables"]}
    finally:
        d.stop()
    assert tiers == {1: "cache", 14: "resident"}
    assert tiers == shown
    assert engram.TableInfo(14, 264, 1, 0, 1, "packed", 1, 264).tier == "unknown"


def test_a_tables_id_is_its_layer_and_the_old_names_still_work(client):
    # One name for a table's id, as in C and engramctl; the older keywords warn and still work.
    info = client.table(layer=14)
    assert info.layer == 14 and info.layer_id == 14
    with pytest.warns(DeprecationWarning, match="layer_id="):
        assert client.table(layer_id=14) == info
    rows = client.gather(layer=14, row_ids=[0, 5, 7])
    with pytest.warns(DeprecationWarning, match="table="):
        old = client.gather(table=14, row_ids=[0, 5, 7])
    assert torch.equal(rows, old)
    with pytest.raises(TypeError, match="both layer= and table="):
        client.gather(layer=14, row_ids=[0], table=1)
    with client.submit(14, [0, 1]) as ticket:
        assert ticket.layer == 14 and ticket.table == 14
        assert torch.equal(ticket.wait()[0], rows[0])


def test_gather_list_equals_checkpoint(client, expected_rows):
    ids = [0, 1, 2, SYNTH_ROWS - 1, 1234, 7, 7, 1234]  # unordered, repeated, both ends
    for layer in LAYERS:
        rows = client.gather(layer, ids)
        assert rows.dtype == torch.uint8 and tuple(rows.shape) == (len(ids), 264)
        np.testing.assert_array_equal(rows.numpy(), expected_rows(layer, ids))
        client.release(rows)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32])
def test_gather_numpy_array_equals_checkpoint(client, expected_rows, dtype):
    ids = np.random.default_rng(1).integers(0, SYNTH_ROWS, size=500).astype(dtype)
    rows = client.gather(14, ids)
    np.testing.assert_array_equal(rows.numpy(), expected_rows(14, ids))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_gather_cpu_tensor_equals_checkpoint(client, expected_rows, dtype):
    ids = torch.randint(0, SYNTH_ROWS, (777,), generator=torch.Generator().manual_seed(2),
                        dtype=dtype)
    rows = client.gather(1, ids)
    np.testing.assert_array_equal(rows.numpy(), expected_rows(1, ids.numpy()))
    # A strided view of ids works as well (the package makes the ids contiguous).
    rows = client.gather(1, ids[::3])
    np.testing.assert_array_equal(rows.numpy(), expected_rows(1, ids[::3].numpy()))


def test_gather_is_a_view_of_the_arena(client):
    rows = client.gather(14, list(range(100)))
    base, size = client.data_region
    assert base <= rows.data_ptr() and rows.data_ptr() + rows.numel() <= base + size


def test_gather_of_no_rows(client):
    rows = client.gather(14, [])
    assert tuple(rows.shape) == (0, 264)


def test_submit_and_wait_many_at_once(client, expected_rows):
    rng = np.random.default_rng(3)
    batches = [(LAYERS[i % 2], rng.integers(0, SYNTH_ROWS, size=200 + i)) for i in range(12)]
    tickets = [client.submit(layer, ids) for layer, ids in batches]
    for ticket, (layer, ids) in zip(reversed(tickets), reversed(batches)):
        rows = ticket.wait(timeout=10)
        np.testing.assert_array_equal(rows.numpy(), expected_rows(layer, ids))
        assert ticket.done()
        assert ticket.wait() is rows  # waiting again hands back the same view
        ticket.release()


def test_ticket_done_polls_without_blocking(client, expected_rows):
    ticket = client.submit(1, [5, 6, 7])
    while not ticket.done():
        pass
    np.testing.assert_array_equal(ticket.wait(0).numpy(), expected_rows(1, [5, 6, 7]))


def test_released_ranges_are_reused_and_kept_ones_are_not(daemon):
    # A 1 MiB data region holds one gather of 3,000 rows (~0.8 MB) at a time.
    ids = np.arange(3000)
    with engram.Client(daemon.socket, data_bytes=1 << 20) as small:
        for _ in range(5):
            with small.submit(14, ids) as ticket:
                ticket.wait()
        for _ in range(5):
            rows = small.gather(14, ids)
            small.release(rows)
        for _ in range(5):
            small.gather(14, ids)  # dropped at once: the garbage collector frees the range
            gc.collect()
        kept = small.gather(14, ids)
        with pytest.raises(engram.ResourceExhaustedError) as info:
            small.gather(14, ids)
        assert info.value.code == -errno.ENOSPC
        del kept


def test_release_twice_and_foreign_tensor(client):
    rows = client.gather(14, [1, 2])
    client.release(rows)
    with pytest.raises(ValueError):
        client.release(rows)
    with pytest.raises(ValueError):
        client.release(torch.zeros(3, 264, dtype=torch.uint8))


def test_close_keeps_live_tensors_mapped(daemon, expected_rows):
    c = engram.Client(daemon.socket)
    rows = c.gather(14, [10, 20, 30])
    view = rows[1:]
    c.close()
    assert c.closed
    del rows
    gc.collect()
    np.testing.assert_array_equal(view.numpy(), expected_rows(14, [20, 30]))
    with pytest.raises(ConnectionError):
        c.gather(14, [1])
    c.close()  # idempotent


def test_stats_count_the_session_requests(daemon):
    with engram.Client(daemon.socket, client_name="pytest-stats") as c:
        for _ in range(3):
            c.gather(1, list(range(50)))
        stats = c.stats()
        assert stats.requests_ok == 3
        assert stats.requests_failed == 0
        assert stats.rows == 150
        assert stats.inflight == 0


def _listed_session_counters():
    """The fields of ENGRAM_SESSION_COUNTERS, read from the header itself."""
    import re
    text = (REPO / "include" / "engram" / "session_stats.h").read_text()
    body = re.search(r"#define ENGRAM_SESSION_COUNTERS\(X\)((?:.*\\\n)*.*\n)", text).group(1)
    return re.findall(r"\bX\((\w+),", body)


def test_stats_hold_every_counter_of_the_list(daemon):
    """SessionStats has one attribute per field of engram/session_stats.h's list, in order,
    whatever the list holds: the package takes the names from the library."""
    listed = ["session_id"] + _listed_session_counters()
    assert len(listed) > 10
    assert [name for name, _ in engram.SessionStats.fields()] == listed
    assert all(len(help_text) > 10 for _, help_text in engram.SessionStats.fields())
    with engram.Client(daemon.socket, client_name="pytest-stats-list") as c:
        c.gather(1, [1, 2, 3])
        stats = c.stats()
        assert list(stats.as_dict()) == listed
        for name in listed:
            assert isinstance(getattr(stats, name), int)
        assert stats.rows == 3
        with pytest.raises(AttributeError, match="no field 'no_such_counter'"):
            stats.no_such_counter
        with pytest.raises(AttributeError):
            stats.rows = 4


def test_default_socket_comes_from_the_environment(daemon, monkeypatch):
    monkeypatch.setenv("ENGRAM_SOCKET", daemon.socket)
    with engram.Client() as c:
        assert c.socket == daemon.socket
        assert [t.layer for t in c.tables()] == list(LAYERS)


# ---- errors ---------------------------------------------------------------------------------

def test_unknown_table(client):
    with pytest.raises(engram.UnknownTableError) as info:
        client.gather(99, [0])
    assert isinstance(info.value, ValueError) and isinstance(info.value, engram.EngramError)
    assert info.value.code == -errno.ENOENT
    assert "99" in str(info.value)
    with pytest.raises(ValueError, match="99"):
        client.table(99)


def test_row_past_the_table(client):
    with pytest.raises(engram.RowOutOfRangeError) as info:
        client.gather(14, [1, 2, SYNTH_ROWS])
    assert isinstance(info.value, ValueError)
    assert info.value.code == -errno.ERANGE
    assert str(SYNTH_ROWS) in str(info.value)
    # The session is still usable afterwards.
    assert client.gather(14, [1]).shape[0] == 1


def test_negative_row_is_refused_before_sending(client):
    with pytest.raises(engram.RowOutOfRangeError, match="-5 at index 1"):
        client.gather(14, [3, -5])


def test_bad_row_id_types(client):
    with pytest.raises(TypeError):
        client.gather(14, [1.5, 2.0])
    with pytest.raises(TypeError):
        client.gather(14, torch.tensor([True, False]))
    with pytest.raises(ValueError, match="1-D"):
        client.gather(14, [[1, 2], [3, 4]])


def test_wait_timeout_keeps_the_request(client):
    ticket = client.submit(14, np.arange(SYNTH_ROWS))
    try:
        ticket.wait(timeout=0)
    except engram.EngramTimeoutError as e:
        assert isinstance(e, TimeoutError) and e.code == -errno.ETIMEDOUT
    assert ticket.wait(timeout=10).shape == (SYNTH_ROWS, 264)


def test_no_daemon_on_the_socket(tmp_path):
    with pytest.raises(engram.EngramConnectionError) as info:
        engram.Client(tmp_path / "nothing.sock")
    assert isinstance(info.value, ConnectionError)
    assert info.value.code == -errno.ECONNREFUSED
    assert "nothing.sock" in str(info.value)


def test_dead_daemon(private_daemon):
    c = engram.Client(private_daemon.socket)
    assert c.gather(1, [1]).shape == (1, 264)
    private_daemon.kill()
    with pytest.raises(ConnectionError) as info:
        c.gather(1, [1, 2, 3], timeout=10)
    assert info.value.code in (-errno.ENOTCONN, -errno.ECONNREFUSED)
    with pytest.raises(ConnectionError):
        c.tables()
    c.close()
    with pytest.raises(ConnectionError):
        engram.Client(private_daemon.socket)


def test_missing_library_is_reported(tmp_path):
    script = "import engram; engram.Client()"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"),
               ENGRAM_CLIENT_LIB=str(tmp_path / "libengram_client.so"))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True)
    assert result.returncode != 0
    assert "LibraryNotFoundError" in result.stderr and "ENGRAM_CLIENT_LIB" in result.stderr
    env.pop("ENGRAM_CLIENT_LIB")
    env.pop("ENGRAM_LIB_DIR", None)
    env["ENGRAM_BUILD_DIR"] = str(tmp_path)
    env["LD_LIBRARY_PATH"] = ""
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True)
    assert result.returncode != 0
    assert "cannot find the engram client library" in result.stderr
    assert "Tried:" in result.stderr


def test_threads_share_a_client(client, expected_rows):
    import threading
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                layer = LAYERS[int(rng.integers(0, 2))]
                ids = rng.integers(0, SYNTH_ROWS, size=int(rng.integers(1, 300)))
                with client.submit(layer, ids) as ticket:
                    np.testing.assert_array_equal(ticket.wait(10).numpy(),
                                                  expected_rows(layer, ids))
        except Exception as e:  # reported by the main thread
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_host_gathers_on_a_device_session_are_refused(daemon):
    # A session whose ring belongs to a GPU producer (engram.GpuDecodeStep) takes no host
    # submissions: two producers would race on the ring's tail.
    with engram.Client(daemon.socket, device_submit=True) as c:
        with pytest.raises(engram.EngramError) as e:
            c.gather(14, [1, 2, 3])
        assert "GPU producer" in str(e.value)
