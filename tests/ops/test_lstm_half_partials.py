"""SessionOptions.lstmOptions["partialsType"] = "half": the float16 LSTMs (ai.onnx LSTM and
ai.graphcore lstm) compute their cell products X·Wᵀ and H·Rᵀ with float16 running sums, as
poplibs' LSTM does with half partials. References: the LSTM recurrence written out here, its
products a numpy float16 running sum (each product and addition rounded, as the MatMul
half-partials test builds it) or, for float partials, float32 products rounded once."""

from __future__ import annotations

import logging

import numpy as np
import torch

import popart_backend as popart
from popart_backend.transforms import numerics_options
from tests.helpers import one_op_model

S, N, I, H = 3, 2, 48, 3


def _half_sum_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for k in range(a.shape[1]):
        acc = acc + a[:, k:k + 1] * b[k:k + 1, :]
    return acc


def _float_sum_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)


def _reference(x, gates_x, gates_h, biases, mm):
    """The LSTM recurrence (zero initial state) with the product ``mm``. ``gates_x[g]`` [I, H]
    and ``gates_h[g]`` [H, H] multiply X_t and H_{t-1} for gate g in (i, f, c, o);
    ``biases[g]`` [H]. The gate arithmetic runs in torch float16, as in the kernels.
    Returns (Y [S, N, H], final C)."""
    h = np.zeros((x.shape[1], gates_h[0].shape[0]), x.dtype)
    c = torch.zeros(h.shape, dtype=torch.float16)
    ys = []
    for t in range(x.shape[0]):
        a = [torch.from_numpy((mm(x[t], gates_x[g]) + biases[g]) + mm(h, gates_h[g]))
             for g in range(4)]
        i, f, o = torch.sigmoid(a[0]), torch.sigmoid(a[1]), torch.sigmoid(a[3])
        c = f * c + i * torch.tanh(a[2])
        h = (o * torch.tanh(c)).numpy()
        ys.append(h)
    return np.stack(ys), c.numpy()


