#!/bin/bash
# Seeds for the table-header fuzz target (tests/run_fuzz.sh FUZZ_SEEDS): a small valid shard
# and a valid packed file, so that mutations start from the real formats.
set -euo pipefail
corpus=$1
if [[ ! -e "$corpus/seed-shard" ]]; then
  json='{"a":{"dtype":"F8_E4M3","shape":[2,256],"data_offsets":[0,512]},"b":{"dtype":"F8_E8M0","shape":[2,8],"data_offsets":[512,528]}}'
  { printf "$(printf '\\x%02x' ${#json} 0 0 0 0 0 0 0)"; printf '%s' "$json"; head -c 528 /dev/zero; } \
    >"$corpus/seed-shard"
fi
if [[ ! -e "$corpus/seed-packed" ]]; then
  # A 2-row packed table (docs/table_format.md); the target reseals the checksum itself.
  /usr/bin/python3 -c '
import struct, sys
h = struct.pack("<8sHHIIIQQQQIIIBBHQ40sQ", b"ENGRAMTB", 1, 0, 128, 14, 264, 2, 0, 2, 4096,
                0, 256, 8, 1, 2, 32, 4096 + 2 * 264, bytes(40), 0)
sys.stdout.buffer.write(h + bytes(4096 - len(h)) + bytes(range(256)) * 2 + bytes(16))
' >"$corpus/seed-packed"
fi
