"""Tiny BERT- and GPT-2-style training steps against eager torch (the transformer speed work:
the cross-entropy gradient from one softmax, split gradients as one Concat, a tied embedding's
gradient added in place, attention with an input padding mask fused for training, the LM
logits handed over). Models as benchmarks/bench_workloads.py writes them, shrunk."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .training_helpers import compare_training

V, D, HEADS, SEQ, BATCH = 37, 16, 2, 8, 3


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, HEADS, d // HEADS).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d // HEADS)) + mask
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d))


class _Block(nn.Module):
    def __init__(self, pre_norm: bool):
        super().__init__()
        self.attn, self.ln1, self.ln2 = _Attention(), nn.LayerNorm(D), nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.pre_norm = pre_norm

    def forward(self, x, mask):
        act = "tanh" if self.pre_norm else "none"
        if self.pre_norm:
            x = x + self.attn(self.ln1(x), mask)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=act))
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x), approximate=act)))


class _Bert(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos, self.ln = nn.Embedding(V, D), nn.Embedding(SEQ, D), nn.LayerNorm(D)
        self.block, self.head = _Block(False), nn.Linear(D, 5)
        self.register_buffer("positions", torch.arange(SEQ), persistent=False)

    def forward(self, ids, attention_mask, labels):
        mask = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        x = self.block(self.ln(self.tok(ids) + self.pos(self.positions)), mask)
        logits = self.head(x[:, 0])
        return logits, F.cross_entropy(logits, labels)


class _Gpt2(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(SEQ, D)
        self.block, self.ln = _Block(True), nn.LayerNorm(D)
        self.register_buffer("positions", torch.arange(SEQ), persistent=False)
        causal = torch.full((SEQ, SEQ), float("-inf")).triu(1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, ids, labels):
        x = self.ln(self.block(self.tok(ids) + self.pos(self.positions), self.causal))
        logits = x @ self.tok.weight.t()  # tied LM head
        return logits, F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def test_bert_style_training_with_padding_mask_matches_eager():
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(2):
        ids = torch.randint(0, V, (BATCH, SEQ), generator=g)
        lengths = torch.tensor([SEQ, 5, 3])
        mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
        batches.append((ids, mask, torch.randint(0, 5, (BATCH,), generator=g)))
    compare_training(_Bert(), _sgd, batches, rtol=1e-4, atol=1e-5)


def test_gpt2_style_training_with_tied_lm_head_matches_eager():
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, V, (BATCH, SEQ), generator=g),
                torch.randint(0, V, (BATCH, SEQ), generator=g)) for _ in range(2)]
    compare_training(_Gpt2(), _sgd, batches, rtol=1e-4, atol=1e-5)
