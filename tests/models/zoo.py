"""Small, seeded PyTorch models and their ONNX exports, shared by the model tests and benchmarks.

Every model is built from a config (no downloaded weights) with ``torch.manual_seed``, in eval
mode. ``export()`` runs one of the two torch exporters:

- ``"dynamo"``: ``torch.onnx.export(..., dynamo=True, optimize=False, opset_version=18)``, the
  path the frontend uses (DESIGN: the data path);
- ``"torchscript"``: the legacy TorchScript exporter (``dynamo=False``) at opset 11 or 13.

Some model/exporter pairs cannot be exported at all; ``EXPORT_LIMITS`` lists them with the
exporter's own reason, so tests skip them by name instead of hiding the failure.
"""

from __future__ import annotations

import dataclasses
import io
import warnings
from typing import Callable

import numpy as np
import onnx
import torch

# (model name, exporter, opset) -> why the exporter refuses it. Checked: the export is still
# attempted and must fail with an UnsupportedOperatorError, so the table cannot go stale.
EXPORT_LIMITS = {
    ("transformer_encoder", "torchscript", 11): (
        "TorchScript exporter: 'aten::unflatten' (MultiheadAttention's packed in-projection) "
        "has no ONNX symbolic before opset 13"
    ),
    ("transformer_encoder", "torchscript", 13): (
        "TorchScript exporter: 'aten::scaled_dot_product_attention' (MultiheadAttention) has no "
        "ONNX symbolic before opset 14"
    ),
}


# --- models -----------------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, width: int = 32, depth: int = 2, in_features: int = 16, classes: int = 10):
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Linear(in_features, width), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        layers.append(torch.nn.Linear(width, classes))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    """Conv/BatchNorm/ReLU/MaxPool blocks, an AvgPool, Flatten and a Linear classifier."""

    def __init__(self, channels: tuple[int, ...] = (8, 16), image: int = 16, classes: int = 10):
        super().__init__()
        blocks: list[torch.nn.Module] = []
        c_in = 3
        for i, c_out in enumerate(channels):
            blocks += [
                torch.nn.Conv2d(c_in, c_out, 3, padding=1),
                torch.nn.BatchNorm2d(c_out),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2) if i < len(channels) - 1 else torch.nn.AvgPool2d(2),
            ]
            c_in = c_out
        side = image // 2 ** len(channels)
        self.features = torch.nn.Sequential(*blocks)
        self.head = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(c_in * side * side, classes)
        )
        # Non-trivial running statistics, so eval-mode BatchNorm is not an identity.
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 1.5)
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        return self.head(self.features(x))


class TransformerEncoder(torch.nn.Module):
    """Two nn.TransformerEncoderLayer (batch_first) with a key padding mask."""

    def __init__(self, d_model: int = 32, heads: int = 4, ff: int = 64, layers: int = 2):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x, padding_mask):
        return self.encoder(x, src_key_padding_mask=padding_mask)


def _transformers():
    import transformers

    return transformers


class Bert(torch.nn.Module):
    """transformers BertModel from a small BertConfig; returns (last_hidden_state, pooler_output)."""

    def __init__(self, hidden: int = 64, layers: int = 2, heads: int = 2, vocab: int = 100,
                 attn: str = "sdpa"):
        super().__init__()
        tf = _transformers()
        config = tf.BertConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=4 * hidden,
            max_position_embeddings=512,
            attn_implementation=attn,
        )
        self.bert = tf.BertModel(config)

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


class GPT2(torch.nn.Module):
    """transformers GPT2LMHeadModel from a small GPT2Config; returns the logits."""

    def __init__(self, hidden: int = 64, layers: int = 2, heads: int = 2, vocab: int = 100,
                 attn: str = "sdpa"):
        super().__init__()
        tf = _transformers()
        config = tf.GPT2Config(vocab_size=vocab, n_positions=128, n_embd=hidden, n_layer=layers,
                               n_head=heads, attn_implementation=attn)
        self.gpt2 = tf.GPT2LMHeadModel(config)

    def forward(self, input_ids, attention_mask):
        return self.gpt2(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


# --- specs ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build a model and make its inputs for a given batch size."""

    name: str
    build: Callable[..., torch.nn.Module]
    make_inputs: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
    output_names: tuple[str, ...]
    kwargs: dict = dataclasses.field(default_factory=dict)

    def model(self, **overrides) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.build(**{**self.kwargs, **overrides}).eval()

    def inputs(self, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
        return self.make_inputs(batch, np.random.default_rng(seed))


def _token_inputs(seq: int, vocab: int = 100):
    def make(batch, rng):
        ids = rng.integers(0, vocab, size=(batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), dtype=np.int64)
        mask[::2, seq - seq // 4:] = 0  # padding on every other sample
        return {"input_ids": ids, "attention_mask": mask}

    return make


def _encoder_inputs(seq: int, d_model: int):
    def make(batch, rng):
        x = rng.standard_normal((batch, seq, d_model)).astype(np.float32)
        mask = np.zeros((batch, seq), dtype=bool)
        mask[::2, seq - seq // 4:] = True  # True = padded, ignored by attention
        return {"x": x, "padding_mask": mask}

    return make


SPECS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(
        "mlp", MLP,
        lambda b, rng: {"x": rng.standard_normal((b, 16)).astype(np.float32)},
        ("logits",),
    ),
    "cnn": ModelSpec(
        "cnn", CNN,
        lambda b, rng: {"x": rng.standard_normal((b, 3, 16, 16)).astype(np.float32)},
        ("logits",),
    ),
    "transformer_encoder": ModelSpec(
        "transformer_encoder", TransformerEncoder, _encoder_inputs(8, 32), ("hidden",),
    ),
    "bert": ModelSpec(
        "bert", Bert, _token_inputs(8), ("last_hidden_state", "pooler_output"),
    ),
    "gpt2": ModelSpec("gpt2", GPT2, _token_inputs(8), ("logits",)),
}

# transformers picks scaled_dot_product_attention by default; the TorchScript exporter has no
# symbolic for it before opset 14, so those exports use the config's "eager" attention (same
# weights, same maths, spelled as MatMul/Softmax).
TORCHSCRIPT_OVERRIDES = {"bert": {"attn": "eager"}, "gpt2": {"attn": "eager"}}


def to_torch_inputs(feeds: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in feeds.values())


def eager_outputs(model: torch.nn.Module, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*to_torch_inputs(feeds))
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.detach().numpy() for o in out]


def export(model: torch.nn.Module, feeds: dict[str, np.ndarray], output_names, exporter: str,
           opset: int) -> onnx.ModelProto:
    """Export ``model`` at the static shapes of ``feeds`` with the named torch exporter."""
    args = to_torch_inputs(feeds)
    names = dict(input_names=list(feeds), output_names=list(output_names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(model, args, dynamo=True, optimize=False,
                                        opset_version=opset, verbose=False, **names)
            return program.model_proto
        if exporter == "torchscript":
            buffer = io.BytesIO()
            torch.onnx.export(model, args, buffer, dynamo=False, opset_version=opset, **names)
            return onnx.load_from_string(buffer.getvalue())
    raise ValueError(f"unknown exporter {exporter!r}")


def op_types(model: onnx.ModelProto) -> list[str]:
    return sorted({n.op_type if not n.domain else f"{n.domain}::{n.op_type}"
                   for n in model.graph.node})
