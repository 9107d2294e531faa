"""The ai.graphcore builder methods lstm, multiconv, packedDataBlock and shapeddropout (spec §6.3,
F17, F23, F78), each against a reference written from the op's definition, plus a check that
every public method of ``builder.aiGraphcore`` is called by some test under tests/.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import popart_backend as popart
from tests.helpers import assert_close, check_grad, rand
from tests.ops.test_graphcore import run_builder as graphcore_run_builder

GC = "ai.graphcore"


def _session(builder, ids, arrays, result, training=False, loss=None, seed=None):
    device = popart.DeviceManager().createCpuDevice()
    flow = popart.DataFlow(1, result)
    proto = builder.getModelProto()
    if training:
        session = popart.TrainingSession(proto, flow, loss, popart.ConstSGD(0.0), device)
    else:
        session = popart.InferenceSession(proto, flow, device)
    session.prepareDevice()
    if seed is not None:
        session.setRandomSeed(seed)
    if training:
        session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(dict(zip(ids, arrays)), anchors))
    return [anchors[r] for r in result]


def run_builder(build, *arrays):
    """test_graphcore's runner at ai.onnx opset 11."""
    return graphcore_run_builder(build, *arrays, opset=11)


# --- LSTM ----------------------------------------------------------------------------------------

# Poplar's gate order (forget, input, candidate, output) -> torch's rows (input, forget, cell,
# output): torch gate k is Poplar gate _TORCH_FROM_POPLAR[k].
_TORCH_FROM_POPLAR = [1, 0, 2, 3]


def _torch_lstm(x, w, b, state=None, lens=None):
    """torch.nn.LSTM with the ai.graphcore weights: (output sequence, final h, final c).
    The parameters are bound functionally, so autograd reaches x, w, b and state; ``lens``
    runs it on a packed sequence (zeros past each row's length, states at its last step)."""
    x, w, b = (torch.as_tensor(v) for v in (x, w, b))
    inp = x.shape[2]
    hidden = w.shape[2]
    lstm = torch.nn.LSTM(inp, hidden).to(x.dtype)
    gates = w[_TORCH_FROM_POPLAR]  # [4, I + H, H]
    params = {
        "weight_ih_l0": gates[:, :inp, :].transpose(1, 2).reshape(4 * hidden, inp),
        "weight_hh_l0": gates[:, inp:, :].transpose(1, 2).reshape(4 * hidden, hidden),
        "bias_ih_l0": b[_TORCH_FROM_POPLAR].reshape(-1),
        "bias_hh_l0": torch.zeros(4 * hidden, dtype=x.dtype),
    }
    init = None
    if state is not None:
        state = torch.as_tensor(state)
        init = (state[0:1], state[1:2])
    if lens is not None:
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            x, torch.as_tensor(lens, dtype=torch.int64), enforce_sorted=False)
        y, (h, c) = torch.func.functional_call(lstm, params, (packed, init))
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=x.shape[0])
        return y, h[0], c[0]
    y, (h, c) = torch.func.functional_call(lstm, params, (x, init))
    return y, h[0], c[0]


def _lstm_operands(seq=4, batch=3, inp=5, hidden=2, seed=0):
    return (rand(seq, batch, inp, seed=seed), rand(4, inp + hidden, hidden, seed=seed + 1),
            rand(4, hidden, seed=seed + 2), rand(2, batch, hidden, seed=seed + 3))


@pytest.mark.parametrize("full,with_state", [(1, False), (1, True), (0, True), (0, False)])
def test_lstm_matches_torch(full, with_state):
    """ai.graphcore LSTM == torch.nn.LSTM with the weights permuted from Poplar's layout."""
    x, w, b, state = _lstm_operands()
    args = (x, w, b, state) if with_state else (x, w, b)
    out, cell = run_builder(
        lambda bld, gc, *ids: gc.lstm(list(ids), outputFullSequence=full), *args)
    with torch.no_grad():
        y, h, c = _torch_lstm(x, w, b, state if with_state else None)
    assert_close(out, (y if full else h).numpy(), "lstm output", rtol=1e-5, atol=1e-6)
    assert_close(cell, c.numpy(), "lstm cell state", rtol=1e-5, atol=1e-6)


