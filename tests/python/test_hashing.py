"""engram.Hasher and Client.submit_tokens / gather_tokens against a real engramd serving a model
directory whose tables match its hash parameters: row ids against the independent reference
(tests/hash/engram_reference.py), gathered bytes against the safetensors shards, tokenizer ids
through a derived compressed vocabulary, chunks with history, head selections, and errors."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import engram
from conftest import Daemon, _find_program, program_env, read_engram_tables

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "hash"))
import engram_reference as ref  # noqa: E402

SEED = 11
PRIME_START = 400  # engram_vocab_size: small tables (~10k and ~14k rows)
HEADS = 24
WORDS = [f"w{i}" for i in range(120)]


def _byte_level(text):
    b2u = {b: u for u, b in ref._U2B.items()}
    return "".join(b2u[b] for b in text.encode("utf-8"))


def _write_tokenizer(d):
    """A byte-level BPE tokenizer.json whose words come in case and leading-space variants,
    which the compressed vocabulary merges."""
    texts = ["<pad0>", "<pad1>", "PAD"]
    for w in WORDS:
        texts += [w, w.upper(), " " + w]
    vocab = {}
    for t in texts:
        vocab.setdefault(_byte_level(t), len(vocab))
    doc = {"version": "1.0", "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                             "trim_offsets": True, "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                     "merges": []}}
    (d / "tokenizer.json").write_text(json.dumps(doc))
    return len(vocab)


@pytest.fixture(scope="module")
def hash_model(tmp_path_factory):
    """(model dir, reference, compressed lookup, vocab size): engram-synth tables of exactly
    the rows the hash parameters imply (each layer written at its own size), config.json with
    those parameters, tokenizer.json and the derived tables from tools/engram_vocab.py."""
    root = tmp_path_factory.mktemp("hashmodel")
    model = root / "model"
    model.mkdir()
    vocab_size = _write_tokenizer(model)
    lookup, compressed = ref.compressed_lookup(model / "tokenizer.json")
    params = {"layer_ids": [1, 14], "num_embeddings": [], "max_ngram_size": 4, "n_heads": 8,
              "vocab_size": [PRIME_START] * 3, "pad_token_id": 2,
              "compressed_vocab_size": compressed, "seed": 0}
    r = ref.EngramReference(params, int(lookup[2]))
    rows = [sum(r.primes[1]), sum(r.primes[14])]
    synth = _find_program("engram-synth", "ENGRAM_SYNTH", "tools/tables")
    for layer, n in zip((1, 14), rows):
        out = root / f"synth-{layer}"
        subprocess.run([str(synth), str(out), "--rows", str(n), "--seed", str(SEED), "-q"],
                       check=True, env=program_env(), timeout=120)
        index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
        shard = index[f"layers.{layer}.engram.embed.weight"]
        shutil.copy(out / shard, model / shard)
        if layer == 1:
            for f in out.iterdir():
                if not (model / f.name).exists():
                    shutil.copy(f, model / f.name)
    config = json.loads((model / "config.json").read_text())
    config["text_config"].update({
        "engram_layer_ids": [1, 14], "engram_num_embeddings": rows,
        "engram_max_ngram_size": 4, "engram_n_heads": 8, "engram_vocab_size": PRIME_START,
        "engram_pad_token_id": 2, "engram_compressed_vocab_size": compressed})
    (model / "config.json").write_text(json.dumps(config, indent=1))
    run = subprocess.run([sys.executable, str(REPO / "tools" / "engram_vocab.py"), "--model",
                          str(model)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return model, r, lookup, vocab_size


@pytest.fixture(scope="module")
def hash_daemon(hash_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hashd")
    d = Daemon(hash_model[0], folder)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def hash_tables(hash_model):
    return read_engram_tables(hash_model[0])


@pytest.fixture
def hasher(hash_model):
    with engram.Hasher(hash_model[0]) as h:
        yield h


@pytest.fixture
def hclient(hash_daemon):
    with engram.Client(hash_daemon.socket) as c:
        yield c


def _expected(tables, layer, ids):
    weight, scale = tables[layer]
    flat = np.asarray(ids, dtype=np.int64).reshape(-1)
    return np.concatenate([weight[flat], scale[flat]], axis=1).reshape(*np.shape(ids), 264)


def _stream(n, vocab_size, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=n)
    ids[::17] = 2  # the pad id inside the stream
    ids[5::29] = ids[3]  # recurring n-grams
    return ids


def test_hasher_describes_the_model(hasher, hash_model):
    _, r, lookup, vocab_size = hash_model
    assert hasher.layers == {1: sum(r.primes[1]), 14: sum(r.primes[14])}
    assert hasher.heads_per_layer == HEADS and hasher.max_ngram_size == 4
    assert hasher.vocab_size == vocab_size
    assert hasher.compressed_vocab_size == int(lookup.max()) + 1 < vocab_size
    assert hasher.rank_heads(4, 1) == (6, 12)
    assert hasher.head_rows(1) == (0, sum(r.primes[1]))
    np.testing.assert_array_equal(hasher.compress(np.arange(vocab_size)), lookup)


@pytest.mark.parametrize("layer", [1, 14])
def test_hash_matches_reference(hasher, hash_model, layer):
    _, r, lookup, vocab_size = hash_model
    ids = _stream(500, vocab_size, layer)
    expect = r.rows(layer, lookup[ids])
    for given in (ids.tolist(), ids, ids.astype(np.uint16), torch.from_numpy(ids)):
        got = hasher.hash(given, layer=layer)
        assert got.dtype == np.int64 and got.shape == (500, HEADS)
        np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(hasher.hash(lookup[ids], layer=layer, compressed=True),
                                  expect)
    np.testing.assert_array_equal(hasher.hash(ids, layer=layer, tp_size=4, tp_rank=3),
                                  expect[:, 18:24])
    np.testing.assert_array_equal(hasher.hash(ids, layer=layer, heads=(3, 11)), expect[:, 3:11])
    np.testing.assert_array_equal(hasher.hash(ids, layer=layer, heads=range(8, 9)),
                                  expect[:, 8:9])


def test_hash_chunks_and_batches(hasher, hash_model):
    _, r, lookup, vocab_size = hash_model
    ids = _stream(300, vocab_size, 3)
    whole = r.rows(14, lookup[ids])
    for chunk in (1, 4, 77):
        parts = [hasher.hash(ids[at:at + chunk], history=ids[max(0, at - 3):at], layer=14)
                 for at in range(0, len(ids), chunk)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
    # A batch of sequences in one call: each with its own history, positions in order.
    cuts = [0, 10, 11, 150, 300]
    seqs = [ids[a:b] for a, b in zip(cuts, cuts[1:])]
    hist = [None] + [ids[max(0, a - 3):a] for a in cuts[1:-1]]
    np.testing.assert_array_equal(hasher.hash(seqs, history=hist, layer=14), whole)
    # A longer history than needed: only its last 3 ids matter.
    np.testing.assert_array_equal(hasher.hash(ids[200:], history=ids[:200], layer=14),
                                  whole[200:])


@pytest.mark.parametrize("layer", [1, 14])
def test_gather_tokens_returns_the_hashed_rows(hclient, hasher, hash_model, hash_tables, layer):
    _, r, lookup, vocab_size = hash_model
    ids = _stream(200, vocab_size, 40 + layer)
    rows = hclient.gather_tokens(hasher, layer, ids, timeout=10)
    assert rows.dtype == torch.uint8 and tuple(rows.shape) == (200, HEADS, 264)
    expect_ids = r.rows(layer, lookup[ids])
    np.testing.assert_array_equal(rows.numpy(), _expected(hash_tables, layer, expect_ids))
    hclient.release(rows)
    # A TP rank's heads, from compressed ids, asynchronously.
    with hclient.submit_tokens(hasher, layer, lookup[ids], tp_size=3, tp_rank=1,
                               compressed=True) as ticket:
        part = ticket.wait(timeout=10)
        assert tuple(part.shape) == (200, 8, 264)
        np.testing.assert_array_equal(part.numpy(),
                                      _expected(hash_tables, layer, expect_ids[:, 8:16]))


def test_gather_tokens_across_chunks_with_history(hclient, hasher, hash_model, hash_tables):
    _, r, lookup, vocab_size = hash_model
    ids = _stream(257, vocab_size, 99)
    expect = _expected(hash_tables, 1, r.rows(1, lookup[ids]))
    tickets = [hclient.submit_tokens(hasher, 1, ids[at:at + 64], ids[max(0, at - 3):at])
               for at in range(0, len(ids), 64)]
    got = np.concatenate([t.wait(timeout=10).numpy() for t in tickets])
    np.testing.assert_array_equal(got, expect)
    # A decode step: many sequences, one token and two drafts each.
    seqs = [ids[i:i + 3] for i in range(10, 250, 30)]
    hist = [ids[i - 3:i] for i in range(10, 250, 30)]
    step = hclient.gather_tokens(hasher, 1, seqs, history=hist, timeout=10).numpy()
    want = np.concatenate([expect[i:i + 3] for i in range(10, 250, 30)])
    np.testing.assert_array_equal(step, want)
    empty = hclient.gather_tokens(hasher, 1, [], timeout=10)
    assert tuple(empty.shape) == (0, HEADS, 264)


def test_errors_name_what_was_wrong(hclient, hasher, hash_model, tmp_path):
    model, _, _, vocab_size = hash_model
    before = hclient.stats().requests_submitted
    with pytest.raises(engram.UnknownTableError, match="layer 7 is not an Engram layer"):
        hclient.gather_tokens(hasher, 7, [1, 2, 3])
    with pytest.raises(engram.UnknownTableError, match="layer 7"):
        hasher.hash([1, 2, 3], layer=7)
    bad = [1, 2, vocab_size, 3]
    with pytest.raises(engram.InvalidArgumentError,
                       match=f"position 2: tokenizer id {vocab_size} is outside"):
        hclient.gather_tokens(hasher, 14, bad)
    with pytest.raises(engram.InvalidArgumentError, match="history entry at position 0"):
        hasher.hash([1, 2], history=[-5], layer=14)
    with pytest.raises(engram.InvalidArgumentError, match="does not fit a 32-bit token id"):
        hasher.hash([1, 1 << 40], layer=1)
    with pytest.raises(engram.InvalidArgumentError, match="must be 1-D"):
        hclient.submit_tokens(hasher, 1, np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="must be integers"):
        hasher.hash([1.5, 2.0], layer=1)
    with pytest.raises(engram.InvalidArgumentError, match="tensor-parallel size 5"):
        hclient.submit_tokens(hasher, 1, [1, 2], tp_size=5, tp_rank=0)
    with pytest.raises(engram.InvalidArgumentError, match="not both"):
        hasher.hash([1], layer=1, heads=(0, 6), tp_size=4, tp_rank=0)
    with pytest.raises(engram.InvalidArgumentError, match=r"head range \[20, 30\)"):
        hasher.hash([1], layer=1, heads=(20, 30))
    with pytest.raises(engram.InvalidArgumentError, match="2 histories for 3 sequences"):
        hasher.hash([[1], [2], [3]], history=[[1], [2]], layer=1)
    assert hclient.stats().requests_submitted == before  # nothing reached the daemon

    with pytest.raises(engram.ModelFileNotFoundError) as missing:
        engram.Hasher(tmp_path / "nothing-here")
    assert isinstance(missing.value, FileNotFoundError)
    assert "nothing-here" in str(missing.value)
    # Without the derived tables only compressed ids hash.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(model / "config.json", bare / "config.json")
    with engram.Hasher(bare, compressed_only=True, compressed_pad_id=2) as h:
        assert h.hash([3, 4], layer=1, compressed=True).shape == (2, HEADS)
        with pytest.raises(engram.NoVocabularyError, match="engram_vocab.py"):
            hclient.gather_tokens(h, 1, [3, 4])
    # A config.json edited after the derivation: the derived tables are stale.
    stale = tmp_path / "stale"
    stale.mkdir()
    for name in ("config.json", "tokenizer.json", "engram-hash.bin"):
        shutil.copy(model / name, stale / name)
    with open(stale / "config.json", "a") as f:
        f.write("\n")
    with pytest.raises(engram.HashTablesError, match="engram_vocab.py"):
        engram.Hasher(stale)
    closed = engram.Hasher(model)
    closed.close()
    with pytest.raises(engram.InvalidArgumentError, match="closed"):
        closed.hash([1], layer=1)


def test_lookup_prepare_tokens_equals_the_reference(hash_daemon, hasher, hash_model,
                                                    hash_tables):
    """EngramLookup.prepare_tokens over a chunked prefill and decode steps with history, for
    all heads and for a TP rank's heads, against the reference rows dequantised in PyTorch."""
    import reference
    _, r, lookup, vocab_size = hash_model
    ids = _stream(160, vocab_size, 7)
    expect = {layer: r.rows(layer, lookup[ids]) for layer in (1, 14)}
    with engram.EngramLookup([1, 14], HEADS, 64, device="cpu",
                             socket=hash_daemon.socket) as full, \
            engram.EngramLookup([14, 1], 6, 64, device="cpu", socket=hash_daemon.socket) as rank:
        for at, n in [(0, 64), (64, 50), (114, 1), (115, 1)]:
            new, hist = ids[at:at + n], ids[max(0, at - 3):at]
            full.prepare_tokens(hasher, new, history=hist)
            rank.prepare_tokens(hasher, lookup[new], history=lookup[hist], tp_size=4, tp_rank=2,
                                compressed=True)
            for layer in (1, 14):
                want = reference.embeddings(hash_tables, layer, expect[layer][at:at + n])
                assert torch.equal(reference.bits(full.get(layer)), reference.bits(want))
                assert torch.equal(reference.bits(rank.get(layer)),
                                   reference.bits(want[:, 12:18]))
        # A decode step of several sequences, one new token each, in one call.
        seqs = [ids[i:i + 1] for i in range(120, 160, 8)]
        hist = [ids[i - 3:i] for i in range(120, 160, 8)]
        full.prepare_tokens(hasher, seqs, history=hist)
        rows = np.concatenate([expect[14][i:i + 1] for i in range(120, 160, 8)])
        assert torch.equal(reference.bits(full.get(14)),
                           reference.bits(reference.embeddings(hash_tables, 14, rows)))
        with pytest.raises(engram.InvalidArgumentError, match=r"\[0, 24\) has 24 heads; this "
                                                              r"lookup was made for 6"):
            rank.prepare_tokens(hasher, ids[:4])
        with pytest.raises(engram.InvalidArgumentError, match="65 tokens, more than max_tokens"):
            full.prepare_tokens(hasher, ids[:65])


