"""Custom operators in Python (spec §7, F83–F94): registration, sessions, gradients, errors.

Every test registers its ops inside the ``clean_registry`` fixture, which restores the op
registry afterwards, so other tests (and docs/supported_ops.md checks) never see them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import popart_backend as popart
import popart_backend.custom as custom
from popart_backend.custom.api import _CUSTOM, GradOp, GradOpInType, Op
from popart_backend.custom.registration import register_grad_op, register_op
from popart_backend.ops import registry

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "test.custom"


@pytest.fixture(autouse=True)
def clean_registry():
    saved = {key: dict(table) for key, table in registry._REGISTRY.items()}
    saved_custom = dict(_CUSTOM)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    _CUSTOM.clear()
    _CUSTOM.update(saved_custom)


def opid(name: str, version: int = 1):
    return popart.OperatorIdentifier(DOMAIN, name, version)


def infer_session(builder, anchors, bps=1, options=None, num_ipus=1):
    session = popart.InferenceSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(bps, {a: popart.AnchorReturnType("All") for a in anchors}),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": num_ipus}),
        userOptions=options or popart.SessionOptions(),
    )
    session.prepareDevice()
    return session


def run(session, inputs):
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO(inputs, arrays))
    return arrays


def train_session(builder, loss, anchors, lr=0.1):
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(),
        dataFlow=popart.DataFlow(1, {a: popart.AnchorReturnType("All") for a in anchors}),
        loss=loss,
        optimizer=popart.ConstSGD(lr),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({}),
    )
    session.prepareDevice()
    session.weightsFromHost()
    return session


def read_weight(session, weight_id, like):
    session.weightsToHost()
    out = np.empty_like(like)
    session.readWeights(popart.PyWeightsIO({weight_id: out}))
    return out


class Unary(Op):
    """A shape-preserving op: subclasses define compute."""

    def __init__(self, opid_, attributes, settings):
        super().__init__(opid_, settings)
        self.attrs = dict(attributes)

    def setup(self, in_infos):
        return [in_infos[0]]


# --- the §7.3 example (F94) -----------------------------------------------------------------------


def test_leaky_relu_example_trains_one_step_like_torch():
    """F93, F94: the example module, loaded by path, trains one step and matches torch."""
    module = popart.loadCustomOpModule(ROOT / "examples" / "custom_op_leaky_relu.py")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    ours = module.run_popart(x, w)
    ref = module.run_torch(x, w)
    assert ours["shape"] == [1, 2, 4, 4]  # F90: getTensorShape through the registered setup
    for name in ("leaky_relu", "y", "loss", "w_updated"):
        np.testing.assert_allclose(ours[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.abs(ours["w_updated"] - w).max() > 1e-6  # the step did change the weight
    # The example registered both ops through the one registry; only the forward is public.
    supported = popart.getSupportedOperations(False)
    assert popart.OperatorIdentifier("custom.ops", "LeakyRelu", 1) in supported
    assert popart.OperatorIdentifier("custom.ops", "LeakyReluGrad", 1) not in supported
    assert popart.OperatorIdentifier("custom.ops", "LeakyReluGrad", 1) in (
        popart.getSupportedOperations(True))


def test_example_script_exits_zero(tmp_path):
    """The example's main() reports OK (the script a newcomer runs)."""
    module = popart.loadCustomOpModule(ROOT / "examples" / "custom_op_leaky_relu.py")
    assert module.main() == 0


# --- several outputs, attributes, seeds, replicas ---------------------------------------------------


def _register_sin_cos():
    @register_op(opid("SinCos"))
    class SinCos(Op):
        def __init__(self, opid_, attributes, settings):
            super().__init__(opid_, settings)

        def setup(self, in_infos):
            return [in_infos[0], in_infos[0]]

        def grad_ops(self):
            return [SinCosGrad(self)]

        def compute(self, ctx, x):
            return np.sin(x), np.cos(x)

    @register_grad_op(opid("SinCosGrad"))
    class SinCosGrad(GradOp):
        grad_input_info = [(0, 0, GradOpInType.GradOut), (1, 1, GradOpInType.GradOut),
                           (2, 0, GradOpInType.In)]
        grad_out_to_non_grad_in = {0: 0}

        def __init__(self, fwd):
            super().__init__(opid("SinCosGrad"), fwd.settings)

        def setup(self, in_infos):
            return [in_infos[2]]

        def compute(self, ctx, d_sin, d_cos, x):
            return d_sin * np.cos(x) - d_cos * np.sin(x)