def test_lstm_sequence_lengths():
    """Rows past their length keep their state (final = state at the last valid step) and give
    zeros in the full output."""
    x, w, b, state = _lstm_operands(seq=5, batch=3)
    lens = np.array([5, 2, 3], np.int32)
    out, cell = run_builder(lambda bld, gc, *ids: gc.lstm(list(ids)), x, w, b, state, lens)
    for row, n in enumerate(lens):
        with torch.no_grad():
            y, _, c = _torch_lstm(x[:n, row:row + 1], w, b, state[:, row:row + 1])
        assert_close(out[:n, row], y[:, 0].numpy(), f"row {row}", rtol=1e-5, atol=1e-6)
        assert not out[n:, row].any()
        assert_close(cell[row], c[0].numpy(), f"cell row {row}", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("full", [1, 0])
def test_lstm_grad(full):
    """Back-propagation through time == torch.autograd of the same recurrence."""
    x, w, b, state = _lstm_operands(seq=3, batch=2, inp=3, hidden=2)

    def ref(x, w, b, state):
        y, h, c = _torch_lstm(x, w, b, state)
        return [y if full else h, c]

    check_grad("LSTM", [x, w, b, state], {"outputFullSequence": full}, domain=GC,
               num_outputs=2, ref=ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("full", [1, 0])
def test_lstm_grad_with_sequence_lengths(full):
    x, w, b, state = _lstm_operands(seq=4, batch=3, inp=2, hidden=2, seed=5)
    lens = np.array([4, 1, 3], np.int32)

    def ref(x, w, b, state, lens):
        y, h, c = _torch_lstm(x, w, b, state, lens.numpy())
        return [y if full else h, c]

    check_grad("LSTM", [x, w, b, state, lens], {"outputFullSequence": full}, domain=GC,
               num_outputs=2, ref=ref, rtol=1e-4, atol=1e-5)


def test_lstm_rejects_bad_weights():
    x, w, b, _ = _lstm_operands()
    with pytest.raises(popart.popart_exception, match=r"LSTM .*weights"):
        run_builder(lambda bld, gc, *ids: gc.lstm(list(ids)), x, w[:, :-1], b)


# --- MultiConv -----------------------------------------------------------------------------------


def _conv_operands(seed=0):
    """Two 2-D convolutions of different shapes; the second without bias."""
    return [
        (rand(2, 3, 7, 6, seed=seed), rand(4, 3, 3, 2, seed=seed + 1), rand(4, seed=seed + 2)),
        (rand(1, 2, 5, 5, seed=seed + 3), rand(3, 2, 2, 2, seed=seed + 4), None),
    ]


def _build_multiconv(convs, **options):
    def build(bld, gc, *ids):
        it = iter(ids)
        args = [[next(it), next(it)] + ([next(it)] if b is not None else []) for _, _, b in convs]
        return gc.multiconv(args, **options)

    arrays = [a for conv in convs for a in conv if a is not None]
    return build, arrays


@pytest.mark.parametrize("options,torch_kwargs", [
    ({}, [{}, {}]),
    ({"strides": [[2, 1], [1, 2]], "pads": [[1, 0, 1, 2], []], "dilations": [[], [2, 1]]},
     [{"stride": (2, 1), "padding": "pads", "pads": (0, 2, 1, 1)},
      {"stride": (1, 2), "dilation": (2, 1)}]),
])
def test_multiconv_matches_conv2d(options, torch_kwargs):
    """Each output of MultiConv == torch.nn.functional.conv2d of its own operands, with and
    without bias, per-conv strides, pads (begins then ends) and dilations."""
    convs = _conv_operands()
    build, arrays = _build_multiconv(convs, **options)
    outs = run_builder(build, *arrays)
    assert len(outs) == len(convs)
    for (x, w, b), kwargs, out in zip(convs, torch_kwargs, outs):
        kwargs = dict(kwargs)
        xt = torch.from_numpy(x)
        if kwargs.pop("padding", None) == "pads":
            xt = torch.nn.functional.pad(xt, kwargs.pop("pads"))
        expected = torch.nn.functional.conv2d(
            xt, torch.from_numpy(w), None if b is None else torch.from_numpy(b), **kwargs)
        assert_close(out, expected.numpy(), "multiconv", rtol=1e-5, atol=1e-5)


def _dilate_pad_reference(x, w, b, in_dilations, out_pads):
    """Input dilation (zeros between elements) then conv2d then zero output padding."""
    n, c, h, wd = x.shape
    dh, dw = in_dilations
    xd = x.new_zeros((n, c, (h - 1) * dh + 1, (wd - 1) * dw + 1))
    xd[:, :, ::dh, ::dw] = x
    y = torch.nn.functional.conv2d(xd, w, b)
    top, left, bottom, right = out_pads
    return torch.nn.functional.pad(y, (left, right, top, bottom))


def test_multiconv_in_dilations_and_out_pads():
    convs = _conv_operands(seed=10)
    options = {"inDilations": [[2, 3], []], "outPads": [[1, 0, 0, 2], [0, 1, 1, 0]]}
    build, arrays = _build_multiconv(convs, **options)
    outs = run_builder(build, *arrays)
    for (x, w, b), dil, pads, out in zip(convs, [(2, 3), (1, 1)], options["outPads"], outs):
        expected = _dilate_pad_reference(torch.from_numpy(x), torch.from_numpy(w),
                                         None if b is None else torch.from_numpy(b), dil, pads)
        assert_close(out, expected.numpy(), "multiconv dilated", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"strides": [2, 1, 1, 1, 1, 2], "pads": [0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1]},
    {"inDilations": [2, 1, 1, 1, 2, 2], "outPads": [1, 0, 0, 1] + [0] * 8},
])
def test_multiconv_grad(attrs):
    """Gradients (via ConvGrad, or MultiConvGrad with dilation / output pads) == autograd of
    the per-conv torch reference."""
    x0, w0, b0 = rand(1, 2, 5, 4, seed=1), rand(3, 2, 2, 2, seed=2), rand(3, seed=3)
    x1, w1 = rand(2, 1, 4, 4, seed=4), rand(2, 1, 3, 2, seed=5)
    x2, w2, b2 = rand(1, 2, 3, 3, seed=6), rand(2, 2, 1, 2, seed=7), rand(2, seed=8)
    flat = {k: np.asarray(v) for k, v in attrs.items()}

    def per_conv(name, i, size, default):
        values = flat.get(name)
        return tuple(values[i * size:(i + 1) * size]) if values is not None else (default,) * size

    def ref(*ins):
        outs = []
        for i in range(3):
            x, w, b = ins[3 * i: 3 * i + 3]
            pads = per_conv("pads", i, 4, 0)
            x = torch.nn.functional.pad(x, (pads[1], pads[3], pads[0], pads[2]))
            dil = per_conv("inDilations", i, 2, 1)
            if dil != (1, 1):
                xd = x.new_zeros(x.shape[:2] + tuple((s - 1) * d + 1 for s, d in zip(x.shape[2:], dil)))
                xd[:, :, ::dil[0], ::dil[1]] = x
                x = xd
            y = torch.nn.functional.conv2d(x, w, b, stride=per_conv("strides", i, 2, 1))
            op = per_conv("outPads", i, 4, 0)
            outs.append(torch.nn.functional.pad(y, (op[1], op[3], op[0], op[2])))
        return outs

    check_grad("MultiConv", [x0, w0, b0, x1, w1, None, x2, w2, b2], attrs, domain=GC,
               num_outputs=3, ref=ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options,match", [
    ({"availableMemoryProportions": [0.5]}, r"one value per convolution \(2\)"),
    ({"availableMemoryProportions": [0.5, 1.5]}, r"must be in \(0, 1\]"),
    ({"partialsTypes": ["float", "double"]}, r"\['double'\] are not one of"),
    ({"planType": "diagonal"}, "planType 'diagonal'"),
    ({"strides": [[1, 1]]}, r"strides=.*one list per convolution \(2\)"),
    ({"strides": [[1, 1], [1, 1, 1]]}, "different numbers of spatial dims"),
])
def test_multiconv_rejects_bad_options(options, match):
    convs = _conv_operands()
    builder = popart.Builder()
    ids = [builder.addInputTensor(popart.TensorInfo("FLOAT", list(a.shape)))
           for conv in convs for a in conv if a is not None]
    with pytest.raises(popart.popart_exception, match="multiconv: .*" + match):
        builder.aiGraphcore.multiconv([ids[:3], ids[3:]], **options)


