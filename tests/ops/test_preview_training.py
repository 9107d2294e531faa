"""ai.onnx.preview.training optimizer ops Adagrad, Adam, Momentum (F78, issue #7), against
numpy written from the ONNX formulas and the ONNX reference implementation (onnxruntime's CPU
build has no kernels for this domain)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from popart_backend.errors import ShapeError, popart_exception
from popart_backend.ops.preview_training import PREVIEW_TRAINING
from tests.helpers import one_op_model, rand, run_popart


def _run(op, inputs, attrs, num_outputs):
    """Our outputs and the ONNX reference's for one op of the preview-training domain."""
    model, feeds = one_op_model(op, inputs, attrs, num_outputs=num_outputs,
                                domain=PREVIEW_TRAINING)
    ours = run_popart(model, feeds)
    theirs = ReferenceEvaluator(model).run(None, feeds)
    return [ours[f"out{i}"] for i in range(num_outputs)], theirs


def _state(n, dtype=np.float32, positive=False, seed=0):
    shapes = [(3,), (2, 4)][:n]
    return [rand(*s, dtype=dtype, low=0.1 if positive else -1.0, high=1.0, seed=seed + i)
            for i, s in enumerate(shapes)]


def _adagrad(r, t, xs, gs, hs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    rate = r / (1 + t * decay_factor)
    out_x, out_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = norm_coefficient * x + g
        h = h + g * g
        out_x.append(x - rate * g / (np.sqrt(h) + epsilon))
        out_h.append(h)
    return out_x + out_h


def _adam(r, t, xs, gs, vs, hs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
          norm_coefficient_post=0.0):
    rate = r * np.sqrt(1 - beta**t) / (1 - alpha**t) if t > 0 else r
    out = [[], [], []]
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = norm_coefficient * x + g
        v = alpha * v + (1 - alpha) * g
        h = beta * h + (1 - beta) * g * g
        out[0].append((1 - norm_coefficient_post) * (x - rate * v / (np.sqrt(h) + epsilon)))
        out[1].append(v)
        out[2].append(h)
    return out[0] + out[1] + out[2]


def _momentum(r, t, xs, gs, vs, alpha, beta, mode, norm_coefficient):
    beta = beta if t > 0 else 1.0
    out_x, out_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = norm_coefficient * x + g
        v = alpha * v + beta * g
        out_x.append(x - r * (g + alpha * v if mode == "nesterov" else v))
        out_v.append(v)
    return out_x + out_v


def _assert_all(ours, expected, rtol=1e-5, atol=1e-6, dtypes=True):
    """``dtypes=False`` for the ONNX reference, whose Adam promotes float32 to float64."""
    assert len(ours) == len(expected)
    for i, (a, b) in enumerate(zip(ours, expected)):
        if dtypes:
            assert a.dtype == np.asarray(b).dtype, f"output {i}: dtype {a.dtype} != {b.dtype}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {i}")


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adagrad_f78(n, t, dtype):
    r, steps = np.array(0.1, dtype), np.array(t, np.int64)
    xs, gs, hs = _state(n, dtype), _state(n, dtype, seed=5), _state(n, dtype, True, seed=9)
    attrs = {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001}
    ours, theirs = _run("Adagrad", [r, steps, *xs, *gs, *hs], attrs, 2 * n)
    expected = [v.astype(dtype) for v in _adagrad(float(r), t, xs, gs, hs, **attrs)]
    _assert_all(ours, expected)
    _assert_all(ours, theirs)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 1, 4])
def test_adam_f78(n, t):
    r, steps = np.array(0.05, np.float32), np.array(t, np.int64)
    xs, gs = _state(n), _state(n, seed=5)
    vs, hs = _state(n, seed=7), _state(n, positive=True, seed=9)
    attrs = {"alpha": 0.95, "beta": 0.85, "epsilon": 1e-2, "norm_coefficient": 0.001,
             "norm_coefficient_post": 0.01}
    ours, theirs = _run("Adam", [r, steps, *xs, *gs, *vs, *hs], attrs, 3 * n)
    expected = [v.astype(np.float32) for v in _adam(float(r), t, xs, gs, vs, hs, **attrs)]
    _assert_all(ours, expected)
    _assert_all(ours, theirs, dtypes=False)


def test_adam_default_attributes():
    inputs = [np.array(0.1, np.float32), np.array(2, np.int64), *_state(1), *_state(1, seed=3),
              *_state(1, seed=4), *_state(1, positive=True, seed=6)]
    ours, theirs = _run("Adam", inputs, {}, 3)
    expected = [v.astype(np.float32) for v in _adam(0.1, 2, *[[v] for v in inputs[2:]])]
    _assert_all(ours, expected)
    _assert_all(ours, theirs, dtypes=False)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 2])
def test_momentum_f78(mode, n, t):
    r, steps = np.array(0.1, np.float32), np.array(t, np.int64)
    xs, gs, vs = _state(n), _state(n, seed=5), _state(n, seed=7)
    attrs = {"alpha": 0.95, "beta": 0.85, "mode": mode, "norm_coefficient": 0.01}
    ours, theirs = _run("Momentum", [r, steps, *xs, *gs, *vs], attrs, 2 * n)
    expected = [v.astype(np.float32) for v in _momentum(float(r), t, xs, gs, vs, **attrs)]
    _assert_all(ours, expected)
    _assert_all(ours, theirs)


def test_errors_name_the_op():
    r, t = np.array(0.1, np.float32), np.array(1, np.int64)
    x, g = rand(3), rand(3)
    model, feeds = one_op_model("Adagrad", [r, t, x, g], num_outputs=2, domain=PREVIEW_TRAINING)
    with pytest.raises(ShapeError, match="Adagrad .*3 lists of n tensors"):
        run_popart(model, feeds)
    model, feeds = one_op_model("Adagrad", [r, t, x, rand(4), rand(3)], num_outputs=2,
                                domain=PREVIEW_TRAINING)
    with pytest.raises(ShapeError, match="Adagrad .*share one shape"):
        run_popart(model, feeds)
    model, feeds = one_op_model("Momentum", [r, t, x, g, rand(3)], num_outputs=2,
                                domain=PREVIEW_TRAINING,
                                attrs={"alpha": 0.9, "beta": 1.0, "mode": "heavy",
                                       "norm_coefficient": 0.0})
    with pytest.raises(popart_exception, match="Momentum .*mode 'heavy'"):
        run_popart(model, feeds)
    model, feeds = one_op_model("Momentum", [r, t, x, g, rand(3)], num_outputs=2,
                                domain=PREVIEW_TRAINING, attrs={"alpha": 0.9})
    with pytest.raises(popart_exception, match="Momentum-1 requires attribute"):
        run_popart(model, feeds)


def test_not_differentiable():
    """Optimizer steps end a backward pass; differentiating through one names the op."""
    from popart_backend.importer.onnx_model import import_model
    from popart_backend.transforms.autodiff import Autodiff

    inputs = [np.array(0.1, np.float32), np.array(1, np.int64), rand(3), rand(3), rand(3)]
    model, _ = one_op_model("Adagrad", inputs, num_outputs=2, domain=PREVIEW_TRAINING,
                            const_inputs=(0, 1, 2, 3, 4))
    ir = import_model(model, constant_weights=False)
    with pytest.raises(popart_exception, match="Adagrad .*has no gradient"):
        Autodiff(None, output_grads={"out0": np.ones(3, np.float32)}).run(ir)
