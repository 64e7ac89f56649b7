"""engramctl hash and tools/engram_vocab.py against the independent reference in
engram_reference.py: real DeepSeek-V4.1 config values, random and natural token streams, chunk
boundaries, tensor-parallel ranks, a tokenizer.json fixture, stale and corrupt derived files."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import engram_reference as ref  # noqa: E402

ENGRAMCTL = os.environ.get("ENGRAMCTL", "build/tools/engramctl/engramctl")
ENGRAM_VOCAB = os.environ.get(
    "ENGRAM_VOCAB", str(pathlib.Path(__file__).resolve().parents[2] / "tools/engram_vocab.py"))

DSV41 = {
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_vocab_size": 16000000,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,
}
DSV41_PAD = 2  # compressed pad id passed to --compressed runs


def write_config(d, engram, nested=True):
    d.mkdir(parents=True, exist_ok=True)
    doc = {"model_type": "deepseek_v4", "text_config": engram} if nested else dict(engram)
    (d / "config.json").write_text(json.dumps(doc, indent=1))
    return d


def engramctl_hash(model, layer, tokens, *extra, check=True):
    tokens_file = pathlib.Path(model) / "tokens.txt"
    tokens_file.write_text(" ".join(str(int(t)) for t in tokens))
    cmd = [ENGRAMCTL, "hash", "--model", str(model), "--layer", str(layer), "--json",
           "--tokens-file", str(tokens_file), *map(str, extra)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def rows_of(out):
    return np.array([p["rows"] for p in out["positions"]], dtype=np.int64)


@pytest.fixture(scope="module")
def dsv41(tmp_path_factory):
    d = write_config(tmp_path_factory.mktemp("dsv41"), DSV41)
    return d, ref.EngramReference(ref.engram_params(d / "config.json"), DSV41_PAD)


def natural_stream(rng, n, vocab):
    """Zipf-distributed ids with recurring phrases, the pad id and the extreme ids mixed in."""
    words = np.minimum(rng.zipf(1.1, size=n), vocab - 1).astype(np.int64)
    phrase = words[:12].copy()
    for at in range(50, n - 12, 173):
        words[at:at + 12] = phrase
    words[::97] = DSV41_PAD
    words[5::211] = vocab - 1
    words[7::307] = 0
    return words


def test_primes_and_multipliers_match_reference(dsv41):
    model, r = dsv41
    assert r.primes[1][0] == 16_000_057 and r.primes[1][-1] == 16_000_463
    assert sum(r.primes[1]) == 384_006_168
    assert r.primes[14][0] == 16_000_477 and r.primes[14][-1] == 16_000_889
    assert sum(r.primes[14]) == 384_016_682
    for layer in (1, 14):
        out = engramctl_hash(model, layer, [7], "--compressed", "--compressed-pad-id", DSV41_PAD)
        assert out["schema_version"] == 1
        assert out["layer_tables"]["primes"] == r.primes[layer]
        assert out["layer_tables"]["multipliers"] == [int(m) for m in r.multipliers[layer]]
        assert out["row_range"] == [0, sum(r.primes[layer])]


@pytest.mark.parametrize("layer", [1, 14])
def test_random_stream(dsv41, layer):
    model, r = dsv41
    ids = np.random.default_rng(layer).integers(0, 99092, size=4000)
    out = engramctl_hash(model, layer, ids, "--compressed", "--compressed-pad-id", DSV41_PAD)
    assert [p["compressed"] for p in out["positions"]] == ids.tolist()
    np.testing.assert_array_equal(rows_of(out), r.rows(layer, ids))


@pytest.mark.parametrize("layer", [1, 14])
def test_natural_stream(dsv41, layer):
    model, r = dsv41
    ids = natural_stream(np.random.default_rng(100 + layer), 3000, 99092)
    out = engramctl_hash(model, layer, ids, "--compressed", "--compressed-pad-id", DSV41_PAD)
    np.testing.assert_array_equal(rows_of(out), r.rows(layer, ids))


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 96, 1000])
def test_chunks_hash_as_one_sequence(dsv41, chunk):
    model, r = dsv41
    ids = natural_stream(np.random.default_rng(chunk), 1500, 99092)
    whole = r.rows(14, ids)
    out = engramctl_hash(model, 14, ids, "--compressed", "--compressed-pad-id", DSV41_PAD,
                         "--chunk", chunk)
    np.testing.assert_array_equal(rows_of(out), whole)


@pytest.mark.parametrize("split", [1, 2, 3, 4, 777])
def test_history_across_calls(dsv41, split):
    """A later call given the preceding ids as history continues the sequence exactly."""
    model, r = dsv41
    ids = np.random.default_rng(split).integers(0, 99092, size=900)
    whole = r.rows(1, ids)
    for history_len in {min(split, 3), split}:  # the last 3 ids suffice; more are ignored
        history = ",".join(str(int(t)) for t in ids[split - history_len:split])
        out = engramctl_hash(model, 1, ids[split:], "--compressed", "--compressed-pad-id",
                             DSV41_PAD, "--history", history)
        np.testing.assert_array_equal(rows_of(out), whole[split:])


@pytest.mark.parametrize("tp_size", [1, 2, 3, 4, 6, 8, 12, 24])
def test_tensor_parallel_ranks(dsv41, tp_size):
    model, r = dsv41
    ids = np.random.default_rng(tp_size).integers(0, 99092, size=200)
    whole = r.rows(1, ids)
    per = 24 // tp_size
    for rank in range(tp_size):
        out = engramctl_hash(model, 1, ids, "--compressed", "--compressed-pad-id", DSV41_PAD,
                             "--tp-size", tp_size, "--tp-rank", rank)
        assert out["heads"] == [rank * per, (rank + 1) * per]
        got = rows_of(out)
        np.testing.assert_array_equal(got, whole[:, rank * per:(rank + 1) * per])
        lo, hi = out["row_range"]
        assert got.min() >= lo and got.max() < hi
        if tp_size == 4 and rank == 1:
            assert out["row_range"] == [96_000_564, 192_001_740]


def test_bad_inputs_are_refused(dsv41, tmp_path):
    model, _ = dsv41
    p = engramctl_hash(model, 2, [5], "--compressed", "--compressed-pad-id", 2, check=False)
    assert p.returncode == 1 and "layer 2 is not an Engram layer" in p.stderr
    p = engramctl_hash(model, 1, [5, 99092], "--compressed", "--compressed-pad-id", 2,
                       check=False)
    assert p.returncode == 1 and "position 1" in p.stderr and "99092" in p.stderr
    p = engramctl_hash(model, 1, [5], "--compressed", "--compressed-pad-id", 2, "--tp-size", 5,
                       check=False)
    assert p.returncode == 1 and "does not divide" in p.stderr
    p = engramctl_hash(model, 1, [5], check=False)  # tokenizer ids but nothing derived
    assert p.returncode == 1 and "engram_vocab.py" in p.stderr
    bad = write_config(tmp_path / "bad", dict(DSV41, engram_num_embeddings=[384006169, 1]))
    p = engramctl_hash(bad, 1, [5], "--compressed", "--compressed-pad-id", 2, check=False)
    assert p.returncode == 1 and "sum to 384006168" in p.stderr


def test_other_configs_match_reference(tmp_path):
    """Seeds, layer ids, orders, head counts and vocab sizes other than DeepSeek-V4.1's."""
    rng = np.random.default_rng(7)
    for i in range(6):
        n = int(rng.integers(2, 7))
        heads = int(rng.integers(1, 9))
        engram = {
            "engram_layer_ids": sorted(rng.choice(60, size=int(rng.integers(1, 4)),
                                                  replace=False).tolist()),
            "engram_max_ngram_size": n,
            "engram_n_heads": heads,
            "engram_vocab_size": [int(v) for v in rng.integers(50, 5000, size=n - 1)],
            "engram_pad_token_id": 0,
            "engram_compressed_vocab_size": int(rng.integers(2, 10**8)),
            "engram_seed": int(rng.integers(0, 2**31)),
        }
        p = {"layer_ids": engram["engram_layer_ids"], "num_embeddings": [],
             "max_ngram_size": n, "n_heads": heads, "vocab_size": engram["engram_vocab_size"],
             "pad_token_id": 0, "compressed_vocab_size": engram["engram_compressed_vocab_size"],
             "seed": engram["engram_seed"]}
        pad = int(rng.integers(0, p["compressed_vocab_size"]))
        r = ref.EngramReference(p, pad)
        engram["engram_num_embeddings"] = [sum(r.primes[l]) for l in p["layer_ids"]]
        model = write_config(tmp_path / f"m{i}", engram, nested=(i % 2 == 0))
        ids = rng.integers(0, p["compressed_vocab_size"], size=300)
        for layer in p["layer_ids"]:
            out = engramctl_hash(model, layer, ids, "--compressed", "--compressed-pad-id", pad,
                                 "--chunk", 37)
            assert out["layer_tables"]["multipliers"] == [int(m) for m in r.multipliers[layer]]
            np.testing.assert_array_equal(rows_of(out), r.rows(layer, ids))