def test_multiconv_shape_errors_name_the_conv():
    """A convolution's shape error comes from the ai.onnx Conv rules, naming which conv."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 3, 5, 5]))
    w_ok = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 3, 3]))
    w_bad = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 4, 3, 3]))
    outs = builder.aiGraphcore.multiconv([[x, w_ok], [x, w_bad]], debugContext="mc")
    with pytest.raises(popart.popart_exception, match=r"Conv 'mc/conv1'.*channel mismatch"):
        builder.getTensorShape(outs[1])
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 3, 5, 5]))
    w = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 3, 3]))
    outs = builder.aiGraphcore.multiconv([[x, w], [x, w]], strides=[[2, 2], []],
                                         outPads=[[], [1, 1, 0, 0]])
    assert [builder.getTensorShape(o) for o in outs] == [[1, 2, 2, 2], [1, 2, 4, 4]]


def test_multiconv_records_hints():
    """The planning hints are kept on the node and do not change the values."""
    convs = _conv_operands()
    build, arrays = _build_multiconv(convs)
    plain = run_builder(build, *arrays)
    hints = {"availableMemoryProportions": [0.3, 1.0], "partialsTypes": ["half", "float"],
             "planType": "serial", "perConvReservedTiles": 20, "cycleBackOff": 0.2,
             "enableConvDithering": [1, 0]}
    build, arrays = _build_multiconv(convs, **hints)
    hinted = run_builder(build, *arrays)
    for a, b in zip(plain, hinted):
        assert_close(b, a, "hinted multiconv")
    builder = popart.Builder()
    x, w = (builder.addInputTensor(popart.TensorInfo("FLOAT", list(a.shape)))
            for a in convs[1][:2])
    builder.aiGraphcore.multiconv([[x, w]], availableMemoryProportions=[0.4], planType="parallel")
    import onnx

    node = onnx.load_from_string(builder.getModelProto()).graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "MultiConv" and node.domain == GC
    assert attrs["availableMemoryProportions"] == pytest.approx([0.4])
    assert attrs["planType"] == b"parallel"


# --- PackedDataBlock -----------------------------------------------------------------------------


def _packed_reference(a, a_off, a_len, b, b_off, b_len, max_a, max_b, result_size, scale=None):
    """The definition: unpack each sequence zero-padded, apply the callback
    y = 2·a + cumsum(a over the sequence) + sum(b over the sequence) (· scale), and pack y's
    first len_a rows at a's offsets into a zero result."""
    result = np.zeros((result_size,) + a.shape[1:], np.float32)
    for s in range(len(a_off)):
        pa = np.zeros((max_a,) + a.shape[1:], np.float32)
        pa[:a_len[s]] = a[a_off[s]:a_off[s] + a_len[s]]
        pb = np.zeros((max_b,) + b.shape[1:], np.float32)
        pb[:b_len[s]] = b[b_off[s]:b_off[s] + b_len[s]]
        y = 2 * pa + np.cumsum(pa, axis=0) + pb.sum(axis=0)
        if scale is not None:
            y = y * scale
        result[a_off[s]:a_off[s] + a_len[s]] = y[:a_len[s]]
    return result