def test_two_outputs_forward_and_training_match_torch():
    """F83, F84, F91: numOutputs=2 and a grad op reading both output gradients."""
    _register_sin_cos()
    rng = np.random.default_rng(2)
    x_value = rng.standard_normal((2, 3)).astype(np.float32)
    w_value = rng.standard_normal((2, 3)).astype(np.float32)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = builder.addInitializedInputTensor(w_value, "w")
    sin, cos = builder.customOp("SinCos", 1, DOMAIN, [builder.aiOnnx.mul([x, w])], numOutputs=2)
    loss = builder.aiGraphcore.l1loss([builder.aiOnnx.add([sin, builder.aiOnnx.mul([cos, cos])])],
                                      1.0)
    assert builder.getTensorShape(cos) == [2, 3]
    session = train_session(builder, loss, [sin, cos, loss], lr=0.1)
    out = run(session, {x: x_value})
    updated = read_weight(session, w, w_value)

    wt = torch.tensor(w_value, requires_grad=True)
    z = torch.from_numpy(x_value) * wt
    ref_loss = (torch.sin(z) + torch.cos(z) ** 2).abs().mean()
    ref_loss.backward()
    np.testing.assert_allclose(out[sin], np.sin(x_value * w_value), rtol=1e-6)
    np.testing.assert_allclose(out[cos], np.cos(x_value * w_value), rtol=1e-6)
    np.testing.assert_allclose(out[loss], ref_loss.item(), rtol=1e-6)
    np.testing.assert_allclose(updated, (wt - 0.1 * wt.grad).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_attributes_of_every_onnx_type_reach_the_op():
    """F88, F91: int, float, string, ints, floats, strings attributes, checked by regexes."""
    seen = {}

    @register_op(opid("Attrs"), definition=popart.OpDefinition(
        inputs=[("x", ["FLOAT"])], outputs=[("y", ["FLOAT"])],
        attributes={"i": r"-?\d+", "f": "*", "s": r"[a-z]+", "ints": r"\d+", "floats": "*",
                    "strings": r"[a-z]+"}))
    class Attrs(Unary):
        def compute(self, ctx, x):
            seen.update(self.attrs)
            a = self.attrs
            return (x * a["f"] + a["i"] + sum(a["ints"]) + sum(a["floats"])).astype(np.float32)

    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    attributes = {"i": -2, "f": 0.5, "s": "abc", "ints": [1, 2], "floats": [0.25, 0.5],
                  "strings": ["p", "q"]}
    (y,) = builder.customOp("Attrs", 1, DOMAIN, [x], attributes)
    out = run(infer_session(builder, [y]), {x: np.arange(3, dtype=np.float32)})
    np.testing.assert_allclose(out[y], np.arange(3) * 0.5 - 2 + 3 + 0.75)
    assert seen == {"i": -2, "f": 0.5, "s": "abc", "ints": (1, 2), "floats": (0.25, 0.5),
                    "strings": ("p", "q")}
    assert all(type(seen[k]) is t for k, t in (("i", int), ("f", float), ("s", str)))


def test_random_seed_changes_per_micro_batch_and_replays():
    """F83 requiresRandomSeed: ctx.seed is new each micro-batch, the same for the same seed;
    ops that do not ask get None."""
    seeds = []

    @register_op(opid("Noise"))
    class Noise(Unary):
        requires_random_seed = True

        def compute(self, ctx, x):
            seeds.append(ctx.seed)
            rng = np.random.default_rng(ctx.seed)
            return x + rng.standard_normal(x.shape).astype(x.dtype)

    @register_op(opid("NoSeed"))
    class NoSeed(Unary):
        def compute(self, ctx, x):
            assert ctx.seed is None
            return x.copy()

    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4]), "x")
    (y,) = builder.customOp("Noise", 1, DOMAIN, builder.customOp("NoSeed", 1, DOMAIN, [x]))
    data = {x: np.zeros((3, 4), np.float32)}
    first = run(infer_session(builder, [y], bps=3), data)[y]
    assert len({tuple(row) for row in first}) == 3  # every micro-batch draws anew
    again = infer_session(builder, [y], bps=3)
    np.testing.assert_array_equal(run(again, data)[y], first)
    assert not np.array_equal(run(again, data)[y], first)  # the counter moves on across runs
    again.setRandomSeed(0)
    np.testing.assert_array_equal(run(again, data)[y], first)
    again.setRandomSeed(5)
    assert not np.array_equal(run(again, data)[y], first)
    assert all(isinstance(s, int) for s in seeds)


