#!/usr/bin/env python3
"""Derives the DeepSeek-V4.1 Engram hash tables of a model directory and writes the
derived-tables file (engram-hash.bin) that engramd's hasher loads.

The compressed vocabulary needs the tokenizer's decoding and Unicode normalisation, so it is
derived here, once; multipliers (numpy default_rng) and head primes are written alongside and
re-derived by the C++ loader, which refuses a file that disagrees. Format: docs/hashing.md.

    tools/engram_vocab.py --model /models/DeepSeek-V4.1-Flash [--out STATE/engram-hash.bin]
"""

import argparse
import json
import os
import re
import struct
import sys
import tempfile
import unicodedata
import zlib

import numpy as np

MAGIC = b"ENGRHASH"
VERSION = 1
HEADER = struct.Struct("<8sIIQIIQIIQIIQqIIII32s")
LAYER_RECORD = struct.Struct("<IIQ")
assert HEADER.size == 128 and LAYER_RECORD.size == 16

# Unicode White_Space: what the Rust normaliser's Strip() trims (Python's str.isspace differs).
WHITE_SPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
               "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
SENTINEL = "\ue000"
BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class DeriveError(Exception):
    """A model directory whose files cannot be derived from; the message names the file."""


def byte_level_alphabet():
    """GPT-2's bytes-to-unicode map, inverted: printable stand-in character -> byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


CHAR_TO_BYTE = byte_level_alphabet()


# --- decoding one token id to text, as tokenizers' decode([id]) does ---

def decode_byte_level(tokens):
    out = bytearray()
    for token in tokens:
        if all(c in CHAR_TO_BYTE for c in token):
            out += bytes(CHAR_TO_BYTE[c] for c in token)
        else:  # not a byte-level token (e.g. an added token): its own UTF-8
            out += token.encode("utf-8")
    return [out.decode("utf-8", errors="replace")]


def decode_byte_fallback(tokens):
    out, pending = [], bytearray()

    def flush():
        if pending:
            try:
                out.append(pending.decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" for _ in pending)
            pending.clear()

    for token in tokens:
        m = BYTE_TOKEN.match(token)
        if m:
            pending.append(int(m.group(1), 16))
        else:
            flush()
            out.append(token)
    flush()
    return out


def decode_metaspace(tokens, spec):
    replacement = spec.get("replacement", "\u2581")
    scheme = spec.get("prepend_scheme")
    if scheme is None:
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    out = []
    for i, token in enumerate(tokens):
        text = token.replace(replacement, " ")
        if i == 0 and scheme != "never" and text.startswith(" "):
            text = text[1:]
        out.append(text)
    return out


def decode_replace(tokens, spec):
    pattern = spec["pattern"]
    if "String" in pattern:
        return [t.replace(pattern["String"], spec["content"]) for t in tokens]
    regex = re.compile(pattern["Regex"])
    return [regex.sub(spec["content"].replace("\\", "\\\\"), t) for t in tokens]


def decode_strip(tokens, spec):
    content, start, stop = spec["content"], spec.get("start", 0), spec.get("stop", 0)
    out = []
    for token in tokens:
        lead = 0
        while lead < start and lead < len(token) and token[lead] == content:
            lead += 1
        trail = 0
        while (trail < stop and trail < len(token) - lead
               and token[len(token) - 1 - trail] == content):
            trail += 1
        out.append(token[lead:len(token) - trail])
    return out


def apply_decoder(spec, tokens, origin):
    if spec is None:
        return [" ".join(tokens)]
    kind = spec.get("type")
    if kind == "ByteLevel":
        return decode_byte_level(tokens)
    if kind == "ByteFallback":
        return decode_byte_fallback(tokens)
    if kind == "Metaspace":
        return decode_metaspace(tokens, spec)
    if kind == "Replace":
        return decode_replace(tokens, spec)
    if kind == "Strip":
        return decode_strip(tokens, spec)
    if kind == "Fuse":
        return ["".join(tokens)]
    if kind == "Sequence":
        for step in spec.get("decoders", []):
            tokens = apply_decoder(step, tokens, origin)
        return tokens
    raise DeriveError(f"{origin}: decoder type {kind!r} is not supported "
                      "(ByteLevel, Metaspace, ByteFallback, Replace, Strip, Fuse, Sequence are)")


def load_tokenizer(path):
    """Returns (id -> token string list, decoder spec). Ids without a token map to None."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise DeriveError(f"{path}: {e}") from e
    model = doc.get("model") or {}
    vocab = model.get("vocab")
    id_to_token = {}
    if isinstance(vocab, dict):
        for token, i in vocab.items():
            id_to_token[int(i)] = token
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the index
        for i, entry in enumerate(vocab):
            id_to_token[i] = entry[0]
    else:
        raise DeriveError(f"{path}: model.vocab is neither a token->id map nor a piece list")
    for added in doc.get("added_tokens") or []:
        id_to_token[int(added["id"])] = added["content"]  # added tokens take precedence
    if not id_to_token or min(id_to_token) < 0:
        raise DeriveError(f"{path}: no tokens, or a negative token id")
    tokens = [None] * (max(id_to_token) + 1)
    for i, token in id_to_token.items():
        tokens[i] = token
    return tokens, doc.get("decoder")


