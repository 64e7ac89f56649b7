# engram.GpuDecodeStep: a decode step hashed, submitted, awaited and dequantised on the GPU,
# captured once with torch.cuda.graph and replayed with new tokens; every replay must equal the
# host path (Hasher.hash + the checkpoint's rows + the reference dequantisation). Skipped, with
# the reason, where no GPU path exists.
import numpy as np
import pytest
import torch

import engram
import reference
from test_hashing import hash_daemon, hash_model, hash_tables, hasher  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu

SEQS, PER_SEQ = 8, 6  # 8 sequences x (1 + 5 speculative tokens)


def _host_step(hasher, tokens, history, layer, tp):
    seqs = [tokens[i * PER_SEQ:(i + 1) * PER_SEQ] for i in range(SEQS)]
    return hasher.hash(seqs, [list(h) for h in history], layer=layer, tp_size=tp[0],
                       tp_rank=tp[1])


# The library's default pieces, and pieces of 48 rows (the step's rows in many small requests).
@pytest.mark.parametrize("piece_rows", [0, 48])
def test_captured_gpu_step_equals_host_path(hash_daemon, hash_model, hash_tables, hasher,
                                            piece_rows):
    _, _, _, vocab_size = hash_model
    rng = np.random.default_rng(7)
    tp = (4, 1)
    with engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ, tp_size=tp[0], tp_rank=tp[1],
                              socket=hash_daemon.socket, piece_rows=piece_rows) as step:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step.run()
        for replay in range(50):
            tokens = rng.integers(0, vocab_size, size=SEQS * PER_SEQ).astype(np.int32)
            history = rng.integers(0, vocab_size, size=(SEQS, 3)).astype(np.int32)
            history[replay % SEQS, :2] = -1  # a sequence that started one token ago
            step.tokens.copy_(torch.from_numpy(tokens))
            step.history.copy_(torch.from_numpy(history))
            graph.replay()
            torch.cuda.synchronize()
            assert step.error == 0
            for layer in (1, 14):
                hist = [[int(x) for x in h if x >= 0] for h in history]
                ids = _host_step(hasher, tokens, hist, layer, tp)
                want = reference.embeddings(hash_tables, layer, ids)
                got = step.output(layer).cpu()
                assert torch.equal(reference.bits(got), reference.bits(want)), (replay, layer)
        assert step.hash_errors == 0

