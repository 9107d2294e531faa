"""Tiny BERT- and GPT-2-style training steps against eager torch (the transformer speed work:
the cross-entropy gradient from one softmax, split gradients as one Concat, a tied embedding's
gradient added in place, attention with an input padding mask fused for training, the LM
logits handed over). Models as benchmarks/bench_workloads.py writes them, shrunk."""

from __future__ import annotations

import torch

from tests.tiny_transformers import BATCH, SEQ, TinyBert, TinyGpt2

from .training_helpers import compare_training

V = 37


def _bert():
    return TinyBert(V)


def _gpt2():
    return TinyGpt2(V)


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
    compare_training(_bert(), _sgd, batches, rtol=1e-4, atol=1e-5)


def test_gpt2_style_training_with_tied_lm_head_matches_eager():
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, V, (BATCH, SEQ), generator=g),
                torch.randint(0, V, (BATCH, SEQ), generator=g)) for _ in range(2)]
    compare_training(_gpt2(), _sgd, batches, rtol=1e-4, atol=1e-5)
