"""ai.graphcore builder ops (spec §6.3, F17) against references written from their definitions.

Every model is built with ``builder.aiGraphcore.<method>`` and run with popart.InferenceSession,
so the builder method and the op agree on names and attributes; gradients use check_grad.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from tests.helpers import assert_close, check_grad, rand

GC = "ai.graphcore"
_DTYPES = {np.float32: "FLOAT", np.int32: "INT32", np.int64: "INT64", np.bool_: "BOOL"}


def run_builder(build, *arrays, outputs=None, opset=None):
    """``build(builder, gc, *input ids)`` returns output id(s); run once, return numpy outputs.
    ``opset``: the ai.onnx opset to fix (the Builder's default when None)."""
    builder = popart.Builder() if opset is None else popart.Builder(
        opsets={"ai.onnx": opset, "ai.graphcore": 1})
    ids = [builder.addInputTensor(popart.TensorInfo(_DTYPES[a.dtype.type], list(a.shape)))
           for a in arrays]
    result = build(builder, builder.aiGraphcore, *ids)
    result = [result] if isinstance(result, str) else list(result)
    for r in result:
        builder.addOutputTensor(r)
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, result),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip(ids, arrays)), anchors))
    values = [anchors[r] for r in result]
    return values[0] if len(values) == 1 else values


def t(x):
    return torch.from_numpy(np.asarray(x))


# --- elementwise --------------------------------------------------------------------------------

UNARY = {
    "expm1": np.expm1,
    "log1p": np.log1p,
    "swish": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "geluerf": lambda x: 0.5 * x * (1 + torch.erf(t(x / np.sqrt(2))).numpy()),
    "round": lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),
    "detach": lambda x: x,
    "nop": lambda x: x,
    "replicatedallreduce": lambda x: x,
}


@pytest.mark.parametrize("method", sorted(UNARY))
def test_unary(method):
    x = rand(3, 4, low=-0.9, high=2.0)
    x[0, :3] = [0.5, -0.5, 2.5]  # halves round away from zero
    out = run_builder(lambda b, gc, a: getattr(gc, method)([a]), x)
    assert_close(out, UNARY[method](x).astype(np.float32), method, rtol=1e-5, atol=1e-6)


BINARY = {
    "atan2": np.arctan2,
    "fmod": np.fmod,
    "remainder": np.mod,
}


@pytest.mark.parametrize("method", sorted(BINARY))
def test_binary(method):
    a, b = rand(3, 4, low=-3, high=3), rand(4, low=0.5, high=2)
    b[1] = -b[1]
    out = run_builder(lambda bld, gc, x, y: getattr(gc, method)([x, y]), a, b)
    assert_close(out, BINARY[method](a, b).astype(np.float32), method, rtol=1e-5, atol=1e-5)


def test_fmod_remainder_int():
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([3, 3, -3, -3], np.int32)
    assert_close(run_builder(lambda bl, gc, x, y: gc.fmod([x, y]), a, b), np.fmod(a, b))
    assert_close(run_builder(lambda bl, gc, x, y: gc.remainder([x, y]), a, b), np.mod(a, b))


@pytest.mark.parametrize("method,ref", [
    ("bitwiseand", np.bitwise_and), ("bitwiseor", np.bitwise_or),
    ("bitwisexor", np.bitwise_xor),
    ("bitwisexnor", lambda a, b: np.invert(np.bitwise_xor(a, b))),
])
def test_bitwise(method, ref):
    a, b = rand(5, dtype=np.int32, low=-50, high=50), rand(5, dtype=np.int32, low=0, high=50)
    assert_close(run_builder(lambda bl, gc, x, y: getattr(gc, method)([x, y]), a, b), ref(a, b))
    assert_close(run_builder(lambda bl, gc, x: gc.bitwisenot([x]), a), np.invert(a))


def test_scale_and_scaledadd():
    a, b = rand(2, 3), rand(2, 3)
    assert_close(run_builder(lambda bl, gc, x: gc.scale([x], 2.5), a), a * np.float32(2.5))
    out = run_builder(lambda bl, gc, x, y: gc.scaledadd([x, y], scale0=0.5, scale1=-2.0), a, b)
    assert_close(out, 0.5 * a - 2.0 * b)
    s0, s1 = np.array(3.0, np.float32), np.array(0.25, np.float32)
    out = run_builder(lambda bl, gc, x, y, p, q: gc.scaledadd([x, y, p, q]), a, b, s0, s1)
    assert_close(out, 3.0 * a + 0.25 * b)