def _callback(builder, batch, max_a, max_b, features, scale_id=None):
    """The callback of _packed_reference as a subgraph builder."""
    sub = builder.createSubgraphBuilder()
    a = sub.addInputTensor(popart.TensorInfo("FLOAT", [batch, max_a, features]))
    b = sub.addInputTensor(popart.TensorInfo("FLOAT", [batch, max_b, features]))
    on = sub.aiOnnx
    cumsum = on.cumsum([a, on.constant(np.array(1, np.int32))])
    y = on.add([on.mul([a, on.constant(np.array(2, np.float32))]), cumsum])
    y = on.add([y, on.reducesum([b], axes=[1], keepdims=1)])
    if scale_id is not None:
        sub.addInputTensorFromParentGraph(scale_id)
        y = on.mul([y, scale_id])
    sub.addOutputTensor(y)
    return sub


def _packed_operands():
    features = 3
    a_len = np.array([2, 4, 1, 3], np.int32)
    a_off = np.array([0, 2, 7, 9], np.int32)  # rows 6 and 8 belong to no sequence
    b_len = np.array([1, 2, 2, 3], np.int32)
    b_off = np.array([5, 0, 2, 6], np.int32)  # any order
    a = rand(12, features, seed=20)
    b = rand(9, features, seed=21)
    return features, (a, a_off, a_len, b, b_off, b_len)


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_packed_data_block_matches_definition(batch):
    features, arrays = _packed_operands()
    max_a, max_b, result_size = 4, 3, 13

    def build(bld, gc, *ids):
        callback = _callback(bld, batch, max_a, max_b, features)
        return gc.packedDataBlock(list(ids), [max_a, max_b], result_size, batch, callback)

    out = run_builder(build, *arrays)
    expected = _packed_reference(*arrays, max_a, max_b, result_size)
    assert_close(out, expected, "packedDataBlock", rtol=1e-5, atol=1e-6)
    assert not out[[6, 8, 12]].any()  # rows outside every sequence stay zero


