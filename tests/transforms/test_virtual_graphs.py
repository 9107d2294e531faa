"""Virtual graphs and inter-IPU copies (spec §3.4; F20, F21): Manual validation, the Auto
cost-balanced split, IpuCopy insertion, and sharded execution equal to the plain run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.transforms.virtual_graphs import balanced_split
from popart_backend.ops.ipu_copy import IpuCopy
from tests.helpers import check_grad
from tests.session.pipeline_models import (
    MB,
    D,
    chain_model,
    chain_weights,
    device,
    infer,
    options,
)


def _x(bps: int, seed: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((bps, MB, D)).astype(np.float32)


def _inference(proto, anchor, ipus, opts, bps=2):
    flow = popart.DataFlow(bps, {anchor: popart.AnchorReturnType("All")})
    return popart.InferenceSession(proto, flow, device(ipus), userOptions=opts)


# --- Manual -----------------------------------------------------------------------------------


def test_manual_needs_all_or_no_ops_placed_F21():
    builder = popart.Builder(opsets={"ai.onnx": 17})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    with builder.virtualGraph(1):
        h = builder.aiOnnx.tanh([x])
    y = builder.aiOnnx.sigmoid([h])
    builder.addOutputTensor(y)
    with pytest.raises(popart.popart_exception, match=(
            "Either all ops in the main graph must have their virtual graph ids set, or none "
            "must.")):
        _inference(builder.getModelProto(), y, 2, options(2))


def test_manual_ipu_must_exist_on_the_device_F21():
    proto, _, _ = chain_model(chain_weights(4), 4, stages=False)
    with pytest.raises(popart.popart_exception,
                       match="is placed on virtual graph 2, but the device has 2 IPU"):
        _inference(proto, "x", 2, options(2))


def test_execution_phases_need_a_phase_on_every_op_F21():
    """ExecutionPhases is built (tests/transforms/test_execution_phases.py); ops without an
    executionPhase annotation are refused."""
    proto, _, _ = chain_model(chain_weights(2), 2, stages=False)
    opts = options(2, mode=popart.VirtualGraphMode.ExecutionPhases)
    opts.executionPhaseSettings.phases = 2
    with pytest.raises(popart.popart_exception, match="needs an execution phase on every op"):
        _inference(proto, "x", 2, opts)


def test_off_ignores_annotations_F21():
    weights, x = chain_weights(2), _x(2)
    got, session = infer(weights, x, 2, options(1), bps=2, stages=False)
    assert session._program.ipus_per_replica == 1
    assert not any(op.op_type == "IpuCopy" for op in session._ir.main.ops.values())
    want, _ = infer(weights, x, 1, options(), bps=2, place=False)
    np.testing.assert_array_equal(got, want)


# --- sharded execution and copies -------------------------------------------------------------


@pytest.mark.parametrize("ipus", [2, 4])
def test_sharded_inference_equals_plain_run_F20(ipus):
    weights, x = chain_weights(ipus, seed=ipus), _x(3)
    want, _ = infer(weights, x, 1, options(), bps=3, place=False)
    got, session = infer(weights, x, ipus, options(ipus), bps=3, stages=False)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    graph = session._ir.main
    copies = sorted((op.attrs.source_ipu, op.attrs.dest_ipu) for op in graph.ops_of_type("IpuCopy"))
    assert copies == [(k, k + 1) for k in range(ipus - 1)]
    for op in graph.ops.values():
        for t in op.inputs:
            if t is not None and t.producer is not None and op.op_type != "IpuCopy" and (
                    t.producer.op_type != "IpuCopy"):
                assert t.producer.settings.ipu == op.settings.ipu, op
    assert session._program.ipus_per_replica == ipus


def test_ipu_copy_is_the_identity_with_an_identity_gradient():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    op = IpuCopy(IpuCopy.Attrs(source_ipu=0, dest_ipu=1))
    source = torch.from_numpy(x)
    copied = op.kernel(source)
    assert torch.equal(copied, source) and copied.data_ptr() != source.data_ptr()
    check_grad("IpuCopy", [x], {"source_ipu": 0, "dest_ipu": 1}, domain="ai.graphcore",
               ref=lambda a: a)


# --- Auto ---------------------------------------------------------------------------------------


def test_balanced_split_minimises_the_largest_part():
    assert balanced_split([1.0] * 8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert balanced_split([4, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1]
    parts = balanced_split([3, 1, 2, 2, 1, 3], 3)
    sums = [sum(c for c, p in zip([3, 1, 2, 2, 1, 3], parts) if p == k) for k in range(3)]
    assert max(sums) == 4 and parts == sorted(parts)
    assert balanced_split([5.0], 4) == [0]


def test_auto_splits_a_chain_into_balanced_parts_F21():
    weights, x = chain_weights(8, seed=9), _x(2)
    got, session = infer(weights, x, 4, options(4, mode=popart.VirtualGraphMode.Auto), bps=2,
                         place=False)
    graph = session._ir.main
    per_ipu: dict[int, int] = {}
    for op in graph.ops_of_type("MatMul"):
        per_ipu[op.settings.ipu] = per_ipu.get(op.settings.ipu, 0) + 1
    assert per_ipu == {0: 2, 1: 2, 2: 2, 3: 2}
    assert session._program.ipus_per_replica == 4
    want, _ = infer(weights, x, 1, options(), bps=2, place=False)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_auto_pipelined_inference_equals_plain_run_F21_F64():
    weights, x = chain_weights(4, seed=11), _x(4)
    opts = options(2, True, mode=popart.VirtualGraphMode.Auto)
    got, session = infer(weights, x, 2, opts, bps=4, place=False)
    assert session._program.num_stages == 2
    want, _ = infer(weights, x, 1, options(), bps=4, place=False)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
