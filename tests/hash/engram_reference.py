"""Independent Python reference of the DeepSeek-V4.1 Engram hash, written from the model's
description (compressed vocabulary, numpy default_rng multipliers, XOR mix, prime moduli,
head offsets), for checking engramd's C++ hasher and tools/engram_vocab.py."""

import json
import re
import unicodedata

import numpy as np


def engram_params(config_path):
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    if "engram_layer_ids" not in cfg:
        cfg = cfg["text_config"]
    p = {
        "layer_ids": list(cfg["engram_layer_ids"]),
        "num_embeddings": list(cfg["engram_num_embeddings"]),
        "max_ngram_size": cfg["engram_max_ngram_size"],
        "n_heads": cfg["engram_n_heads"],
        "vocab_size": cfg["engram_vocab_size"],
        "pad_token_id": cfg["engram_pad_token_id"],
        "compressed_vocab_size": cfg["engram_compressed_vocab_size"],
        "seed": cfg.get("engram_seed", 0),
    }
    if not isinstance(p["vocab_size"], list):
        p["vocab_size"] = [p["vocab_size"]] * (p["max_ngram_size"] - 1)
    return p


def _isprime(n):
    # Trial division by 6k +- 1: slow but obviously right for the small moduli used here.
    if n < 4:
        return n >= 2
    if n % 2 == 0 or n % 3 == 0:
        return False
    f = 5
    while f * f <= n:
        if n % f == 0 or n % (f + 2) == 0:
            return False
        f += 6
    return True


def _next_prime(after, seen):
    c = after + 1
    while not (_isprime(c) and c not in seen):
        c += 1
    return c


class EngramReference:
    def __init__(self, params, compressed_pad_id):
        self.p = params
        self.pad = compressed_pad_id
        seen = set()
        self.primes = {}
        for layer in params["layer_ids"]:
            per_layer = []
            for order in range(2, params["max_ngram_size"] + 1):
                start = params["vocab_size"][order - 2] - 1
                for _ in range(params["n_heads"]):
                    prime = _next_prime(start, seen)
                    seen.add(prime)
                    per_layer.append(prime)
                    start = prime
            self.primes[layer] = per_layer
        half_bound = max(1, (np.iinfo(np.int64).max // params["compressed_vocab_size"]) // 2)
        self.multipliers = {}
        for layer in params["layer_ids"]:
            rng = np.random.default_rng(params["seed"] + 10007 * layer)
            r = rng.integers(0, half_bound, size=(params["max_ngram_size"],), dtype=np.int64)
            self.multipliers[layer] = r * 2 + 1
        self.offsets = {l: np.concatenate([[0], np.cumsum(ps)[:-1]]).astype(np.int64)
                        for l, ps in self.primes.items()}

    def rows(self, layer, compressed_ids):
        """[T, heads] absolute rows for one whole sequence of compressed ids."""
        x = np.asarray(compressed_ids, dtype=np.int64)[None, :]
        T = x.shape[1]
        mult = self.multipliers[layer]
        shifted = [x] + [np.pad(x, ((0, 0), (k, 0)), constant_values=self.pad)[:, :T]
                         for k in range(1, self.p["max_ngram_size"])]
        heads = []
        with np.errstate(over="ignore"):
            for n in range(2, self.p["max_ngram_size"] + 1):
                mix = shifted[0] * mult[0]
                for k in range(1, n):
                    mix = np.bitwise_xor(mix, shifted[k] * mult[k])
                for j in range(self.p["n_heads"]):
                    heads.append(mix % self.primes[layer][(n - 2) * self.p["n_heads"] + j])
        return (np.stack(heads, axis=2)[0] + self.offsets[layer][None, :]).astype(np.int64)


# --- compressed vocabulary from a tokenizer.json ---

def _gpt2_unicode_to_byte():
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    mapping, shifted = {}, 0
    for b in range(256):
        if b in keep:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + shifted)] = b
            shifted += 1
    return mapping


_U2B = _gpt2_unicode_to_byte()
_RUST_WHITESPACE = "".join(chr(c) for c in [
    9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
    0x205F, 0x3000])


def _decode_one(token, decoder):
    """tokenizers' decode([id]) for the decoders the fixtures use."""
    if token is None:
        return ""
    kind = decoder["type"] if decoder else None
    if kind == "ByteLevel":
        if set(token) <= _U2B.keys():
            return bytes(_U2B[ch] for ch in token).decode("utf-8", "replace")
        return token
    if kind is None:
        return token
    raise ValueError(f"reference decodes ByteLevel tokenizers only, not {kind}")


def _key_text(text):
    t = unicodedata.normalize("NFKC", text)
    t = unicodedata.normalize("NFD", t)
    t = "".join(ch for ch in t if unicodedata.category(ch)[0] != "M")
    t = "".join(ch.lower() for ch in t)
    t = re.sub("[ \t\r\n]+", " ", t)
    t = "\ue000" if t == " " else t
    return t.strip(_RUST_WHITESPACE).replace("\ue000", " ")


def compressed_lookup(tokenizer_path):
    with open(tokenizer_path, encoding="utf-8") as f:
        tok = json.load(f)
    by_id = {v: k for k, v in tok["model"]["vocab"].items()}
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
    size = max(by_id) + 1
    keys, lookup = {}, []
    for tid in range(size):
        raw = by_id.get(tid)
        text = _decode_one(raw, tok.get("decoder"))
        if "\ufffd" in text:
            key = raw
        else:
            key = _key_text(text) or text
        if key not in keys:
            keys[key] = len(keys)
        lookup.append(keys[key])
    return np.array(lookup, dtype=np.int64), len(keys)