def test_packed_data_block_errors():
    features, arrays = _packed_operands()

    def build(batch, max_a):
        def fn(bld, gc, *ids):
            callback = _callback(bld, batch, max_a, 3, features)
            return gc.packedDataBlock(list(ids), [max_a, 3], 13, batch, callback)
        return fn

    with pytest.raises(popart.popart_exception, match="4 sequences are not a multiple of "
                       "callbackBatchSize=3"):
        run_builder(build(3, 4), *arrays)
    with pytest.raises(popart.popart_exception, match=r"PackedDataBlock .*input 0.*at most 3 rows"):
        run_builder(build(2, 3), *arrays)  # a sequence of length 4 does not fit

    def wrong_callback(bld, gc, *ids):
        callback = bld.createSubgraphBuilder()
        callback.addInputTensor(popart.TensorInfo("FLOAT", [2, 4, features]))
        b = callback.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, features]))
        callback.addOutputTensor(callback.aiOnnx.identity([b]))  # 3 rows, not 4
        return gc.packedDataBlock(list(ids), [4, 3], 13, 2, callback)

    with pytest.raises(popart.popart_exception, match=r"callback must return one tensor "
                       r"\[callbackBatchSize 2, maxSequenceLengths\[0\] 4, ...\], got \['f32\[2,3,3\]"):
        run_builder(wrong_callback, *arrays)
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4, 3]))
    with pytest.raises(popart.popart_exception, match="triples"):
        builder.aiGraphcore.packedDataBlock([x, x], [4], 4, 1, builder.createSubgraphBuilder())