def test_replicated_inference_sees_replica_index():
    """Custom ops in a replicated run: each replica computes its micro-batch with ctx.replica
    and ctx.ipu set."""

    @register_op(opid("WhereAmI"))
    class WhereAmI(Unary):
        def compute(self, ctx, x):
            return x + np.float32(10 * ctx.replica + 100 * ctx.ipu + 1000 * ctx.num_replicas)

    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    (y,) = builder.customOp("WhereAmI", 1, DOMAIN, [x])
    options = popart.SessionOptions()
    options.enableReplicatedGraphs = True
    options.replicatedGraphCount = 2
    session = infer_session(builder, [y], bps=2, options=options, num_ipus=2)
    data = np.zeros((2, 2, 2), np.float32)  # [bps, replicas, 2]
    out = run(session, {x: data})[y]
    assert out.shape == (2, 2, 2)
    for replica in range(2):
        np.testing.assert_array_equal(out[:, replica], 2000 + 110 * replica)


# --- in-place variants ------------------------------------------------------------------------------


def _register_scale_pair():
    @register_op(opid("ScaleInplace"))
    class ScaleInplace(Unary):
        modifies_inputs = (0,)

        def compute(self, ctx, x):
            x *= np.float32(self.attrs["factor"])
            return x

    @register_op(opid("Scale"))
    class Scale(Unary):
        def compute(self, ctx, x):
            return x * np.float32(self.attrs["factor"])

        def inplace_variants(self):
            return [(opid("ScaleInplace"), 10.0)]

    return Scale


def test_inplace_variant_used_when_safe():
    """F83 in-place: the pass switches Scale to ScaleInplace when its input is a temporary
    only it reads; results are unchanged, and the variant writes that temporary's storage."""
    _register_scale_pair()
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    (first,) = builder.customOp("Scale", 1, DOMAIN, [x], {"factor": 2.0})
    (second,) = builder.customOp("Scale", 1, DOMAIN, [first], {"factor": 3.0})
    (kept,) = builder.customOp("Scale", 1, DOMAIN, [second], {"factor": 5.0})
    session = infer_session(builder, [kept, second])
    data = np.arange(3, dtype=np.float32)
    out = run(session, {x: data.copy()})
    np.testing.assert_array_equal(out[second], data * 6)
    np.testing.assert_array_equal(out[kept], data * 30)
    graph = session._ir.main
    kinds = {t: graph.tensors[t].producer.op_type for t in (first, second, kept)}
    # x is a model input and 'second' is anchored: only the op reading 'first' goes in place.
    assert kinds == {first: "Scale", second: "ScaleInplace", kept: "Scale"}


def test_inplace_variant_directly_on_a_model_input_is_refused():
    _register_scale_pair()
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    (y,) = builder.customOp("ScaleInplace", 1, DOMAIN, [x], {"factor": 2.0})
    with pytest.raises(popart.popart_exception, match="ScaleInplace.*in place.*model input"):
        infer_session(builder, [y])