# --- identities with side effects ----------------------------------------------------------------


def test_printtensor_prints_title_and_values(capfd):
    x = np.array([1.0, 2.0], np.float32)
    out = run_builder(lambda bl, gc, a: gc.printtensor([a], title="here"), x)
    assert_close(out, x)
    assert "here: [1.0, 2.0]" in capfd.readouterr().out


def test_abort():
    x = np.array([1.0], np.float32)

    def build(cond_value):
        def f(bl, gc, a):
            cond = bl.aiOnnx.constant(np.array(cond_value))
            gc.abort([cond])
            return bl.aiOnnx.identity([a])
        return f

    assert_close(run_builder(build(False), x), x)
    with pytest.raises(popart.popart_runtime_error, match="Abort"):
        run_builder(build(True), x)

    def unconditional(bl, gc, a):
        gc.abort([])
        return bl.aiOnnx.identity([a])

    with pytest.raises(popart.popart_runtime_error, match="abort executed"):
        run_builder(unconditional, x)


def test_copyvarupdate():
    var, new = rand(2, 2), rand(2, 2)
    out = run_builder(lambda bl, gc, a, b: gc.copyvarupdate([a, b]), var, new)
    assert_close(out, new)


@pytest.mark.parametrize("init_type", [0, 1])
def test_init(init_type):
    x = rand(2, 3)
    out = run_builder(
        lambda bl, gc, a: bl.aiOnnx.add([gc.init([2, 3], "FLOAT", init_type), a]), x)
    assert_close(out, x)


# --- shape ----------------------------------------------------------------------------------------


def test_reshape_reverse_subsample_depthtospace():
    x = rand(2, 8, 3, 4)
    assert_close(run_builder(lambda bl, gc, a: gc.reshape([a], [4, -1]), x), x.reshape(4, -1))
    assert_close(run_builder(lambda bl, gc, a: gc.reverse([a], [0, 3]), x), x[::-1, :, :, ::-1])
    assert_close(run_builder(lambda bl, gc, a: gc.subsample([a], [1, 3, 2, 3]), x),
                 x[:, ::3, ::2, ::3])
    for mode in ("DCR", "CRD"):
        ref = torch.nn.functional.pixel_shuffle(t(x), 2).numpy() if mode == "CRD" else (
            x.reshape(2, 2, 2, 2, 3, 4).transpose(0, 3, 4, 1, 5, 2).reshape(2, 2, 6, 8))
        assert_close(run_builder(lambda bl, gc, a: gc.depthtospace([a], 2, mode), x), ref)


# --- dynamic slicing -------------------------------------------------------------------------------


def _window(shape, axes, sizes, offset):
    index = [slice(None)] * len(shape)
    for a, s, o in zip(axes, sizes, offset):
        o = min(max(o, 0), shape[a] - s)
        index[a] = slice(o, o + s)
    return tuple(index)


@pytest.mark.parametrize("offset", [[1, 2], [3, 9]])  # the second is clamped to fit
def test_dynamic_ops(offset):
    x, axes, sizes = rand(4, 5, 6), [0, 2], [2, 3]
    off = np.array(offset, np.int32)
    w = _window(x.shape, axes, sizes, offset)
    upd = rand(2, 5, 3)

    out = run_builder(lambda bl, gc, a, o: gc.dynamicslice([a, o], axes, sizes), x, off)
    assert_close(out, x[w])
    ref = x.copy()
    ref[w] = upd
    out = run_builder(lambda bl, gc, a, o, u: gc.dynamicupdate([a, o, u], axes, sizes), x, off, upd)
    assert_close(out, ref)
    ref = x.copy()
    ref[w] += upd
    out = run_builder(lambda bl, gc, a, o, u: gc.dynamicadd([a, o, u], axes, sizes), x, off, upd)
    assert_close(out, ref)
    ref = x.copy()
    ref[w] = 0
    assert_close(run_builder(lambda bl, gc, a, o: gc.dynamiczero([a, o], axes, sizes), x, off), ref)