# --- tokenizer.json fixture: byte-level BPE tokens, accents, case, whitespace, specials ---

def byte_level(text):
    """GPT-2 byte-level spelling of a text, as it appears in a byte-level BPE vocab."""
    b2u = {b: u for u, b in ref._U2B.items()}
    return "".join(b2u[b] for b in text.encode("utf-8"))


FIXTURE_TEXTS = [
    "<pad0>", "<pad1>", "PAD",              # 0-2; 2 is the pad
    "Hello", " Hello", "hello", "HELLO", " hello ",  # case and surrounding space
    "café", "cafe", "Café", " CAFÉ",         # accents (precomposed) and case
    "cafe\u0301",                            # accent as a combining mark
    " ", "  ", "\n", "\t", " \n ", "\r\n",   # whitespace-only: all stay one space
    "a  b", "a\tb", "a\n\nb", "a b",         # internal whitespace runs collapse
    "\uff21", "a", "\ufb01", "fi",           # NFKC: fullwidth A, ligature fi
    "\u0301",                                # combining mark only: normalises to ""
    "\u2003x", "x",                          # em space is stripped (not collapsed)
    "ΣΑΣ", "σασ", "ς",                       # per-character lower-case: no final sigma
    "İ", "i\u0307",                          # dotted capital I lower-cases to i + dot
    "Straße", "strasse",
]
PARTIAL_UTF8 = ["\xc3", "\xe2\x82", "\xa9"]  # byte strings that are not valid UTF-8
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<think>", "<｜▁pad▁｜>"]