# --- the compressed vocabulary ---

def normalise(text):
    """NFKC, NFD, strip combining marks, lower-case, collapse [ \\t\\r\\n]+, strip; a text that
    is exactly one space after collapsing stays one space."""
    t = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    t = "".join(c for c in t if not unicodedata.category(c).startswith("M"))
    t = "".join(c.lower() for c in t)  # per character: no final-sigma context rule
    t = re.sub(r"[ \t\r\n]+", " ", t)
    if t == " ":
        t = SENTINEL
    return t.strip(WHITE_SPACE).replace(SENTINEL, " ")


def compress_vocabulary(tokens, decoder, origin):
    """Tokenizer id -> compressed id, numbered in order of first appearance."""
    key_to_id = {}
    lookup = np.empty(len(tokens), dtype=np.uint32)
    for tid, token in enumerate(tokens):
        text = "" if token is None else "".join(apply_decoder(decoder, [token], origin))
        if "\ufffd" in text:
            key = token  # a partial UTF-8 sequence: keyed by its raw token string
        else:
            key = normalise(text) or text
        lookup[tid] = key_to_id.setdefault(key, len(key_to_id))
    return lookup, len(key_to_id)


# --- config, multipliers, primes ---

def engram_config(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise DeriveError(f"{path}: {e}") from e
    section = doc
    if isinstance(doc.get("text_config"), dict) and "engram_layer_ids" in doc["text_config"]:
        section = doc["text_config"]
    keys = ["engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size",
            "engram_n_heads", "engram_vocab_size", "engram_pad_token_id",
            "engram_compressed_vocab_size"]
    missing = [k for k in keys if k not in section]
    if missing:
        raise DeriveError(f"{path}: missing {', '.join(missing)}")
    c = {k[len("engram_"):]: section[k] for k in keys}
    c["seed"] = section.get("engram_seed", 0)
    orders = c["max_ngram_size"] - 1
    if isinstance(c["vocab_size"], int):
        c["vocab_size"] = [c["vocab_size"]] * orders
    if len(c["vocab_size"]) != orders or len(c["num_embeddings"]) != len(c["layer_ids"]):
        raise DeriveError(f"{path}: engram_vocab_size or engram_num_embeddings has the wrong "
                          "number of entries")
    return c


def is_prime(n):
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def head_primes(c):
    taken, per_layer = set(), []
    for _ in c["layer_ids"]:
        primes = []
        for start in c["vocab_size"]:
            candidate = start - 1
            for _ in range(c["n_heads"]):
                candidate += 1
                while not is_prime(candidate) or candidate in taken:
                    candidate += 1
                taken.add(candidate)
                primes.append(candidate)
        per_layer.append(primes)
    return per_layer


def multipliers(c, layer_id):
    half_bound = max(1, (np.iinfo(np.int64).max // c["compressed_vocab_size"]) // 2)
    rng = np.random.default_rng(c["seed"] + 10007 * layer_id)
    r = rng.integers(0, half_bound, size=c["max_ngram_size"], dtype=np.int64)
    return (r * 2 + 1).astype(np.int64)


# --- the file ---

def fingerprint(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0, 0
    return len(data), zlib.crc32(data)


def build(config_path, tokenizer_path):
    c = engram_config(config_path)
    tokens, decoder = load_tokenizer(tokenizer_path)
    lookup, compressed = compress_vocabulary(tokens, decoder, tokenizer_path)
    if compressed != c["compressed_vocab_size"]:
        raise DeriveError(
            f"{tokenizer_path} compresses {len(tokens)} ids to {compressed}, but "
            f"{config_path} says engram_compressed_vocab_size {c['compressed_vocab_size']}: "
            "the tokenizer does not belong to this model, or its decoding is not reproduced")
    pad = c["pad_token_id"]
    if not 0 <= pad < len(tokens):
        raise DeriveError(f"{config_path}: engram_pad_token_id {pad} is not a tokenizer id")
    body = bytearray()
    for layer_id, primes, rows in zip(c["layer_ids"], head_primes(c), c["num_embeddings"]):
        if sum(primes) != rows:
            raise DeriveError(f"{config_path}: layer {layer_id} head primes sum to {sum(primes)}"
                              f" rows, engram_num_embeddings says {rows}")
        body += LAYER_RECORD.pack(layer_id, 0, rows)
        body += multipliers(c, layer_id).astype("<i8").tobytes()
        body += np.asarray(primes, dtype="<u8").tobytes()
    body += lookup.astype("<u4").tobytes()
    config_bytes, config_crc = fingerprint(config_path)
    tokenizer_bytes, tokenizer_crc = fingerprint(tokenizer_path)
    fields = [MAGIC, VERSION, HEADER.size, HEADER.size + len(body), zlib.crc32(body), 0,
              config_bytes, config_crc, tokenizer_crc, tokenizer_bytes, len(tokens), compressed,
              c["seed"], pad, int(lookup[pad]), c["max_ngram_size"], c["n_heads"],
              len(c["layer_ids"]), bytes(32)]
    fields[5] = zlib.crc32(HEADER.pack(*fields))
    return HEADER.pack(*fields) + bytes(body), len(tokens), compressed, int(lookup[pad])


def up_to_date(out, config_path, tokenizer_path):
    try:
        with open(out, "rb") as f:
            head = f.read(HEADER.size)
    except OSError:
        return False
    if len(head) != HEADER.size:
        return False
    h = HEADER.unpack(head)
    return (h[0] == MAGIC and h[1] == VERSION and (h[6], h[7]) == fingerprint(config_path)
            and (h[9], h[8]) == fingerprint(tokenizer_path))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory (config.json, tokenizer.json)")
    ap.add_argument("--out", help="derived-tables file (default MODEL/engram-hash.bin)")
    ap.add_argument("--force", action="store_true", help="derive even if the file is up to date")
    args = ap.parse_args(argv)
    config_path = os.path.join(args.model, "config.json")
    tokenizer_path = os.path.join(args.model, "tokenizer.json")
    out = args.out or os.path.join(args.model, "engram-hash.bin")
    if not args.force and up_to_date(out, config_path, tokenizer_path):
        print(f"{out}: up to date")
        return 0
    try:
        data, vocab, compressed, pad = build(config_path, tokenizer_path)
    except DeriveError as e:
        print(f"engram_vocab: {e}", file=sys.stderr)
        return 1
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".engram-hash.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"{out}: {vocab} tokenizer ids -> {compressed} compressed ids, pad -> {pad}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