@pytest.mark.parametrize("zero_unused", [0, 1])
def test_sequenceslice(zero_unused):
    src, dst = rand(6, 3), rand(5, 3)
    n = np.array([2, 1, 4], np.int32)
    so, do = np.array([0, 4, 3], np.int32), np.array([3, 0, 4], np.int32)
    ref = np.zeros_like(dst) if zero_unused else dst.copy()
    for k, s, d in zip(n, so, do):
        k = min(k, 6 - s, 5 - d)
        ref[d:d + k] = src[s:s + k]
    out = run_builder(lambda bl, gc, *ids: gc.sequenceslice(list(ids), zero_unused),
                      src, dst, n, so, do)
    assert_close(out, ref)


# --- reductions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), (None, 1)])
def test_reducemedian(axes, keepdims):
    x = rand(3, 4, 5)
    vals, idx = run_builder(lambda bl, gc, a: gc.reducemedian([a], axes=axes, keepdims=keepdims),
                            x)
    red = list(range(3)) if axes is None else axes
    kept = [a for a in range(3) if a not in red]
    flat = x.transpose(kept + red).reshape([x.shape[a] for a in kept] + [-1])
    lower = np.sort(flat, -1)[..., (flat.shape[-1] - 1) // 2]
    shape = [1 if a in red else d for a, d in enumerate(x.shape)] if keepdims else \
        [x.shape[a] for a in kept]
    assert_close(vals, lower.reshape(shape))
    assert idx.dtype == np.int32
    assert_close(np.take_along_axis(flat, idx.reshape(lower.shape + (1,)).astype(np.int64), -1)
                 .reshape(shape), vals)


@pytest.mark.parametrize("reduction", ["Sum", "Max", "Min", "None"])
def test_scatterreduce(reduction):
    src = rand(4, 6)
    index = np.array([0, 2, 2, 4, 0, 2], np.int32)
    out = run_builder(lambda bl, gc, s, i: gc.scatterreduce([s, i], axis_size=5, axis=1,
                                                            reduction=reduction), src, index)
    ref = np.zeros((4, 5), np.float32)
    for col in range(5):
        hits = src[:, index == col]
        if hits.shape[1]:
            ref[:, col] = {"Sum": hits.sum(1), "Max": hits.max(1), "Min": hits.min(1),
                           "None": hits[:, -1]}[reduction]
    if reduction == "None":  # duplicate targets: any one of the writers may win
        for col in (0, 2):
            assert all(out[r, col] in src[r, index == col] for r in range(4))
        keep = [1, 3, 4]
        assert_close(out[:, keep], ref[:, keep])
    else:
        assert_close(out, ref)


# --- normalisation and losses -----------------------------------------------------------------------


def test_groupnormalization():
    x, scale, bias = rand(2, 6, 3, 2), rand(6), rand(6)
    y, mean, inv = run_builder(lambda bl, gc, a, s, b: gc.groupnormalization([a, s, b], 3),
                               x, scale, bias)
    ref = torch.nn.functional.group_norm(t(x), 3, t(scale), t(bias), 1e-5)
    assert_close(y, ref.numpy(), atol=1e-5)
    groups = x.reshape(2, 3, -1)
    assert_close(mean, groups.mean(-1).reshape(-1), atol=1e-6)
    assert_close(inv, (1 / np.sqrt(groups.var(-1) + 1e-5)).reshape(-1).astype(np.float32),
                 rtol=1e-4)


@pytest.mark.parametrize("reduction", ["Sum", "Mean", "NoReduction"])
def test_ctcloss(reduction):
    torch.manual_seed(0)
    log_probs = torch.randn(12, 3, 5).log_softmax(-1).numpy()
    targets = np.array([[1, 2, 2, 0], [3, 1, 0, 0], [4, 4, 4, 1]], np.int32)
    in_len, tgt_len = np.array([12, 10, 11], np.int32), np.array([3, 2, 4], np.int32)
    loss = run_builder(lambda bl, gc, *ids: gc.ctcloss(list(ids), reduction=reduction),
                       log_probs, targets, in_len, tgt_len)
    ref = torch.nn.functional.ctc_loss(
        t(log_probs), t(targets).long(), t(in_len).long(), t(tgt_len).long(),
        reduction={"Sum": "sum", "Mean": "mean", "NoReduction": "none"}[reduction])
    assert_close(loss, ref.numpy(), rtol=1e-5, atol=1e-5)


def _brute_force_ctc(lp: np.ndarray, blank: int) -> dict[tuple, float]:
    """Probability of every collapsed label sequence, by enumerating all alignments."""
    import itertools

    totals: dict[tuple, float] = {}
    for path in itertools.product(range(lp.shape[1]), repeat=lp.shape[0]):
        collapsed = tuple(c for i, c in enumerate(path)
                          if c != blank and (i == 0 or path[i - 1] != c))
        totals[collapsed] = totals.get(collapsed, 0.0) + np.exp(
            sum(lp[i, c] for i, c in enumerate(path)))
    return totals


def test_ctcbeamsearchdecoder():
    torch.manual_seed(1)
    log_probs = torch.randn(5, 2, 3).log_softmax(-1).numpy()
    lengths = np.array([5, 4], np.int32)
    probs, lens, labels = run_builder(
        lambda bl, gc, a, n: gc.ctcbeamsearchdecoder([a, n], blank=0, beam_width=50, top_paths=2),
        log_probs, lengths)
    for b in range(2):
        totals = _brute_force_ctc(log_probs[: lengths[b], b].astype(np.float64), 0)
        best = sorted(totals.items(), key=lambda kv: -kv[1])[:2]
        for j, (seq, p) in enumerate(best):
            assert lens[b, j] == len(seq)
            assert tuple(labels[b, j, : len(seq)]) == seq
            assert_close(probs[b, j], np.float32(np.log(p)), rtol=1e-4, atol=1e-5)


# --- gradients ------------------------------------------------------------------------------------


def test_elementwise_gradients():
    x = rand(3, 4, low=0.2, high=2.0)
    f = torch.nn.functional
    check_grad("Expm1", [x], domain=GC, ref=torch.expm1)
    check_grad("Log1p", [x], domain=GC, ref=torch.log1p)
    check_grad("Swish", [x], domain=GC, ref=f.silu)
    check_grad("Gelu", [x], domain=GC, ref=lambda a: f.gelu(a, approximate="tanh"))
    check_grad("GeluErf", [x], domain=GC, ref=f.gelu)
    check_grad("Scale", [x], {"scale": 1.5}, domain=GC, ref=lambda a: a * 1.5)
    check_grad("Nop", [x], domain=GC, ref=lambda a: a)
    check_grad("PrintTensor", [x], {"print_gradient": 0}, domain=GC, ref=lambda a: a)
    y, b = rand(3, 4, low=-2, high=2), rand(4, low=0.5, high=1.5)
    check_grad("Atan2", [y, b], domain=GC, ref=torch.atan2)
    check_grad("Fmod", [y, b], domain=GC, ref=torch.fmod)
    check_grad("Remainder", [y, b], domain=GC, ref=torch.remainder)
    check_grad("ScaledAdd", [y, b], {"scale0": 0.5, "scale1": -2.0}, domain=GC,
               ref=lambda p, q: 0.5 * p - 2.0 * q)
    s = np.array(3.0, np.float32)
    check_grad("ScaledAdd", [y, b, s, s], domain=GC, ref=lambda p, q, u, v: u * p + v * q)


def test_detach_stops_the_gradient():
    from popart_backend.importer.onnx_model import import_model
    from popart_backend.transforms.autodiff import Autodiff
    from tests.helpers import one_op_model

    model, _ = one_op_model("Detach", [rand(2, 2)], domain=GC, const_inputs=[0])
    ir = import_model(model, constant_weights=False)
    autodiff = Autodiff(None, output_grads={"out0": np.ones((2, 2), np.float32)})
    autodiff.run(ir)
    assert "in0" not in autodiff.variable_grads


def test_shape_gradients():
    x = rand(2, 3, 4)
    check_grad("Reshape", [x], {"shape": [6, -1]}, domain=GC, ref=lambda a: a.reshape(6, -1))
    check_grad("Reverse", [x], {"dimensions": [0, 2]}, domain=GC, ref=lambda a: a.flip((0, 2)))
    check_grad("Subsample", [x], {"strides": [1, 2, 3]}, domain=GC,
               ref=lambda a: a[:, ::2, ::3])
    check_grad("DepthToSpace", [rand(1, 8, 2, 2)], {"blocksize": 2, "mode": "CRD"}, domain=GC,
               ref=lambda a: torch.nn.functional.pixel_shuffle(a, 2))


def test_dynamic_gradients():
    x, upd = rand(4, 5), rand(2, 5)
    off = np.array([1], np.int32)
    attrs = {"axes": [0], "sizes": [2]}

    def update(a, o, u):
        return torch.cat([a[:1], u, a[3:]])

    check_grad("DynamicSlice", [x, off], attrs, domain=GC, ref=lambda a, o: a[1:3])
    check_grad("DynamicUpdate", [x, off, upd], attrs, domain=GC, ref=update)
    check_grad("DynamicAdd", [x, off, upd], attrs, domain=GC,
               ref=lambda a, o, u: torch.cat([a[:1], a[1:3] + u, a[3:]]))
    check_grad("DynamicZero", [x, off], attrs, domain=GC,
               ref=lambda a, o: torch.cat([a[:1], a[1:3] * 0, a[3:]]))


def test_other_gradients():
    n = np.array([2, 1], np.int32)
    so, do = np.array([0, 3], np.int32), np.array([2, 0], np.int32)

    def seq(src, dst, *_):
        return torch.cat([src[3:4], dst[1:2], src[0:2], dst[4:]])

    check_grad("SequenceSlice", [rand(4, 2), rand(5, 2), n, so, do], domain=GC, ref=seq)
    check_grad("SequenceSlice", [rand(4, 2), rand(5, 2), n, so, do], {"zeroUnused": 1},
               domain=GC, ref=lambda s, d, *_: torch.cat(
                   [s[3:4], d[1:2] * 0, s[0:2], d[4:] * 0]))
    x = rand(3, 5)
    check_grad("ReduceMedian", [x], {"axes": [1], "keepdims": 0}, domain=GC, num_outputs=1,
               ref=lambda a: a.median(1).values)
    index = np.array([0, 2, 2, 1, 0], np.int32)
    for red, torch_red in (("sum", "sum"), ("max", "amax"), ("min", "amin")):
        check_grad("ScatterReduce", [x, index], {"axis_size": 3, "axis": 1, "reduction": red},
                   domain=GC, ref=lambda a, i: torch.zeros(3, 3, dtype=a.dtype).scatter_reduce(
                       1, i.long().expand(3, 5), a, torch_red, include_self=False))
    check_grad("GroupNormalization", [rand(2, 4, 3), rand(4), rand(4)], {"num_groups": 2},
               domain=GC, num_outputs=1,
               ref=lambda a, s, b: torch.nn.functional.group_norm(a, 2, s, b, 1e-5))


def test_ctc_gradient():
    torch.manual_seed(2)
    log_probs = torch.randn(8, 2, 4).log_softmax(-1).numpy()
    targets = np.array([[1, 3, 0], [2, 2, 1]], np.int32)
    in_len, tgt_len = np.array([8, 7], np.int32), np.array([2, 3], np.int32)
    for reduction, name in ((0, "sum"), (1, "mean"), (2, "none")):
        check_grad("Ctc", [log_probs, targets, in_len, tgt_len], {"reduction": reduction},
                   domain=GC, num_outputs=1, ref=lambda lp, tg, il, tl: (
                       torch.nn.functional.ctc_loss(lp, tg.long(), il.long(), tl.long(),
                                                    reduction=name)), rtol=1e-4, atol=1e-5)


# --- errors ---------------------------------------------------------------------------------------


def test_errors_name_the_op():
    with pytest.raises(popart.popart_exception, match="DynamicSlice.*offset"):
        run_builder(lambda bl, gc, a, o: gc.dynamicslice([a, o], [0], [2]),
                    rand(4, 3), np.array([0, 1], np.int32))
    with pytest.raises(popart.popart_exception, match="Reshape.*cannot reshape"):
        run_builder(lambda bl, gc, a: gc.reshape([a], [5, -1]), rand(4, 3))
    with pytest.raises(popart.popart_exception, match="BitwiseAnd.*integer"):
        run_builder(lambda bl, gc, a, b: gc.bitwiseand([a, b]), rand(2), rand(2))
