"""Custom ops (spec §7) inside pipelined and replicated training (issue #8 scope item 3):
the pipelined run with accumulation and the rf=2 run equal the plain single-IPU run."""

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.custom.api import _CUSTOM, GradOp, GradOpInType, Op
from popart_backend.custom.registration import register_grad_op, register_op
from popart_backend.ops import registry

DOMAIN = "test.multi_ipu"
CUBE = popart.OperatorIdentifier(DOMAIN, "Cube", 1)
CUBE_GRAD = popart.OperatorIdentifier(DOMAIN, "CubeGrad", 1)
D, MB = 4, 2


@pytest.fixture(autouse=True)
def cube_op():
    saved = {key: dict(table) for key, table in registry._REGISTRY.items()}
    saved_custom = dict(_CUSTOM)

    @register_op(CUBE)
    class Cube(Op):
        def __init__(self, opid_, attributes, settings):
            super().__init__(opid_, settings)

        def setup(self, in_infos):
            return [in_infos[0]]

        def grad_ops(self):
            return [CubeGrad(self)]

        def compute(self, ctx, x):
            return x * x * x

    @register_grad_op(CUBE_GRAD)
    class CubeGrad(GradOp):
        grad_input_info = [(0, 0, GradOpInType.GradOut), (1, 0, GradOpInType.In)]
        grad_out_to_non_grad_in = {0: 0}

        def __init__(self, fwd):
            super().__init__(CUBE_GRAD, fwd.settings)

        def setup(self, in_infos):
            return [in_infos[1]]

        def compute(self, ctx, dy, x):
            return dy * 3.0 * x * x

    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    _CUSTOM.clear()
    _CUSTOM.update(saved_custom)


def _model(weights, placed: bool):
    """x @ w0 -> Cube (IPU 0, stage 0) -> @ w1 -> tanh -> L1 (IPU 1, stage 1)."""
    builder = popart.Builder(opsets={"ai.onnx": 17, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, D]), "x")
    w0 = builder.addInitializedInputTensor(weights[0], "w0")
    w1 = builder.addInitializedInputTensor(weights[1], "w1")

    def place(ipu):
        if not placed:
            return _Nothing()
        return _Both(builder.virtualGraph(ipu), builder.pipelineStage(ipu))

    with place(0):
        h = builder.aiOnnx.matmul([x, w0])
        (h,) = builder.customOp(opName="Cube", opVersion=1, domain=DOMAIN, inputs=[h],
                                attributes={}, numOutputs=1)
    with place(1):
        h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w1])])
        loss = builder.aiGraphcore.l1loss([h], 0.5, reduction=popart.ReductionType.Mean)
    return builder.getModelProto(), loss


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Both:
    def __init__(self, *contexts):
        self.contexts = contexts

    def __enter__(self):
        for c in self.contexts:
            c.__enter__()

    def __exit__(self, *exc):
        for c in reversed(self.contexts):
            c.__exit__(*exc)


def _train(weights, x, ipus, opts, bps, placed):
    proto, loss = _model(weights, placed)
    flow = popart.DataFlow(bps, {loss: popart.AnchorReturnType("All")})
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus})
    session = popart.TrainingSession(proto, flow, loss, popart.ConstSGD(0.05), device,
                                     userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    session.weightsToHost()
    out = {k: np.zeros((D, D), np.float32) for k in ("w0", "w1")}
    session.readWeights(popart.PyWeightsIO(out))
    return out


def _weights():
    rng = np.random.default_rng(3)
    return [rng.standard_normal((D, D)).astype(np.float32) * 0.4 for _ in range(2)]


def _accumulating(af, **values):
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = af
    opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    for key, value in values.items():
        setattr(opts, key, value)
    return opts


def test_custom_op_in_a_pipeline_equals_the_plain_run():
    """F83, F68: a custom op on stage 0 of a 2-IPU pipeline (af=4, bps=2)."""
    weights = _weights()
    x = np.random.default_rng(4).standard_normal((2 * 4 * MB, D)).astype(np.float32)
    plain = _train(weights, x, 1, _accumulating(4), bps=2, placed=False)
    piped = _train(weights, x, 2, _accumulating(4, virtualGraphMode=popart.VirtualGraphMode.Manual,
                                                enablePipelining=True), bps=2, placed=True)
    for key in plain:
        np.testing.assert_allclose(piped[key], plain[key], rtol=1e-5, atol=1e-7, err_msg=key)
        assert not np.allclose(plain[key], weights[int(key[1])])  # it trained


def test_custom_op_with_replicas_equals_the_combined_batch():
    """F71, F73: rf=2 with Mean reduction equals one replica accumulating the same two
    micro-batches (af=2, Mean): replica r and accumulation step a read the same chunk."""
    weights = _weights()
    x = np.random.default_rng(5).standard_normal((2 * MB, D)).astype(np.float32)
    single = _train(weights, x, 1, _accumulating(2), bps=1, placed=False)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    replicated = _train(weights, x, 2, opts, bps=1, placed=False)
    for key in single:
        np.testing.assert_allclose(replicated[key], single[key], rtol=1e-5, atol=1e-7,
                                   err_msg=key)
        assert not np.allclose(single[key], weights[int(key[1])])
