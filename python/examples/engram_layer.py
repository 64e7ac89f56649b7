#!/usr/bin/env python3
"""A minimal DeepSeek-V4.1 Engram layer in PyTorch, fed by engramd: what an engine copies.

The Engram layer of DeepSeek-V4.1 (arXiv 2601.07372) turns the last 2..4 token ids into 24
hashed row ids per token, looks the rows up in its table, dequantises them (FP8 E4M3 values,
one E8M0 scale per 32) and mixes them into the hidden state: a key projection of the 24 x 256
embeddings is compared with the hidden state (RMS-normalised, scaled dot product, signed square
root, sigmoid) to gate a value projection, which a short causal depthwise convolution refines;
the block adds the result to its residual stream. Weights here are random: only the data path
(hash -> gather -> dequantise -> gate and project) is the model's.

Two modules share one `EngramMixer` (the weights):
  - EngramdEngramLayer: rows from engramd through engram.EngramLookup; the step's rows are
    hashed and requested at forward entry (prepare_tokens), and the layer reads them with
    lookup.embeddings(), a torch custom op that torch.compile(fullgraph=True) traces and a CUDA
    graph captures. A prefill chunk names the next chunk (prepare_tokens' next_tokens), whose
    rows engramd reads while this one computes. Around a request's steps the engine's
    scheduler calls the lookup too: at admission, admit_tokens hands engramd the prompt's rows,
    which it reads into its row cache and pins while the request waits; after the prefill (or
    on a cancel), admit_done unpins them (run() below);
  - CheckpointEngramLayer: the pure-PyTorch reference, reading the same checkpoint's table into
    memory and dequantising it with PyTorch arithmetic.
Given the same token ids they produce bit-identical outputs (tests/python/test_example.py).

    python3 engram_layer.py --model DIR [--socket PATH] [--layer 14] [--tokens 64] [--chunk 32]
runs both on a random token stream (a prompt prefilled in chunks, then decode steps) and
compares them.
"""

import argparse
import json
import math
import pathlib
import sys
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