def test_compute_may_not_write_inputs_it_only_reads():
    @register_op(opid("Sneaky"))
    class Sneaky(Unary):
        def compute(self, ctx, x):
            x += 1
            return x

    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    (y,) = builder.customOp("Sneaky", 1, DOMAIN, [x])
    data = np.zeros(3, np.float32)
    with pytest.raises(popart.popart_runtime_error, match="Sneaky.*read-only"):
        run(infer_session(builder, [y]), {x: data})
    np.testing.assert_array_equal(data, 0)


# --- ONNX files, cost ---------------------------------------------------------------------------------


def test_custom_domain_node_in_an_onnx_file(tmp_path):
    """F92: a NodeProto of the custom domain plus an opset import for it."""
    @register_op(opid("Double"))
    class Double(Unary):
        def compute(self, ctx, x):
            return x * 2

        def cost(self, in_infos):
            return 7 * in_infos[0].nelms(), 123

    node = helper.make_node("Double", ["x"], ["y"], domain=DOMAIN, name="double")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(DOMAIN, 1)])
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    session = popart.InferenceSession(str(path), popart.DataFlow(1, ["y"]),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    out = run(session, {"x": np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(out["y"], 2)
    (op,) = [o for o in session._ir.main.ops.values() if o.op_type == "Double"]
    assert op.cost() == (28, 123)  # the optional cost() feeds the cycle model


# --- errors ---------------------------------------------------------------------------------------------


def test_duplicate_registration_warns_and_replaces():
    @register_op(opid("Dup"))
    class First(Unary):
        def compute(self, ctx, x):
            return x + 1

    with pytest.warns(UserWarning, match="already registered.*replaces"):
        @register_op(opid("Dup"))
        class Second(Unary):
            def compute(self, ctx, x):
                return x + 2

    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1]), "x")
    (y,) = builder.customOp("Dup", 1, DOMAIN, [x])
    out = run(infer_session(builder, [y]), {x: np.zeros(1, np.float32)})
    np.testing.assert_array_equal(out[y], 2)
    custom.unregister_op(opid("Dup"))
    with pytest.raises(popart.popart_exception, match="not supported"):
        infer_session(builder, [y])


def test_replacing_a_builtin_op_and_unregistering_restores_it():
    relu = popart.OperatorIdentifier("ai.onnx", "Relu", 14)
    with pytest.warns(UserWarning, match="already registered"):
        @register_op(relu)
        class MyRelu(Unary):
            def compute(self, ctx, x):
                return np.abs(x)
    builder = popart.Builder(opsets={"ai.onnx": 14, "ai.graphcore": 1})
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    y = builder.aiOnnx.relu([x])
    data = np.array([-1, 2], np.float32)
    np.testing.assert_array_equal(run(infer_session(builder, [y]), {x: data})[y], [1, 2])
    custom.unregister_op(relu)
    np.testing.assert_array_equal(run(infer_session(builder, [y]), {x: data})[y], [0, 2])


def _one_op_builder(name, shape=(2,), dtype="FLOAT", attributes=None):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo(dtype, list(shape)), "x")
    (y,) = builder.customOp(name, 1, DOMAIN, [x], attributes or {})
    return builder, x, y


def test_setup_returning_the_wrong_count_is_an_error():
    @register_op(opid("TwoInfos"), definition=popart.OpDefinition(
        inputs=[("x", ["FLOAT"])], outputs=[("y", ["FLOAT"])]))
    class TwoInfos(Unary):
        def setup(self, in_infos):
            return [in_infos[0], in_infos[0]]

    builder, _, y = _one_op_builder("TwoInfos")
    with pytest.raises(popart.popart_exception, match=r"TwoInfos.*setup\(\) returned 2.*1 output"):
        builder.getTensorShape(y)
    with pytest.raises(popart.popart_exception, match=r"TwoInfos.*setup\(\) returned 2"):
        infer_session(builder, [y])


