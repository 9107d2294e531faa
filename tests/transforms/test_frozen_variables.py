"""Variables the model marks frozen (``__frozen_variable:<id>`` model metadata, read by the
importer into ``Ir.frozen_variables``): autodiff grows no gradient for them, so they get no
update, optimizer state or accumulator; an anchored gradient of one is computed but not
applied. Without the mark (plain PopART) a weight with ``lr = 0`` keeps its gradient and state.
Reference: torch with ``requires_grad=False`` on the frozen tensor."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch

import popart_backend as popart

B, IN, OUT = 4, 3, 2
LR, MOMENTUM = 0.1, 0.9
W0 = np.random.default_rng(0).standard_normal((IN, OUT)).astype(np.float32)
B0 = np.random.default_rng(1).standard_normal((OUT,)).astype(np.float32)
STATE_PREFIXES = ("Gradient___", "Accl___", "Accl1___", "Accl2___", "Step___", "Accum___")


def _x(step: int) -> np.ndarray:
    return np.random.default_rng(10 + step).standard_normal((B, IN)).astype(np.float32)


def _session(frozen=(), anchored=(), optimizer=None, mark_value="1"):
    """y = x @ w + b; loss = Σ|y| (l1loss, Sum); SGD with momentum unless ``optimizer``."""
    builder = popart.Builder()
    w = builder.addInitializedInputTensor(W0, "w")
    b = builder.addInitializedInputTensor(B0, "b")
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [B, IN]), "x")
    y = builder.aiOnnx.add([builder.aiOnnx.matmul([x, w]), b])
    loss = builder.aiGraphcore.l1loss([y], 1.0, reduction=popart.ReductionType.Sum)
    proto = onnx.load_from_string(builder.getModelProto())
    ids = {"w": w, "b": b}
    for name in frozen:
        proto.metadata_props.add(key=f"__frozen_variable:{ids.get(name, name)}",
                                 value=mark_value)
    anchors = {loss: popart.AnchorReturnType("All")}
    anchors.update({f"Gradient___{ids[n]}": popart.AnchorReturnType("All") for n in anchored})
    if optimizer is None:
        optimizer = popart.SGD({"defaultLearningRate": (LR, True),
                                "defaultMomentum": (MOMENTUM, True)})
    session = popart.TrainingSession(
        fnModel=proto.SerializeToString(), dataFlow=popart.DataFlow(1, anchors), loss=loss,
        optimizer=optimizer, deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    return session, ids, x


def _run(session, x_id, steps: int) -> list[dict[str, np.ndarray]]:
    outputs = []
    for step in range(steps):
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({x_id: _x(step)}, anchors))
        outputs.append({k: np.array(v) for k, v in anchors.items()})
    return outputs


def _read(session, names) -> dict[str, np.ndarray]:
    got = {k: np.zeros(session.getInfo(k).shape(), np.float32) for k in names}
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(got))
    return got


def _torch(steps: int, frozen_b: bool):
    """Eager SGD with momentum; returns (w, b, the gradient of b at each step)."""
    w = torch.tensor(W0, requires_grad=True)
    b = torch.tensor(B0, requires_grad=True)
    opt = torch.optim.SGD([w] if frozen_b else [w, b], lr=LR, momentum=MOMENTUM)
    grads_b = []
    for step in range(steps):
        opt.zero_grad()
        b.grad = None
        (torch.tensor(_x(step)) @ w + b).abs().sum().backward()
        grads_b.append(b.grad.numpy().copy())
        opt.step()
    return w.detach().numpy(), b.detach().numpy(), grads_b


def _ids(session, prefix_of: str) -> list[str]:
    return sorted(t for t in session.getIr().main.tensors
                  if t.startswith(STATE_PREFIXES) and t.endswith(prefix_of))


def _updates(session) -> int:
    return sum(n for op_type, n in Counter(
        op.op_type for op in session.getIr().main.ops.values()).items()
        if op_type.endswith("Update"))


def test_frozen_variable_trains_like_eager_without_gradient_update_or_state():
    session, ids, x = _session(frozen=["b"])
    _run(session, x, 3)
    got = _read(session, [ids["w"], ids["b"]])
    w, _, _ = _torch(3, frozen_b=True)
    np.testing.assert_allclose(got[ids["w"]], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[ids["b"]], B0)
    assert session.getIr().frozen_variables == frozenset({ids["b"]})
    assert _ids(session, ids["b"]) == []  # no gradient, momentum or accumulator
    assert _ids(session, ids["w"])  # the trained weight keeps them
    assert _updates(session) == 1  # w's only
    bias_grads = Counter(op.op_type for op in session.getIr().main.ops.values())
    assert bias_grads["LinearBiasBiasGrad"] == 0  # b's gradient op is not grown


def test_anchored_gradient_of_a_frozen_variable_is_computed_not_applied():
    """Anchoring Gradient___<frozen> computes that gradient (as for an activation), but the
    variable stays untrained: no update and no optimizer state."""
    session, ids, x = _session(frozen=["b"], anchored=["b"])
    outs = _run(session, x, 2)
    _, _, grads_b = _torch(2, frozen_b=True)
    for step, out in enumerate(outs):
        np.testing.assert_allclose(out[f"Gradient___{ids['b']}"], grads_b[step], rtol=1e-5,
                                   atol=1e-6)
    np.testing.assert_array_equal(_read(session, [ids["b"]])[ids["b"]], B0)
    assert _ids(session, ids["b"]) == [f"Gradient___{ids['b']}"]
    assert _updates(session) == 1


def test_frozen_variable_is_still_written_from_the_host():
    session, ids, x = _session(frozen=["b"])
    new_b = (B0 + 2.0).astype(np.float32)
    session.writeWeights(popart.PyWeightsIO({ids["b"]: new_b}))
    session.weightsFromHost()
    _run(session, x, 1)
    np.testing.assert_array_equal(_read(session, [ids["b"]])[ids["b"]], new_b)


def test_plain_popart_zero_learning_rate_keeps_gradient_and_state():
    """Without the mark, insertSpecific(lr=0) is PopART's: the weight keeps its gradient,
    momentum and (no-op) update; numbers equal a frozen b's."""
    optimizer = popart.SGD({"defaultLearningRate": (LR, True),
                            "defaultMomentum": (MOMENTUM, True)})
    optimizer.insertSpecific("b", {"learningRate": (0.0, True)})
    session, ids, x = _session(optimizer=optimizer)
    _run(session, x, 2)
    got = _read(session, [ids["w"], ids["b"]])
    w, _, _ = _torch(2, frozen_b=True)
    np.testing.assert_allclose(got[ids["w"]], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[ids["b"]], B0)
    assert _ids(session, ids["b"]) == [f"Accl___{ids['b']}", f"Gradient___{ids['b']}"]
    assert session.getIr().frozen_variables == frozenset()
    assert _updates(session) == 2


@pytest.mark.parametrize("name, value, match", [
    ("nope", "1", "no tensor 'nope'"),
    ("b", "yes", "needs the value"),
])
def test_bad_frozen_mark_is_a_model_error(name, value, match):
    with pytest.raises(popart.popart_exception, match=match):
        _session(frozen=[name], mark_value=value)