def test_packed_data_block_grad():
    """d data through the callback's gradient graph == torch.autograd of the definition."""
    features, (a, a_off, a_len, b, b_off, b_len) = _packed_operands()
    max_a, max_b, batch, result_size = 4, 3, 2, 13
    builder = popart.Builder(opsets={"ai.onnx": 11})
    callback = _callback(builder, batch, max_a, max_b, features)
    attrs = {"maxSequenceLengths": [max_a, max_b], "resultSize": result_size,
             "callbackBatchSize": batch, "callback": callback.subgraph_proto()}

    def ref(a, a_off, a_len, b, b_off, b_len):
        rows = []
        result = torch.zeros((result_size, features), dtype=a.dtype)
        for s in range(len(a_off)):
            pa = torch.zeros((max_a, features), dtype=a.dtype)
            pa[:int(a_len[s])] = a[int(a_off[s]):int(a_off[s] + a_len[s])]
            pb = torch.zeros((max_b, features), dtype=a.dtype)
            pb[:int(b_len[s])] = b[int(b_off[s]):int(b_off[s] + b_len[s])]
            y = 2 * pa + torch.cumsum(pa, 0) + pb.sum(0)
            rows.append((int(a_off[s]), y[:int(a_len[s])]))
        for start, y in rows:
            result = torch.cat([result[:start], y, result[start + len(y):]])
        return result

    check_grad("PackedDataBlock", [a, a_off, a_len, b, b_off, b_len], attrs, domain=GC,
               ref=ref, wrt=[0, 3], opset=11, rtol=1e-4, atol=1e-5)


def test_packed_data_block_grad_in_training_session():
    """In a TrainingSession the weights the callback reads from the enclosing graph get their
    gradient summed over the batches, next to the packed data's gradients."""
    features, (a, a_off, a_len, b, b_off, b_len) = _packed_operands()
    max_a, max_b, batch, result_size = 4, 3, 2, 13
    scale = rand(features, seed=30)
    weights_r = rand(result_size, features, seed=31)
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    a_id, b_id, s_id = (builder.addInitializedInputTensor(v) for v in (a, b, scale))
    index_ids = [builder.addInputTensor(popart.TensorInfo("INT32", [4])) for _ in range(4)]
    callback = _callback(builder, batch, max_a, max_b, features, scale_id=s_id)
    out = builder.aiGraphcore.packedDataBlock(
        [a_id, index_ids[0], index_ids[1], b_id, index_ids[2], index_ids[3]], [max_a, max_b],
        result_size, batch, callback)
    weighted = builder.aiOnnx.mul([out, builder.aiOnnx.constant(weights_r)])
    loss = builder.aiGraphcore.identityloss([weighted], reduction=popart.ReductionType.Sum)
    grads = [popart.reservedGradientPrefix() + w for w in (a_id, b_id, s_id)]
    values = _session(builder, index_ids, [a_off, a_len, b_off, b_len], grads, training=True,
                      loss=loss)

    leaves = [torch.from_numpy(v.astype(np.float64)).requires_grad_() for v in (a, b, scale)]
    at, bt, st = leaves
    result = torch.zeros((result_size, features), dtype=torch.float64)
    for s in range(4):
        pa = torch.zeros((max_a, features), dtype=torch.float64)
        pa[:a_len[s]] = at[a_off[s]:a_off[s] + a_len[s]]
        pb = torch.zeros((max_b, features), dtype=torch.float64)
        pb[:b_len[s]] = bt[b_off[s]:b_off[s] + b_len[s]]
        y = (2 * pa + torch.cumsum(pa, 0) + pb.sum(0)) * st
        result = torch.cat([result[:a_off[s]], y[:a_len[s]], result[a_off[s] + a_len[s]:]])
    (result * torch.from_numpy(weights_r.astype(np.float64))).sum().backward()
    for name, got, leaf in zip("abs", values, leaves):
        assert_close(got, leaf.grad.numpy().astype(np.float32), f"d {name}", rtol=1e-4,
                     atol=1e-5)


# --- ShapedDropout -------------------------------------------------------------------------------