@pytest.mark.parametrize("bad, match", [
    (lambda x: np.zeros(3, np.float32), r"output 0 is float32\[3\].*declared float32\[2\]"),
    (lambda x: x.astype(np.float64), r"output 0 is float64\[2\].*declared float32\[2\]"),
])
def test_compute_returning_the_wrong_shape_or_dtype_names_the_op(bad, match):
    @register_op(opid("Bad"))
    class Bad(Unary):
        def compute(self, ctx, x):
            return bad(x)

    builder, x, y = _one_op_builder("Bad")
    session = infer_session(builder, [y])
    with pytest.raises(popart.popart_runtime_error, match=r"Bad.*" + match):
        run(session, {x: np.zeros(2, np.float32)})


def test_missing_grad_op_when_training_needs_one():
    @register_op(opid("NoGrad"))
    class NoGrad(Unary):
        def compute(self, ctx, x):
            return x * 2

    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    w = builder.addInitializedInputTensor(np.ones(2, np.float32), "w")
    (y,) = builder.customOp("NoGrad", 1, DOMAIN, [builder.aiOnnx.mul([x, w])])
    loss = builder.aiGraphcore.l1loss([y], 1.0)
    with pytest.raises(popart.popart_exception, match=r"NoGrad.*no grad ops.*grad_ops\(\)"):
        train_session(builder, loss, [loss])


def test_opdefinition_violations_fail_at_session_creation():
    @register_op(opid("Strict"), definition=popart.OpDefinition(
        inputs=[("x", ["FLOAT16", "FLOAT"])], outputs=[("y", ["FLOAT16", "FLOAT"])],
        attributes={"mode": r"fast|slow"}))
    class Strict(Unary):
        def compute(self, ctx, x):
            return x.copy()

    builder, _, y = _one_op_builder("Strict", dtype="INT32", attributes={"mode": "fast"})
    with pytest.raises(popart.popart_exception, match=r"Strict.*input 0 'x' is INT32.*FLOAT16"):
        infer_session(builder, [y])
    builder, _, y = _one_op_builder("Strict", attributes={"mode": "medium"})
    with pytest.raises(popart.popart_exception, match=r"'mode' = 'medium' does not match"):
        infer_session(builder, [y])
    builder, _, y = _one_op_builder("Strict", attributes={"other": 1})
    with pytest.raises(popart.popart_exception, match=r"\['other'\] are not in the op's"):
        infer_session(builder, [y])
    builder, x, y = _one_op_builder("Strict", attributes={"mode": "slow"})
    out = run(infer_session(builder, [y]), {x: np.ones(2, np.float32)})
    np.testing.assert_array_equal(out[y], 1)


def test_registration_errors_are_clear(tmp_path):
    with pytest.raises(popart.popart_exception, match="OperatorIdentifier"):
        register_op(("d", "T", 1))
    with pytest.raises(popart.popart_exception, match="subclass of popart.custom.Op"):
        register_op(opid("NotAnOp"))(object)
    with pytest.raises(popart.popart_exception, match="grad_input_info"):
        @register_grad_op(opid("BadGrad"))
        class BadGrad(GradOp):
            grad_input_info = [(1, 0, GradOpInType.In)]
            grad_out_to_non_grad_in = {0: 0}
    with pytest.raises(popart.popart_exception, match="no file"):
        popart.loadCustomOpModule(tmp_path / "missing.py")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(popart.popart_exception, match="boom"):
        popart.loadCustomOpModule(broken)


def test_supported_operations_definition_reports_a_custom_definition():
    """F81, F88: the OpDefinition given at registration is what the backend reports."""
    definition = popart.OpDefinition(
        inputs=[("input", ["FLOAT"])], outputs=[("output", ["FLOAT"])], attributes={"k": "*"})

    @register_op(opid("Described"), definition=definition)
    class Described(Unary):
        def compute(self, ctx, x):
            return x

    defs = popart.getSupportedOperationsDefinition(True)
    (key,) = [k for k in defs if k.domain == DOMAIN and k.type == "Described"]
    got = defs[key]
    assert [i.name for i in got.inputs] == ["input"] and list(got.attributes) == ["k"]
