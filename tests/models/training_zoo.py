"""Exported zoo models with a loss, trained by a TrainingSession and by eager torch.optim.

Each case exports a model of ``tests/models/zoo.py`` in eval mode (dynamo exporter, opset 18),
then appends a loss with ``popart.Builder`` (the session decides training semantics, DESIGN
decision 5):

- ``mlp``: ``aiGraphcore.nllloss`` on ``aiOnnx.logsoftmax(logits)`` with an INT32 label;
- ``cnn``: ONNX ``SoftmaxCrossEntropyLoss`` (INT64 label), BatchNorm in training mode;
- ``transformer_encoder``: a mean squared error written with ops (Sub, Mul, IdentityLoss), and
  a key padding mask input. The exported graph has no Dropout (eval export), so the torch
  reference runs in eval mode too; that model has no BatchNorm.

The torch reference (``torch_train``) runs the same micro-batches through the eager module with
a torch.optim optimizer: one step per ``af`` micro-batches, the gradients summed (Sum) or
averaged (Mean) as spec §5.3 defines.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import numpy as np
import onnx
import torch

import popart_backend as popart
from tests.models import zoo


@dataclasses.dataclass
class TrainingCase:
    """An exported model with a loss, and how to make its data."""

    name: str
    module: torch.nn.Module  # eval-mode module with the initial weights
    model: onnx.ModelProto  # the export plus the loss
    loss: str  # loss tensor id
    label: str  # label (or target) input id
    inputs: tuple[str, ...]  # model input ids, in forward() order
    micro_batch: int
    make_feeds: Callable[[np.random.Generator, tuple[int, ...]], dict[str, np.ndarray]]
    torch_loss: Callable[[torch.nn.Module, dict[str, np.ndarray]], torch.Tensor]
    train_mode: bool  # run the torch reference in train mode (BatchNorm batch statistics)

    def feeds(self, lead: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs and label of shape ``[*lead, micro_batch, ...]`` (e.g. lead = (bps, af))."""
        return self.make_feeds(np.random.default_rng(seed), tuple(lead))

    def parameters(self) -> dict[str, np.ndarray]:
        return {n: p.detach().numpy().copy() for n, p in self.module.named_parameters()}

    def buffers(self) -> dict[str, np.ndarray]:
        return {n: b.detach().numpy().copy() for n, b in self.module.named_buffers()
                if b.dtype.is_floating_point}


def _export(name: str, micro_batch: int, **kwargs) -> tuple[torch.nn.Module, onnx.ModelProto]:
    spec = zoo.SPECS[name]
    module = spec.model(**kwargs)
    proto = zoo.export(module, spec.inputs(micro_batch), spec.output_names, "dynamo", 18)
    return module, proto


def mlp_case(micro_batch: int = 4, **kwargs) -> TrainingCase:
    module, proto = _export("mlp", micro_batch, **kwargs)
    in_features = module.net[0].in_features
    classes = module.net[-1].out_features
    builder = popart.Builder(proto.SerializeToString())
    label = builder.addInputTensor(popart.TensorInfo("INT32", [micro_batch]), "label")
    log_probs = builder.aiOnnx.logsoftmax(["logits"], axis=-1)
    loss = builder.aiGraphcore.nllloss([log_probs, label], reduction=popart.ReductionType.Mean,
                                       inputIsLogProbability=True)

    def make(rng, lead):
        return {
            "x": rng.standard_normal((*lead, micro_batch, in_features)).astype(np.float32),
            label: rng.integers(0, classes, (*lead, micro_batch)).astype(np.int32),
        }

    def torch_loss(m, feeds):
        logits = m(torch.from_numpy(feeds["x"]))
        target = torch.from_numpy(feeds[label]).long()
        return torch.nn.functional.nll_loss(torch.log_softmax(logits, -1), target)

    return TrainingCase("mlp", module, proto_of(builder), loss, label, ("x",), micro_batch, make,
                        torch_loss, train_mode=True)


def cnn_case(micro_batch: int = 4, **kwargs) -> TrainingCase:
    module, proto = _export("cnn", micro_batch, **kwargs)
    classes = module.head[-1].out_features
    image = kwargs.get("image", 16)
    builder = popart.Builder(proto.SerializeToString())
    label = builder.addInputTensor(popart.TensorInfo("INT64", [micro_batch]), "label")
    loss = builder.aiOnnx.softmaxcrossentropyloss(["logits", label], num_outputs=1,
                                                  reduction="mean")[0]

    def make(rng, lead):
        return {
            "x": rng.standard_normal((*lead, micro_batch, 3, image, image)).astype(np.float32),
            label: rng.integers(0, classes, (*lead, micro_batch)).astype(np.int64),
        }

    def torch_loss(m, feeds):
        logits = m(torch.from_numpy(feeds["x"]))
        return torch.nn.functional.cross_entropy(logits, torch.from_numpy(feeds[label]))

    return TrainingCase("cnn", module, proto_of(builder), loss, label, ("x",), micro_batch, make,
                        torch_loss, train_mode=True)


