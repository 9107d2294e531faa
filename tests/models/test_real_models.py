"""Real PyTorch models exported to ONNX run on popart_backend like onnxruntime does (F2, §2.1).

Each model of ``tests/models/zoo.py`` (MLP, CNN, nn.TransformerEncoder, BERT-style, GPT-2-style)
is exported with the dynamo exporter (opset 18) and the TorchScript exporter (opsets 11 and 13),
then run three ways: the IR + execution plan directly, the public ``InferenceSession`` API with
batchesPerStep 2, and onnxruntime / eager torch as references.
"""

from __future__ import annotations

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.errors import UnsupportedOpError
from popart_backend.importer.onnx_model import import_model
from popart_backend.ops.registry import resolve
from popart_backend.transforms.pipeline import inference_passes, run_passes
from tests.helpers import assert_close, run_onnxruntime, run_popart
from tests.models import zoo

RTOL, ATOL = 1e-4, 1e-5
# Eager torch is a sanity check of the export itself: onnxruntime and torch use different
# kernels (and torch's fused attention), so allow a little more.
EAGER_RTOL, EAGER_ATOL = 1e-3, 1e-4

EXPORTS = [("dynamo", 18), ("torchscript", 11), ("torchscript", 13)]
CASES = [
    pytest.param(name, exporter, opset, id=f"{name}-{exporter}{opset}")
    for name in zoo.SPECS
    for exporter, opset in EXPORTS
]


def unsupported_ops(model) -> list[str]:
    """Node types of ``model`` the registry cannot resolve (the importer rewrites a few, like
    the sequence ops, before resolving), to list them all when an import fails."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    missing = set()
    for node in model.graph.node:
        domain = node.domain or "ai.onnx"
        try:
            resolve(node.op_type, domain, opsets.get(domain, 1))
        except UnsupportedOpError:
            missing.add(f"{node.op_type}-{opsets.get(domain, 1)}")
    return sorted(missing)


def explained(model, run):
    """``run()``, turning an UnsupportedOpError into a failure listing every unregistered type."""
    try:
        return run()
    except UnsupportedOpError as exc:
        pytest.fail(f"{exc}\nNode types without a registered op: {unsupported_ops(model)}")


@pytest.mark.parametrize("name, exporter, opset", CASES)
def test_model_matches_onnxruntime(exports, name, exporter, opset):
    """F2: the exported model imported and executed here equals onnxruntime (rtol 1e-4)."""
    case = exports.get(name, exporter, opset)
    ours = explained(case.model, lambda: run_popart(case.model, case.feeds))
    reference = run_onnxruntime(case.model, case.feeds)
    for out in zoo.SPECS[name].output_names:
        assert_close(ours[out], reference[out], f"{name} {exporter}{opset} '{out}' vs ort",
                     rtol=RTOL, atol=ATOL)
        assert_close(ours[out], case.eager[out], f"{name} {exporter}{opset} '{out}' vs torch",
                     rtol=EAGER_RTOL, atol=EAGER_ATOL)


@pytest.mark.parametrize("name, exporter, opset", CASES)
def test_model_through_inference_session(exports, name, exporter, opset):
    """§2.1: InferenceSession(path, DataFlow(2, ALL anchors), cpu device) + PyStepIO runs two
    micro-batches per step; each equals onnxruntime on that micro-batch."""
    case = exports.get(name, exporter, opset)
    spec = zoo.SPECS[name]
    batches_per_step = 2
    micro_batches = [case.feeds, spec.inputs(len(next(iter(case.feeds.values()))), seed=1)]
    step_inputs = {k: np.stack([mb[k] for mb in micro_batches]) for k in case.feeds}

    anchors = {out: popart.AnchorReturnType("All") for out in spec.output_names}
    session = explained(case.model, lambda: popart.InferenceSession(
        fnModel=str(case.path),
        dataFlow=popart.DataFlow(batches_per_step, anchors),
        deviceInfo=popart.DeviceManager().createCpuDevice(),
    ))
    session.prepareDevice()
    anchor_arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO(step_inputs, anchor_arrays))

    for i, mb in enumerate(micro_batches):
        reference = run_onnxruntime(case.model, mb)
        for out in spec.output_names:
            assert anchor_arrays[out].shape[0] == batches_per_step
            assert_close(anchor_arrays[out][i], reference[out],
                         f"{name} {exporter}{opset} '{out}' micro-batch {i}", rtol=RTOL, atol=ATOL)


FUSED = {
    ("mlp", "dynamo", 18): {"LinearBias", "Gelu"},
    ("cnn", "dynamo", 18): {"ConvBiasAct"},
    ("bert", "dynamo", 18): {"LinearBias", "Gelu", "Attention"},
    ("bert", "torchscript", 13): {"LinearBias", "Gelu", "LayerNorm"},
    ("gpt2", "dynamo", 18): {"Gelu", "Attention"},
}


@pytest.mark.parametrize("key", list(FUSED), ids=lambda k: f"{k[0]}-{k[1]}{k[2]}")
def test_inference_fusions_fire_on_exported_models(exports, key):
    """DESIGN decision 9: the compile-time fusions recognise what the exporters write, and the
    fused graph still equals onnxruntime."""
    case = exports.get(*key)
    ir = import_model(case.model, constant_weights=True)
    run_passes(ir, inference_passes(), debug=True)
    present = {op.op_type for op in ir.main.ops.values()}
    assert FUSED[key] <= present, f"missing fused ops {FUSED[key] - present}"
    plan = ExecutionPlan(ir.main, keep=ir.main.outputs)
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(case.feeds[name]))
    plan.execute()
    reference = run_onnxruntime(case.model, case.feeds)
    for out in zoo.SPECS[key[0]].output_names:
        assert_close(plan.get_value(out).numpy(), reference[out], f"{key} '{out}' fused",
                     rtol=RTOL, atol=ATOL)