def _operands(dtype=np.float16, seed=0):
    """X [S, N, I], ONNX W [1, 4H, I], R [1, 4H, H], B [1, 8H] (gates i, o, f, c). Large
    products over I = 48 make float16 sums lose digits that float32 sums keep."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((S, N, I)) * 2).astype(dtype)
    w = (rng.standard_normal((1, 4 * H, I)) * 0.5).astype(dtype)
    r = (rng.standard_normal((1, 4 * H, H)) * 0.5).astype(dtype)
    b = (rng.standard_normal((1, 8 * H)) * 0.1).astype(dtype)
    return x, w, r, b


def _onnx_reference(x, w, r, b, mm):
    # ONNX gate order i, o, f, c; the reference takes i, f, c, o. The R half of B is added
    # after the recurrent product, as the ONNX definition writes it: zero here keeps one sum.
    order = (0, 2, 3, 1)
    gx = [w[0, g * H:(g + 1) * H].T for g in order]
    gh = [r[0, g * H:(g + 1) * H].T for g in order]
    bias = [b[0, g * H:(g + 1) * H] for g in order]
    return _reference(x, gx, gh, bias, mm)


def _run_onnx_lstm(x, w, r, b, options, training=False):
    model, feeds = one_op_model("LSTM", [x, w, r, b], {"hidden_size": H}, opset=14,
                                num_outputs=3)
    session = popart.InferenceSession(model.SerializeToString(),
                                      popart.DataFlow(1, ["out0", "out2"]),
                                      popart.DeviceManager().createCpuDevice(),
                                      userOptions=options)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return anchors["out0"][:, 0], anchors["out2"][0], session


def _half_options():
    options = popart.SessionOptions()
    options.lstmOptions = {"partialsType": "half"}
    return options


def test_onnx_lstm_half_partials_accumulate_in_float16():
    x, w, r, b = _operands()
    b[0, 4 * H:] = 0  # R's bias: see _onnx_reference
    y_half, c_half, session = _run_onnx_lstm(x, w, r, b, _half_options())
    want_y, want_c = _onnx_reference(x, w, r, b, _half_sum_matmul)
    np.testing.assert_array_equal(y_half, want_y)
    np.testing.assert_array_equal(c_half, want_c)
    (lstm,) = [op for op in session._ir.main.ops.values() if op.op_type == "LSTM"]
    assert lstm.settings.half_partials

    y_float, c_float, _ = _run_onnx_lstm(x, w, r, b, popart.SessionOptions())
    want_y, want_c = _onnx_reference(x, w, r, b, _float_sum_matmul)
    np.testing.assert_allclose(y_float.astype(np.float32), want_y.astype(np.float32),
                               rtol=2e-3, atol=1e-3)
    np.testing.assert_allclose(c_float.astype(np.float32), want_c.astype(np.float32),
                               rtol=2e-3, atol=1e-3)
    assert not np.array_equal(y_half, y_float)  # the float16 sums are visible


def test_graphcore_lstm_half_partials_accumulate_in_float16():
    x = _operands(seed=1)[0]
    # Poplar layout: weights [4, I + H, H], gates (f, i, c, o); bias [4, H].
    rng = np.random.default_rng(2)
    weights = (rng.standard_normal((4, I + H, H)) * 0.5).astype(np.float16)
    bias = (rng.standard_normal((4, H)) * 0.1).astype(np.float16)

    def run(options):
        builder = popart.Builder()
        ix = builder.addInputTensor(popart.TensorInfo("FLOAT16", list(x.shape)), "x")
        iw = builder.addInputTensor(popart.TensorInfo("FLOAT16", list(weights.shape)), "w")
        ib = builder.addInputTensor(popart.TensorInfo("FLOAT16", list(bias.shape)), "b")
        out, cell = builder.aiGraphcore.lstm([ix, iw, ib], outputFullSequence=1)
        session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [out, cell]),
                                          popart.DeviceManager().createCpuDevice(),
                                          userOptions=options)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({ix: x, iw: weights, ib: bias}, anchors))
        return anchors[out], anchors[cell]

    order = (1, 0, 2, 3)  # the reference's i, f, c, o from Poplar's f, i, c, o
    gx = [weights[g, :I] for g in order]
    gh = [weights[g, I:] for g in order]
    gb = [bias[g] for g in order]
    y_half, c_half = run(_half_options())
    want_y, want_c = _reference(x, gx, gh, gb, _half_sum_matmul)
    np.testing.assert_array_equal(y_half, want_y)
    np.testing.assert_array_equal(c_half, want_c)
    y_float, _ = run(popart.SessionOptions())
    want_y, _ = _reference(x, gx, gh, gb, _float_sum_matmul)
    np.testing.assert_allclose(y_float.astype(np.float32), want_y.astype(np.float32),
                               rtol=2e-3, atol=1e-3)
    assert not np.array_equal(y_half, y_float)


def _train_grads(x, w, r, b, options):
    """One training step of loss = sum(Y) (a float16 LSTM, weights W, R, B): the gradients of
    X's weights and the IR's LSTM ops."""
    builder = popart.Builder()
    ix = builder.addInputTensor(popart.TensorInfo("FLOAT16", list(x.shape)), "x")
    ids = [builder.addInitializedInputTensor(v, name) for v, name in ((w, "W"), (r, "R"),
                                                                      (b, "B"))]
    y, _, _ = builder.aiOnnx.lstm([ix, *ids], 3, hidden_size=H)
    loss = builder.aiGraphcore.identityloss([builder.aiOnnx.reducesum([y], keepdims=0)],
                                            reduction=popart.ReductionType.Sum)
    grads = [popart.reservedGradientPrefix() + i for i in ids]
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(1, grads), loss,
                                     popart.ConstSGD(0.0),
                                     popart.DeviceManager().createCpuDevice(),
                                     userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({ix: x}, anchors))
    lstm_ops = [op for op in session._ir.main.ops.values() if "LSTM" in op.op_type]
    return [anchors[g] for g in grads], lstm_ops


def test_lstm_gradient_keeps_the_half_partials():
    """The LSTMGrad inherits the mark: its products (and its re-run of the forward) sum in
    float16. Its gradients stay close to float64 autograd of the recurrence and differ from
    the float-partials gradients."""
    x, w, r, b = _operands(seed=3)
    half, ops = _train_grads(x, w, r, b, _half_options())
    assert {op.op_type for op in ops} == {"LSTM", "LSTMGrad"}
    assert all(op.settings.half_partials for op in ops)
    full, ops = _train_grads(x, w, r, b, popart.SessionOptions())
    assert not any(op.settings.half_partials for op in ops)

    lstm = torch.nn.LSTM(I, H).double()
    order = (0, 2, 3, 1)  # torch rows i, f, g, o from ONNX's i, o, f, c
    params = {
        "weight_ih_l0": torch.tensor(np.concatenate([w[0, g * H:(g + 1) * H] for g in order]),
                                     dtype=torch.float64, requires_grad=True),
        "weight_hh_l0": torch.tensor(np.concatenate([r[0, g * H:(g + 1) * H] for g in order]),
                                     dtype=torch.float64, requires_grad=True),
        "bias_ih_l0": torch.tensor(np.concatenate([b[0, g * H:(g + 1) * H] for g in order]),
                                   dtype=torch.float64, requires_grad=True),
        "bias_hh_l0": torch.tensor(np.concatenate([b[0, 4 * H + g * H:4 * H + (g + 1) * H]
                                                   for g in order]),
                                   dtype=torch.float64, requires_grad=True),
    }
    y, _ = torch.func.functional_call(lstm, params, (torch.tensor(x, dtype=torch.float64),))
    y.sum().backward()
    want_w = params["weight_ih_l0"].grad.numpy()
    onnx_rows = (0, 3, 1, 2)  # back to ONNX's i, o, f, c from torch's i, f, g, o
    want_w = np.concatenate([want_w[g * H:(g + 1) * H] for g in onnx_rows])[None]
    scale = np.abs(want_w).max()
    for name, got in (("half", half[0]), ("float", full[0])):
        np.testing.assert_allclose(got.astype(np.float64), want_w, rtol=0,
                                   atol=2e-2 * scale, err_msg=name)
    assert not np.array_equal(half[0], full[0])
    assert not np.array_equal(half[1], full[1])


def test_float32_lstm_unchanged_and_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(numerics_options, "_FLOAT32_LSTM_LOGGED", [])
    x, w, r, b = _operands(np.float32, seed=4)
    with caplog.at_level(logging.WARNING, logger="popart:transform"):
        y_half, c_half, session = _run_onnx_lstm(x, w, r, b, _half_options())
        _run_onnx_lstm(x, w, r, b, _half_options())
    y_float, c_float, _ = _run_onnx_lstm(x, w, r, b, popart.SessionOptions())
    np.testing.assert_array_equal(y_half, y_float)
    np.testing.assert_array_equal(c_half, c_float)
    (lstm,) = [op for op in session._ir.main.ops.values() if op.op_type == "LSTM"]
    assert not lstm.settings.half_partials
    logged = [rec for rec in caplog.records if "lstmOptions" in rec.getMessage()]
    assert len(logged) == 1 and "no effect" in logged[0].getMessage()


def test_gru_is_not_an_lstm(monkeypatch, caplog):
    """lstmOptions does not reach a GRU: its float16 products keep float32 partials (logged
    once)."""
    monkeypatch.setattr(numerics_options, "_OTHER_RECURRENT_LOGGED", set())
    caplog.set_level(logging.WARNING, logger="popart:transform")
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((S, N, I)) * 2).astype(np.float16)
    w = (rng.standard_normal((1, 3 * H, I)) * 0.5).astype(np.float16)
    r = (rng.standard_normal((1, 3 * H, H)) * 0.5).astype(np.float16)
    results = []
    for options in (_half_options(), popart.SessionOptions()):
        model, feeds = one_op_model("GRU", [x, w, r], {"hidden_size": H}, opset=14,
                                    num_outputs=2)
        session = popart.InferenceSession(model.SerializeToString(),
                                          popart.DataFlow(1, ["out0"]),
                                          popart.DeviceManager().createCpuDevice(),
                                          userOptions=options)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO(feeds, anchors))
        results.append(anchors["out0"])
    np.testing.assert_array_equal(results[0], results[1])
    logged = [r for r in caplog.records if "no effect on a GRU" in r.getMessage()]
    assert len(logged) == 1 and "lstmOptions" in logged[0].getMessage()
    assert sum("the model has no LSTM" in r.getMessage() for r in caplog.records) == 1


def _row_reference(x, w, r, b, lens, h0, c0, p, mm):
    """ONNX LSTM (gates i, o, f, c; peepholes i, o, f), one batch row and direction at a time
    so sequence lengths are plain loop bounds: the forward direction runs t = 0..len-1, the
    reverse one t = len-1..0, Y is zero past a row's length and Y_h / Y_c are the last step
    run. Kernel order of the float16 sums: ((X_t·Wᵀ + Wb) + H·Rᵀ) + Rb, then + P∘C.
    Returns Y [S, D, N, H], Y_h [D, N, H], Y_c [D, N, H]."""
    seq, batch = x.shape[:2]
    dirs, hidden = w.shape[0], r.shape[2]
    y = np.zeros((seq, dirs, batch, hidden), np.float16)
    yh = np.zeros((dirs, batch, hidden), np.float16)
    yc = np.zeros_like(yh)
    t16 = torch.from_numpy
    for k in range(dirs):
        wb, rb = t16(b[k, :4 * hidden]), t16(b[k, 4 * hidden:])
        pi, po, pf = (t16(p[k, j * hidden:(j + 1) * hidden]) for j in range(3))
        for n in range(batch):
            h, c = h0[k, n:n + 1], t16(c0[k, n:n + 1])
            steps = range(lens[n]) if k == 0 else range(lens[n] - 1, -1, -1)
            for t in steps:
                a = (t16(mm(x[t, n:n + 1], w[k].T)) + wb) + t16(mm(h, r[k].T)) + rb
                ai, ao, af, ac = a.split(hidden, dim=1)
                i = torch.sigmoid(ai + pi * c)
                f = torch.sigmoid(af + pf * c)
                c = f * c + i * torch.tanh(ac)
                o = torch.sigmoid(ao + po * c)
                h = (o * torch.tanh(c)).numpy()
                y[t, k, n] = h[0]
            yh[k, n], yc[k, n] = h[0], c.numpy()[0]
    return y, yh, yc


def test_half_partials_with_lengths_initial_states_peepholes_both_directions():
    """Every product of a bidirectional LSTM with sequence lengths, initial H and C and
    peepholes sums in float16 (both directions, from the given initial state); the float
    partials run differs."""
    rng = np.random.default_rng(8)
    seq, batch = 4, 3
    x = (rng.standard_normal((seq, batch, I)) * 2).astype(np.float16)
    w = (rng.standard_normal((2, 4 * H, I)) * 0.5).astype(np.float16)
    r = (rng.standard_normal((2, 4 * H, H)) * 0.5).astype(np.float16)
    b = (rng.standard_normal((2, 8 * H)) * 0.1).astype(np.float16)
    lens = np.array([4, 2, 3], np.int32)
    h0 = rng.standard_normal((2, batch, H)).astype(np.float16)
    c0 = rng.standard_normal((2, batch, H)).astype(np.float16)
    p = (rng.standard_normal((2, 3 * H)) * 0.5).astype(np.float16)

    def run(options):
        model, feeds = one_op_model("LSTM", [x, w, r, b, lens, h0, c0, p],
                                    {"hidden_size": H, "direction": "bidirectional"},
                                    opset=14, num_outputs=3)
        session = popart.InferenceSession(model.SerializeToString(),
                                          popart.DataFlow(1, ["out0", "out1", "out2"]),
                                          popart.DeviceManager().createCpuDevice(),
                                          userOptions=options)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO(feeds, anchors))
        return [anchors[f"out{i}"] for i in range(3)]

    half = run(_half_options())
    want = _row_reference(x, w, r, b, lens, h0, c0, p, _half_sum_matmul)
    for name, got, expected in zip(("Y", "Y_h", "Y_c"), half, want):
        np.testing.assert_array_equal(got, expected, err_msg=name)
    full = run(popart.SessionOptions())
    want_full = _row_reference(x, w, r, b, lens, h0, c0, p, _float_sum_matmul)
    for name, got, expected in zip(("Y", "Y_h", "Y_c"), full, want_full):
        np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32),
                                   rtol=2e-3, atol=2e-3, err_msg=name)
    for k in range(2):  # each direction shows the float16 sums
        assert not np.array_equal(half[0][:, k], full[0][:, k])
