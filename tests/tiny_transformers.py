"""Tiny BERT- and GPT-2-style models shared by the transformer training tests (shapes as
benchmarks/bench_workloads.py writes them, shrunk): one encoder/decoder block, a padded
attention mask (BERT) or a causal mask buffer and an LM head tied to the token embedding
(GPT-2), each returning (logits, cross-entropy loss)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, SEQ, BATCH = 16, 2, 8, 3


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


class TinyBert(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(vocab, D), nn.Embedding(SEQ, D)
        self.ln, self.block, self.head = nn.LayerNorm(D), _Block(False), nn.Linear(D, 5)
        self.register_buffer("positions", torch.arange(SEQ), persistent=False)

    def forward(self, ids, attention_mask, labels):
        mask = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        x = self.block(self.ln(self.tok(ids) + self.pos(self.positions)), mask)
        logits = self.head(x[:, 0])
        return logits, F.cross_entropy(logits, labels)


class TinyGpt2(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        torch.manual_seed(0)
        self.vocab = vocab
        self.tok, self.pos = nn.Embedding(vocab, D), nn.Embedding(SEQ, D)
        self.block, self.ln = _Block(True), nn.LayerNorm(D)
        self.register_buffer("positions", torch.arange(SEQ), persistent=False)
        causal = torch.full((SEQ, SEQ), float("-inf")).triu(1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, ids, labels):
        x = self.ln(self.block(self.tok(ids) + self.pos(self.positions), self.causal))
        logits = x @ self.tok.weight.t()  # tied LM head
        return logits, F.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1))
