#!/usr/bin/env python3
"""Runs a test program with $ENGRAM_HASH_MODEL set to a model directory with tokenizer ids:
tests/hash/test_hash.py's tokenizer fixture (tokenizer.json, config.json and the engram-hash.bin
that tools/engram_vocab.py derives from them), written into a temporary folder.

usage: with_hash_model.py PROGRAM [ARG...]   (exit status: the program's; 77 when this python
cannot write the fixture)
"""

import os
import pathlib
import subprocess
import sys
import tempfile

HASH_TESTS = pathlib.Path(__file__).resolve().parents[1] / "hash"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    try:
        sys.path.insert(0, str(HASH_TESTS))
        import test_hash  # needs numpy and pytest, as the hash suite does
    except ImportError as e:
        print(f"SKIP: the tokenizer fixture needs {e.name} in {sys.executable}")
        return 77
    with tempfile.TemporaryDirectory(prefix="engram-hash-model-") as folder:
        test_hash.build_tokenizer_model(pathlib.Path(folder))
        env = dict(os.environ, ENGRAM_HASH_MODEL=folder)
        return subprocess.run(sys.argv[1:], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