def transformer_case(micro_batch: int = 2, seq: int = 8, d_model: int = 32) -> TrainingCase:
    module, proto = _export("transformer_encoder", micro_batch)
    builder = popart.Builder(proto.SerializeToString())
    target = builder.addInputTensor(popart.TensorInfo("FLOAT", [micro_batch, seq, d_model]),
                                    "target")
    diff = builder.aiOnnx.sub(["hidden", target])
    square = builder.aiOnnx.mul([diff, diff])
    loss = builder.aiGraphcore.identityloss([square], reduction=popart.ReductionType.Mean)
    make_inputs = zoo.SPECS["transformer_encoder"].make_inputs

    def make(rng, lead):
        n = int(np.prod(lead, dtype=np.int64))
        feeds = make_inputs(n * micro_batch, rng)
        feeds = {k: v.reshape(*lead, micro_batch, *v.shape[1:]) for k, v in feeds.items()}
        feeds[target] = rng.standard_normal((*lead, micro_batch, seq, d_model)).astype(
            np.float32)
        return feeds

    def torch_loss(m, feeds):
        hidden = m(torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["padding_mask"]))
        return ((hidden - torch.from_numpy(feeds[target])) ** 2).mean()

    return TrainingCase("transformer_encoder", module, proto_of(builder), loss, target,
                        ("x", "padding_mask"), micro_batch, make, torch_loss, train_mode=False)


def proto_of(builder: popart.Builder) -> onnx.ModelProto:
    return onnx.load_from_string(builder.getModelProto())


CASES = {"mlp": mlp_case, "cnn": cnn_case, "transformer_encoder": transformer_case}


# --- running ------------------------------------------------------------------------------------


def session(case: TrainingCase, optimizer, bps: int, af: int = 1, anchors=(),
            options: popart.SessionOptions | None = None, model=None) -> popart.TrainingSession:
    """A TrainingSession of ``case`` (prepared, weights written)."""
    options = options if options is not None else popart.SessionOptions()
    if af > 1:
        options.enableGradientAccumulation = True
        options.accumulationFactor = af
    flow = popart.DataFlow(bps, {a: popart.AnchorReturnType("All") for a in anchors})
    s = popart.TrainingSession(
        (model or case.model).SerializeToString(), flow, case.loss, optimizer,
        popart.DeviceManager().createCpuDevice(), userOptions=options)
    s.prepareDevice()
    s.weightsFromHost()
    return s


def run(s: popart.TrainingSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, anchors))
    return anchors


def read(s: popart.TrainingSession, ids) -> dict[str, np.ndarray]:
    """Device values of the f32 variables ``ids`` (weights, running statistics, state)."""
    s.weightsToHost()
    out = {i: np.zeros(s.getInfo(i).shape(), np.float32) for i in ids}
    s.readWeights(popart.PyWeightsIO(out))
    return out


def torch_train(case: TrainingCase, steps: list[list[dict[str, np.ndarray]]], make_optimizer,
                mean: bool = True, lr_schedule: dict[int, float] | None = None
                ) -> torch.nn.Module:
    """Train a copy of ``case.module``: one optimizer step per entry of ``steps``, over its
    micro-batches (gradients averaged when ``mean``, else summed). ``lr_schedule`` sets every
    param group's lr before the given step index."""
    module = copy.deepcopy(case.module).train(case.train_mode)
    optimizer = make_optimizer(module.parameters())
    for index, micro_batches in enumerate(steps):
        if lr_schedule and index in lr_schedule:
            for group in optimizer.param_groups:
                group["lr"] = lr_schedule[index]
        optimizer.zero_grad()
        for feeds in micro_batches:
            loss = case.torch_loss(module, feeds)
            (loss / len(micro_batches) if mean else loss).backward()
        optimizer.step()
    return module


def split_steps(feeds: dict[str, np.ndarray], af: int | None = None
                ) -> list[list[dict[str, np.ndarray]]]:
    """``[bps, (af,) mb, ...]`` step inputs -> per weight update, its list of micro-batches."""
    bps = next(iter(feeds.values())).shape[0]
    steps = []
    for b in range(bps):
        if af is None:
            steps.append([{k: v[b] for k, v in feeds.items()}])
        else:
            steps.append([{k: v[b, a] for k, v in feeds.items()} for a in range(af)])
    return steps


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float = 1e-4,
                 atol: float = 1e-6, what: str = "") -> None:
    """Every tensor of ``want`` equals ``got``: |got - want| <= atol + rtol·max|want|."""
    assert set(want) <= set(got), f"missing {sorted(set(want) - set(got))}"
    for name, expected in want.items():
        actual = got[name]
        assert actual.shape == expected.shape, f"{what} {name}: {actual.shape} vs {expected.shape}"
        scale = float(np.abs(expected).max()) if expected.size else 0.0
        error = np.abs(actual.astype(np.float64) - expected)
        worst = np.unravel_index(int(np.argmax(error)), error.shape) if error.size else ()
        bound = atol + rtol * scale
        assert error.size == 0 or error.max() <= bound, (
            f"{what} '{name}': max error {error.max():.3g} at {worst} "
            f"(got {actual[worst]:.7g}, want {expected[worst]:.7g}) exceeds {bound:.3g} "
            f"(rtol {rtol} of max |want| {scale:.4g}, atol {atol})"
        )
