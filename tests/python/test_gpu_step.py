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



# The two-phase step of speculative decoding: a kernel on the stream stands in for the draft
# model, writing the draft tokens into `tokens` between submit_accepted() and submit_draft().
# The draft it writes makes rows other than the tokens `tokens` held before it ran, so a step
# that hashed or requested the draft rows before the draft kernel would return the old rows.
DRAFT_SLEEP_CYCLES = 20_000_000  # the draft model's time, so an unordered read would race it


def _capture_two_phase(step, drafted):
    """A graph of one step: accepted rows requested, the draft model, the draft's rows, then
    the wait before the first Engram layer."""
    a = step.accepted_per_seq
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.submit_accepted()
        torch.cuda._sleep(DRAFT_SLEEP_CYCLES)
        step.tokens.view(SEQS, PER_SEQ)[:, a:].copy_(drafted)
        step.submit_draft()
        step.finish()
    return graph


@pytest.mark.parametrize("draft_per_seq", [5, 2])
def test_two_phase_step_requests_draft_rows_after_the_draft(hash_daemon, hash_model,
                                                            hash_tables, hasher, draft_per_seq):
    _, _, _, vocab_size = hash_model
    rng = np.random.default_rng(11 + draft_per_seq)
    tp = (4, 1)
    a = PER_SEQ - draft_per_seq
    with engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ, tp_size=tp[0], tp_rank=tp[1],
                              socket=hash_daemon.socket, draft_per_seq=draft_per_seq,
                              piece_rows=48) as step:
        drafted = torch.zeros((SEQS, draft_per_seq), dtype=torch.int32, device="cuda")
        two_phase = _capture_two_phase(step, drafted)
        whole = torch.cuda.CUDAGraph()  # the reference: the whole step after the draft
        with torch.cuda.graph(whole):
            step.run()
        for replay in range(12):
            before = rng.integers(0, vocab_size, size=(SEQS, PER_SEQ)).astype(np.int32)
            draft = rng.integers(0, vocab_size, size=(SEQS, draft_per_seq)).astype(np.int32)
            history = rng.integers(0, vocab_size, size=(SEQS, 3)).astype(np.int32)
            history[replay % SEQS, :2] = -1
            after = before.copy()
            after[:, a:] = draft
            step.tokens.copy_(torch.from_numpy(before.reshape(-1)))
            step.history.copy_(torch.from_numpy(history))
            drafted.copy_(torch.from_numpy(draft))
            two_phase.replay()
            torch.cuda.synchronize()
            assert step.error == 0
            assert torch.equal(step.tokens.cpu(), torch.from_numpy(after.reshape(-1)))
            got = {layer: step.output(layer).clone() for layer in (1, 14)}
            whole.replay()
            torch.cuda.synchronize()
            assert step.error == 0
            hist = [[int(x) for x in h if x >= 0] for h in history]
            for layer in (1, 14):
                assert torch.equal(reference.bits(got[layer]),
                                   reference.bits(step.output(layer))), (replay, layer)
                want = reference.embeddings(
                    hash_tables, layer, _host_step(hasher, after.reshape(-1), hist, layer, tp))
                stale = reference.embeddings(
                    hash_tables, layer, _host_step(hasher, before.reshape(-1), hist, layer, tp))
                got_seq = reference.bits(got[layer].cpu()).view(SEQS, PER_SEQ, -1)
                want_seq = reference.bits(want).view(SEQS, PER_SEQ, -1)
                stale_seq = reference.bits(stale).view(SEQS, PER_SEQ, -1)
                assert torch.equal(got_seq, want_seq), (replay, layer)
                # The old tokens make other rows at (nearly) every draft position (two ids
                # may share a compressed id), so an early request would have shown up above.
                differs = (want_seq[:, a:] != stale_seq[:, a:]).any(dim=-1)
                assert differs.float().mean() > 0.9, (replay, layer)
        assert step.hash_errors == 0


def test_two_phase_calls_are_checked(hash_daemon, hasher):
    with pytest.raises(ValueError, match="draft_per_seq 6"):
        engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ, socket=hash_daemon.socket,
                             draft_per_seq=PER_SEQ)
    with engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ,
                              socket=hash_daemon.socket) as plain:
        with pytest.raises(RuntimeError, match="draft_per_seq > 0"):
            plain.submit_accepted()
    with engram.GpuDecodeStep(hasher, [1, 14], SEQS, PER_SEQ, socket=hash_daemon.socket,
                              draft_per_seq=5) as step:
        with pytest.raises(RuntimeError, match="needs submit_accepted"):
            step.finish()
        step.submit_accepted()
        with pytest.raises(RuntimeError, match="called twice"):
            step.submit_accepted()
        step.submit_draft()
        step.finish()
        torch.cuda.synchronize()
        assert step.error == 0