def test_gather_tokens_reads_a_resident_table_in_place(hash_model, hash_tables, hasher,
                                                      tmp_path_factory):
    """gather_tokens on a resident table copies the rows here (engram_gather_tokens); the same
    through engramd with Client(in_place=False), byte for byte."""
    import time
    _, r, lookup, vocab_size = hash_model
    d = Daemon(hash_model[0], tmp_path_factory.mktemp("hashd-resident"), ["--tier", "14=resident"])
    try:
        ids = _stream(64, vocab_size, 7)
        expect = _expected(hash_tables, 14, r.rows(14, lookup[ids]))
        counted = []
        for in_place in (True, False):
            with engram.Client(d.socket, in_place=in_place) as c:
                deadline = time.monotonic() + 60
                while True:  # in place once the table has loaded
                    rows = c.gather_tokens(hasher, 14, ids, timeout=10)
                    np.testing.assert_array_equal(rows.numpy(), expect)
                    c.release(rows)
                    if not in_place or c.stats().rows_in_place > 0:
                        break
                    assert time.monotonic() < deadline, "layer 14 was not read in place"
                    time.sleep(0.12)  # past the library's retry interval
                counted.append((c.stats().rows_in_place > 0, c.stats().rows))
    finally:
        d.stop()
    assert counted[0][0] and not counted[1][0]
    assert counted[1][1] == 64 * HEADS