ROW_VALUES, SCALE_BYTES, BLOCK = 256, 8, 32


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class EngramMixer(nn.Module):
    """Gate and project: memory bf16 [T, heads, 256] + hidden [T, hc, H] -> update [T, hc, H].

    hc: hyper-connection branches (each has its own key projection and norms, one value
    projection is shared). Computes in float32; `memory` is converted once."""

    def __init__(self, hidden_size: int, heads: int = 24, hc_mult: int = 1, kernel_size: int = 4,
                 dilation: int = 3, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        memory_size = heads * ROW_VALUES
        self.hidden_size = hidden_size

        def linear(fan_in, fan_out):
            layer = nn.Linear(fan_in, fan_out, bias=False)
            with torch.no_grad():
                layer.weight.copy_(torch.randn(fan_out, fan_in, generator=generator) /
                                   math.sqrt(fan_in))
            return layer

        self.value_proj = linear(memory_size, hidden_size)
        self.key_projs = nn.ModuleList([linear(memory_size, hidden_size) for _ in range(hc_mult)])
        self.key_norms = nn.ModuleList([RMSNorm(hidden_size) for _ in range(hc_mult)])
        self.query_norms = nn.ModuleList([RMSNorm(hidden_size) for _ in range(hc_mult)])
        self.conv_norm = RMSNorm(hidden_size)
        self.kernel_size, self.dilation = kernel_size, dilation
        self.conv_weight = nn.Parameter(
            torch.randn(hidden_size, 1, kernel_size, generator=generator) / kernel_size)

    def short_conv(self, x: torch.Tensor) -> torch.Tensor:
        """Causal depthwise convolution over positions: x [T, C] -> [T, C]."""
        pad = (self.kernel_size - 1) * self.dilation
        y = nn.functional.pad(self.conv_norm(x).t().unsqueeze(0), (pad, 0))
        y = nn.functional.conv1d(y, self.conv_weight, dilation=self.dilation,
                                 groups=self.hidden_size)
        return nn.functional.silu(y.squeeze(0).t())

    def forward(self, hidden: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        flat = memory.flatten(1).float()  # [T, heads * 256]
        value = self.value_proj(flat)  # [T, H]
        branches = []
        for key_proj, key_norm, query_norm, i in zip(self.key_projs, self.key_norms,
                                                     self.query_norms, range(hidden.shape[1])):
            score = (key_norm(key_proj(flat)) * query_norm(hidden[:, i])).sum(-1)
            score = score / math.sqrt(self.hidden_size)
            gate = torch.sigmoid(score.abs().clamp_min(1e-6).sqrt() * score.sign())
            gated = gate.unsqueeze(-1) * value
            branches.append(gated + self.short_conv(gated))
        return torch.stack(branches, dim=1)


class EngramdEngramLayer(nn.Module):
    """The Engram layer with rows from engramd. The lookup is prepared by the caller at forward
    entry (prepare_step); forward only reads, so it compiles and captures."""

    def __init__(self, mixer: EngramMixer, lookup, layer_id: int):
        super().__init__()
        self.mixer, self.lookup, self.layer_id = mixer, lookup, layer_id

    def prepare_step(self, hasher, tokens, history=None, next_tokens=None) -> None:
        """At forward entry. next_tokens: the next prefill chunk of the same sequence, known
        while this chunk computes; engramd reads its rows meanwhile, after this step's."""
        next_history = None
        if next_tokens is not None:  # the next chunk's n-grams start in this one
            before = np.zeros(0, dtype=np.int64) if history is None else np.asarray(history)
            next_history = np.concatenate([before, np.asarray(tokens)])[-3:]
        self.lookup.prepare_tokens(hasher, tokens, history, next_tokens=next_tokens,
                                   next_history=next_history)

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        memory = self.lookup.embeddings(self.layer_id, input_ids)
        return hidden + self.mixer(hidden, memory)


def read_table(model_dir, layer_id: int) -> torch.Tensor:
    """The layer's table from the checkpoint's safetensors shards, as uint8 [N, 264] rows."""
    model_dir = pathlib.Path(model_dir)
    weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    parts = []
    for suffix, width in (("weight", ROW_VALUES), ("scale", SCALE_BYTES)):
        name = f"layers.{layer_id}.engram.embed.{suffix}"
        path = model_dir / weight_map[name]
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            entry = json.loads(f.read(header_len))[name]
        begin, end = entry["data_offsets"]
        data = np.fromfile(path, dtype=np.uint8, count=end - begin, offset=8 + header_len + begin)
        parts.append(torch.from_numpy(data.reshape(-1, width)))
    return torch.cat(parts, dim=1)


def dequantize_reference(rows: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 264] -> bf16 [n, 256] with PyTorch arithmetic from the format's definition:
    E4M3 by its bit fields (0x7F/0xFF NaN), times 2^(E8M0 - 127) (255 NaN), rounded once to
    bf16; NaN written as 0x7FC0, as engramd's kernels write it."""
    values, scales = rows[:, :ROW_VALUES].long(), rows[:, ROW_VALUES:].long()
    sign = 1.0 - 2.0 * ((values >> 7) & 1).float()
    exponent, mantissa = (values >> 3) & 0xF, (values & 0x7).float()
    normal = (1.0 + mantissa / 8.0) * torch.pow(2.0, (exponent - 7).float())
    magnitude = torch.where(exponent == 0, mantissa * 2.0 ** -9, normal)
    decoded = torch.where((exponent == 0xF) & (values & 0x7 == 0x7),
                          torch.tensor(float("nan")), sign * magnitude)
    scale = torch.where(scales == 255, torch.tensor(float("nan")),
                        torch.pow(2.0, (scales - 127).float()))
    product = (decoded.view(-1, SCALE_BYTES, BLOCK) * scale.unsqueeze(-1)).view(-1, ROW_VALUES)
    out = product.to(torch.bfloat16)
    out.view(torch.int16)[torch.isnan(product)] = 0x7FC0
    return out


class CheckpointEngramLayer(nn.Module):
    """The reference: the table in memory, rows indexed and dequantised in PyTorch."""

    def __init__(self, mixer: EngramMixer, table: torch.Tensor):
        super().__init__()
        self.mixer, self.table = mixer, table

    def forward(self, hidden: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
        tokens, heads = row_ids.shape
        memory = dequantize_reference(self.table[row_ids.reshape(-1)])
        return hidden + self.mixer(hidden, memory.view(tokens, heads, ROW_VALUES))


def run(model_dir, socket: Optional[str], layer_id: int, steps: Sequence[int],
        hidden_size: int = 64, seed: int = 0, out=sys.stdout,
        chunk: Optional[int] = None) -> bool:
    """Feeds a random token stream through both layers step by step; True if bit-identical.
    steps[0] is the prompt, prefilled in chunks of `chunk` tokens (None: one chunk); each later
    entry is a decode step of that many tokens."""
    import engram
    hasher = engram.Hasher(model_dir)
    vocab = hasher.vocab_size
    rng = np.random.default_rng(seed)
    request_id = 1  # the engine's id of the request, unique among the lookup's requests
    mixer = EngramMixer(hidden_size, heads=hasher.heads_per_layer, seed=seed).eval()
    reference = CheckpointEngramLayer(mixer, read_table(model_dir, layer_id))
    prompt = rng.integers(0, vocab, size=steps[0])
    chunk = chunk or steps[0]
    prefill = [prompt[at:at + chunk] for at in range(0, steps[0], chunk)]
    same = True
    with engram.EngramLookup([layer_id], hasher.heads_per_layer, max([chunk, *steps[1:]]),
                             device="cpu", socket=socket) as lookup, torch.no_grad():
        layer = EngramdEngramLayer(mixer, lookup, layer_id)
        # The scheduler admits the request: engramd reads the prompt's rows into its row cache
        # while the request waits, and pins them there.
        lookup.admit_tokens(request_id, hasher, prompt)
        history = np.zeros(0, dtype=np.int64)
        decode = list(steps[1:])
        for step in range(len(prefill) + len(decode)):
            if step < len(prefill):  # a prefill chunk: its tokens and the next chunk's are known
                tokens = prefill[step]
                upcoming = prefill[step + 1] if step + 1 < len(prefill) else None
            else:  # a decode step: its tokens come from the sampler
                tokens, upcoming = rng.integers(0, vocab, size=decode[step - len(prefill)]), None
            n = len(tokens)
            hidden = torch.randn(n, 1, hidden_size, generator=torch.Generator().manual_seed(step))
            # While a prefill chunk computes, engramd reads the next chunk's rows (before the
            # admission's rows, which wait behind every gather and hint).
            layer.prepare_step(hasher, tokens, history[-3:], next_tokens=upcoming)
            got = layer(hidden, torch.from_numpy(tokens))
            if step == len(prefill) - 1:
                # The prefill has read its rows: unpin them (a cancelled request does the same;
                # the lookup's close releases whatever is left).
                lookup.admit_done(request_id)
            ids = hasher.hash(tokens, history[-3:], layer=layer_id)
            want = reference(hidden, torch.from_numpy(ids))
            equal = torch.equal(got.view(torch.int32), want.view(torch.int32))
            same &= equal
            print(f"step {step}: {n} tokens, {'bit-identical' if equal else 'DIFFERENT'}",
                  file=out)
            history = np.concatenate([history, tokens])
    hasher.close()
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory (config.json, shards, "
                                                       "engram-hash.bin)")
    parser.add_argument("--socket", help="engramd's socket")
    parser.add_argument("--layer", type=int, default=14)
    parser.add_argument("--tokens", type=int, default=64, help="prompt; then 3 decode steps of "
                                                               "6 tokens")
    parser.add_argument("--chunk", type=int, default=32, help="prefill chunk")
    args = parser.parse_args()
    return 0 if run(args.model, args.socket, args.layer, [args.tokens, 6, 6, 6],
                    chunk=args.chunk) else 1


if __name__ == "__main__":
    sys.exit(main())