def _shaped_dropout_run(x, ratio, shape, training, seed=None):
    """(output, Gradient of the weight w) of shapeddropout(x * w) with loss = sum(output)."""
    builder = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x_id = builder.addInputTensor(popart.TensorInfo("FLOAT", list(x.shape)))
    w_id = builder.addInitializedInputTensor(np.ones(x.shape[1:], np.float32))
    y = builder.aiOnnx.mul([x_id, w_id])
    out = builder.aiGraphcore.shapeddropout([y], shape=shape, ratio=ratio)
    if not training:
        builder.addOutputTensor(out)
        return _session(builder, [x_id], [x], [out])[0], None
    loss = builder.aiGraphcore.identityloss([out], reduction=popart.ReductionType.Sum)
    return _session(builder, [x_id], [x], [out, popart.reservedGradientPrefix() + w_id],
                    training=True, loss=loss, seed=seed)


def test_shaped_dropout_inference_and_ratio_zero_are_identity():
    x = rand(4, 3, 5, low=0.5, high=1.5, seed=40)
    out, _ = _shaped_dropout_run(x, 0.5, [4, 3, 1], training=False)
    assert_close(out, x, "inference shapeddropout")
    out, grad_w = _shaped_dropout_run(x, 0.0, [4, 3, 1], training=True, seed=1)
    assert_close(out, x, "ratio 0 shapeddropout")
    assert_close(grad_w, x.sum(0), "ratio 0 gradient", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [[64, 8, 1], [1, 8, 16], [8, 1]])
def test_shaped_dropout_training_mask(shape):
    """Active in a TrainingSession: one mask of ``shape``, shared along its broadcast (size 1)
    dims, kept values scaled by 1 / (1 - ratio), about ``ratio`` of the mask dropped; the
    gradient reuses the mask; the same seed replays the same mask, another seed does not."""
    ratio = 0.5
    x = rand(64, 8, 16, low=0.5, high=1.5, seed=41)
    out, grad_w = _shaped_dropout_run(x, ratio, shape, training=True, seed=7)
    kept = out != 0
    assert_close(out[kept], (x / (1 - ratio))[kept], "kept values", rtol=1e-6, atol=1e-6)
    # Structure: the mask, broadcast back to the data, is constant along broadcast dims.
    full = np.broadcast_to(np.ones(shape, bool), x.shape).shape
    lead = x.ndim - len(shape)
    mask_dims = [1] * lead + list(shape)
    axes = tuple(i for i, d in enumerate(mask_dims) if d == 1)
    assert full == x.shape
    mask = kept.all(axis=axes, keepdims=True)
    assert (np.broadcast_to(mask, x.shape) == kept).all(), "mask not shared along broadcast dims"
    fraction = 1 - mask.mean()
    assert abs(fraction - ratio) < 4 * np.sqrt(ratio * (1 - ratio) / mask.size) + 1e-9, fraction
    assert_close(grad_w, (kept * x / (1 - ratio)).sum(0), "gradient through the mask",
                 rtol=1e-5, atol=1e-5)
    again, _ = _shaped_dropout_run(x, ratio, shape, training=True, seed=7)
    other, _ = _shaped_dropout_run(x, ratio, shape, training=True, seed=8)
    assert (again == out).all()
    assert (other != out).any()


# --- coverage of the builder's ai.graphcore methods ---------------------------------------------


def test_every_ai_graphcore_method_is_tested():
    """Every public method of builder.aiGraphcore is called (``.method(``) by a test under
    tests/, so a new builder method without a test fails here."""
    methods = {name for name, _ in inspect.getmembers(popart.Builder().aiGraphcore)
               if not name.startswith("_") and callable(getattr(popart.Builder().aiGraphcore, name))}
    tests_dir = Path(__file__).resolve().parents[1]
    called, named = set(), set()
    for path in tests_dir.rglob("*.py"):
        text = path.read_text()
        called |= set(re.findall(r"\.(\w+)\(", text))
        # Tests that pick the method from a table by name (getattr(gc, name)) call the names
        # quoted in that file.
        if re.search(r"getattr\(\s*(gc|\w+\.aiGraphcore)\s*,", text):
            named |= set(re.findall(r"[\"'](\w+)[\"']", text))
    untested = sorted(m for m in methods if m not in called | named)
    assert not untested, f"builder.aiGraphcore methods without a test: {untested}"
