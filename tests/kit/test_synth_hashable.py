"""engram-synth --hashable writes a model that hashing works on: config.json's engram_* keys
agree with the tables' rows and with an independent reference (tests/hash/engram_reference.py),
tools/engram_vocab.py derives the same engram-hash.bin from its tokenizer, and engramctl hash,
engram.Hasher and python/examples/engram_layer.py run on it against engramd."""

import json
import os
import subprocess
import sys

import numpy as np

import engram_reference as ref
from conftest import REPO, program, run


def reference_for(model):
    params = ref.engram_params(model / "config.json")
    lookup, compressed = ref.compressed_lookup(model / "tokenizer.json")
    return ref.EngramReference(params, int(lookup[params["pad_token_id"]])), lookup, compressed


def table_rows(model):
    """Rows of each layer's table, from the safetensors headers."""
    index = json.loads((model / "model.safetensors.index.json").read_text())["weight_map"]
    rows = {}
    for layer in (1, 14):
        name = f"layers.{layer}.engram.embed.weight"
        with open(model / index[name], "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        rows[layer] = header[name]["shape"][0]
    return rows


def test_config_tables_and_reference_agree(hashable_model):
    r, lookup, compressed = reference_for(hashable_model)
    text = json.loads((hashable_model / "config.json").read_text())["text_config"]
    rows = table_rows(hashable_model)
    assert text["engram_vocab_size"] == 600
    assert text["engram_num_embeddings"] == [sum(r.primes[1]), sum(r.primes[14])]
    assert [rows[1], rows[14]] == text["engram_num_embeddings"]
    assert 10_000 < rows[1] < rows[14] < 30_000  # small: ~5 MB a table
    # The tokenizer folds case and a leading space: 3 specials + 1000 words of 3 ids each.
    assert len(lookup) == 3003 and compressed == 1003
    assert text["engram_compressed_vocab_size"] == compressed
    assert text["engram_pad_token_id"] == 2 and lookup[2] == 2
    assert (hashable_model / "tokenizer_config.json").is_file()


def test_engram_vocab_derives_the_same_tables(hashable_model, tmp_path):
    out = tmp_path / "engram-hash.bin"
    r = run([sys.executable, REPO / "tools" / "engram_vocab.py", "--model", hashable_model,
             "--out", out, "--force"])
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == (hashable_model / "engram-hash.bin").read_bytes()


def test_engramctl_hash_gives_the_reference_rows(hashable_model):
    r_ref, lookup, _ = reference_for(hashable_model)
    tokens = [5, 17, 99, 1002, 3000, 2, 17]
    for layer in (1, 14):
        r = run([program("ENGRAMCTL"), "hash", "--model", hashable_model, "--layer", layer,
                 "--json", *tokens])
        assert r.returncode == 0, r.stderr
        got = [p["rows"] for p in json.loads(r.stdout)["positions"]]
        assert got == r_ref.rows(layer, lookup[tokens]).tolist()


def test_python_hasher_gathers_the_hashed_rows(hashable_model, daemon):
    import engram
    r_ref, lookup, _ = reference_for(hashable_model)
    tokens = np.arange(0, 3003, 97)
    with engram.Hasher(hashable_model) as hasher, engram.Client(daemon.socket) as client:
        assert hasher.vocab_size == 3003 and hasher.heads_per_layer == 24
        ids = hasher.hash(tokens, layer=14)
        assert np.array_equal(ids, r_ref.rows(14, lookup[tokens]))
        rows = client.gather_tokens(hasher, 14, tokens, array="numpy")
        direct = client.gather(14, ids.reshape(-1), array="numpy")
        assert np.array_equal(np.asarray(rows).reshape(-1, 264), np.asarray(direct))


def test_example_layer_runs_on_the_synthetic_model(hashable_model, daemon):
    import engram
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"),
               ENGRAM_CLIENT_LIB=os.path.abspath(engram.library_path()))
    r = subprocess.run([sys.executable, str(REPO / "python" / "examples" / "engram_layer.py"),
                        "--model", str(hashable_model), "--socket", daemon.socket,
                        "--tokens", "24"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("bit-identical") == 4


def test_other_engram_vocab_sizes_and_layers(tmp_path):
    out = tmp_path / "m"
    r = run([program("ENGRAM_SYNTH"), out, "--hashable", "--engram-vocab-size", "100",
             "--layers", "3", "-q"])
    assert r.returncode == 0, r.stderr
    r_ref, lookup, _ = reference_for(out)
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert text["engram_layer_ids"] == [3]
    assert text["engram_num_embeddings"] == [sum(r_ref.primes[3])]
    h = run([program("ENGRAMCTL"), "hash", "--model", out, "--layer", "3", "--json", "7", "8"])
    assert h.returncode == 0, h.stderr
    got = [p["rows"] for p in json.loads(h.stdout)["positions"]]
    assert got == r_ref.rows(3, lookup[[7, 8]]).tolist()


def test_bad_hashable_arguments_are_refused(tmp_path):
    synth = program("ENGRAM_SYNTH")
    cases = [
        (["--hashable", "--rows", "100"], "excludes"),
        (["--engram-vocab-size", "100"], "requires --hashable"),
        (["--hashable", "--engram-vocab-size", "1"], "--engram-vocab-size"),
        (["--hashable", "--engram-vocab-size", "16000001"], "--engram-vocab-size"),
    ]
    for args, message in cases:
        r = run([synth, tmp_path / "bad", *args])
        assert r.returncode != 0, args
        assert message in r.stderr + r.stdout, (args, r.stderr)
        assert not (tmp_path / "bad" / "config.json").exists()