def make_tokenizer(d):
    vocab = {}
    for text in FIXTURE_TEXTS:
        vocab.setdefault(byte_level(text), len(vocab))
    b2u = {b: u for u, b in ref._U2B.items()}
    for raw in PARTIAL_UTF8:
        vocab.setdefault("".join(b2u[ord(c)] for c in raw), len(vocab))
    added = [{"id": len(vocab) + i, "content": s, "special": True, "single_word": False,
              "lstrip": False, "rstrip": False, "normalized": False}
             for i, s in enumerate(SPECIALS)]
    doc = {"version": "1.0", "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True},
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                     "merges": []}}
    (d / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False))
    return vocab, added


def build_tokenizer_model(d):
    """Writes the fixture model (tokenizer.json, config.json, engram-hash.bin) into d; also used
    by tools/gpu-bundle.sh for the GPU hasher's tokenizer-id test."""
    vocab, added = make_tokenizer(d)
    lookup, count = ref.compressed_lookup(d / "tokenizer.json")
    p = {"layer_ids": [3, 9], "num_embeddings": [], "max_ngram_size": 4, "n_heads": 8,
         "vocab_size": [1000] * 3, "pad_token_id": 2, "compressed_vocab_size": count, "seed": 0}
    r = ref.EngramReference(p, int(lookup[2]))
    engram = {"engram_layer_ids": [3, 9], "engram_max_ngram_size": 4, "engram_n_heads": 8,
              "engram_vocab_size": 1000, "engram_pad_token_id": 2,
              "engram_compressed_vocab_size": count,
              "engram_num_embeddings": [sum(r.primes[3]), sum(r.primes[9])]}
    write_config(d, engram)
    run = subprocess.run([sys.executable, ENGRAM_VOCAB, "--model", str(d)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    return d, vocab, added, lookup, r


@pytest.fixture(scope="module")
def tokenizer_model(tmp_path_factory):
    return build_tokenizer_model(tmp_path_factory.mktemp("tok"))


def fixture_ids(vocab, texts):
    return [vocab[byte_level(t)] for t in texts]


def test_fixture_compressed_vocabulary(tokenizer_model):
    d, vocab, added, lookup, _ = tokenizer_model
    # What the normalisation must merge and keep apart, written out by hand.
    same = [["Hello", " Hello", "hello", "HELLO", " hello "],
            ["café", "cafe", "Café", " CAFÉ", "cafe\u0301"],
            [" ", "  ", "\n", "\t", " \n ", "\r\n"],
            ["a  b", "a\tb", "a\n\nb", "a b"],
            ["\uff21", "a"], ["\ufb01", "fi"], ["\u2003x", "x"],
            ["ΣΑΣ", "σασ"], ["İ", "i\u0307"]]
    for group in same:
        ids = fixture_ids(vocab, group)
        assert len({int(lookup[i]) for i in ids}) == 1, group
    apart = [["Hello", "café"], ["σασ", "ς"], ["Straße", "strasse"], ["\u0301", " "],
             ["\u0301", "a"], [" ", "a b"]]
    for pair in apart:
        a, b = fixture_ids(vocab, pair)
        assert lookup[a] != lookup[b], pair
    b2u = {b: u for u, b in ref._U2B.items()}
    partial = [vocab["".join(b2u[ord(c)] for c in raw)] for raw in PARTIAL_UTF8]
    assert len({int(lookup[i]) for i in partial}) == len(partial)  # raw strings: all distinct
    special = [a["id"] for a in added]
    assert len({int(lookup[i]) for i in special}) == len(special)
    # Numbered in order of first appearance.
    assert lookup[0] == 0 and lookup[1] == 1 and lookup[2] == 2

    # The derived file carries exactly the reference's table.
    data = (d / "engram-hash.bin").read_bytes()
    assert data[:8] == b"ENGRHASH"
    stored = np.frombuffer(data[len(data) - 4 * len(lookup):], dtype="<u4")
    np.testing.assert_array_equal(stored, lookup)


@pytest.mark.parametrize("layer", [3, 9])
def test_fixture_tokenizer_ids_hash_like_reference(tokenizer_model, layer):
    d, vocab, added, lookup, r = tokenizer_model
    rng = np.random.default_rng(layer)
    ids = rng.integers(0, len(lookup), size=1200)
    out = engramctl_hash(d, layer, ids, "--chunk", 50)
    assert [p["compressed"] for p in out["positions"]] == lookup[ids].tolist()
    np.testing.assert_array_equal(rows_of(out), r.rows(layer, lookup[ids]))
    out = engramctl_hash(d, layer, lookup[ids], "--compressed")  # pad id from the file
    np.testing.assert_array_equal(rows_of(out), r.rows(layer, lookup[ids]))


def test_derive_once(tokenizer_model):
    d = tokenizer_model[0]
    run = subprocess.run([sys.executable, ENGRAM_VOCAB, "--model", str(d)], capture_output=True,
                         text=True)
    assert run.returncode == 0 and "up to date" in run.stdout


def test_stale_or_corrupt_derived_tables_are_refused(tokenizer_model, tmp_path):
    src = tokenizer_model[0]
    d = tmp_path / "m"
    d.mkdir()
    for name in ("config.json", "tokenizer.json", "engram-hash.bin"):
        (d / name).write_bytes((src / name).read_bytes())
    assert engramctl_hash(d, 3, [1, 2, 3])["positions"]

    good = (d / "engram-hash.bin").read_bytes()
    corrupt = bytearray(good)
    corrupt[-3] ^= 0x40
    (d / "engram-hash.bin").write_bytes(bytes(corrupt))
    p = engramctl_hash(d, 3, [1], check=False)
    assert p.returncode == 1 and "body checksum mismatch" in p.stderr
    (d / "engram-hash.bin").write_bytes(good[:-4])
    p = engramctl_hash(d, 3, [1], check=False)
    assert p.returncode == 1 and "truncated" in p.stderr
    (d / "engram-hash.bin").write_bytes(good)

    (d / "tokenizer.json").write_text((src / "tokenizer.json").read_text() + "\n")
    p = engramctl_hash(d, 3, [1], check=False)
    assert p.returncode == 1 and "tokenizer.json changed" in p.stderr
    (d / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())

    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["engram_seed"] = 5
    (d / "config.json").write_text(json.dumps(cfg))
    p = engramctl_hash(d, 3, [1], check=False)
    assert p.returncode == 1 and "config.json changed" in p.stderr

    # Re-deriving against a config whose compressed size is wrong is refused, naming both.
    cfg["text_config"]["engram_compressed_vocab_size"] += 1
    (d / "config.json").write_text(json.dumps(cfg))
    run = subprocess.run([sys.executable, ENGRAM_VOCAB, "--model", str(d)], capture_output=True,
                         text=True)
    assert run.returncode == 1 and "engram_compressed_vocab_size" in run.stderr


def test_metaspace_byte_fallback_tokenizer(tmp_path):
    """A SentencePiece-style tokenizer.json: ▁ for spaces, <0xNN> byte-fallback tokens."""
    pieces = ["<unk>", "<s>", "</s>", "▁Hello", "Hello", "▁hello", "▁", "▁▁", "<0x0A>", "<0xC3>",
              "<0xE2>", "é", "e", "▁Été"]
    doc = {"model": {"type": "BPE", "vocab": {p: i for i, p in enumerate(pieces)}, "merges": [],
                     "byte_fallback": True},
           "added_tokens": [{"id": i, "content": p, "special": True} for i, p in
                            enumerate(pieces[:3])],
           "decoder": {"type": "Sequence", "decoders": [
               {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
               {"type": "ByteFallback"}, {"type": "Fuse"},
               {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False))
    engram = {"engram_layer_ids": [0], "engram_num_embeddings": [11],
              "engram_max_ngram_size": 2, "engram_n_heads": 1, "engram_vocab_size": 10,
              "engram_pad_token_id": 0, "engram_compressed_vocab_size": 10}
    write_config(tmp_path, engram)
    run = subprocess.run([sys.executable, ENGRAM_VOCAB, "--model", str(tmp_path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    # <unk> <s> </s> | Hello, hello (the decoder strips the first space) | "▁" decodes to ""
    # and keeps that empty text as its key | "▁▁" and <0x0A> are whitespace | <0xC3> and <0xE2>
    # decode to U+FFFD and keep their raw strings | é, e | Été
    expected = [0, 1, 2, 3, 3, 3, 4, 5, 5, 6, 7, 8, 8, 9]
    data = (tmp_path / "engram-hash.bin").read_bytes()
    np.testing.assert_array_equal(np.frombuffer(data[-4 * len(pieces):], dtype="<u4"), expected)
    out = engramctl_hash(tmp_path, 0, [3, 6, 13])
    assert [p["compressed"] for p in out["positions"]] == [3, 4, 9]

    engram["engram_compressed_vocab_size"] = 9
    write_config(tmp_path, engram)
    run = subprocess.run([sys.executable, ENGRAM_VOCAB, "--model", str(tmp_path)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "compresses 14 ids to 10" in run.stderr, run.stderr
