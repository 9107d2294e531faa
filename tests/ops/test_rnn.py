"""RNN, GRU and LSTM (spec §6.1) against onnxruntime in every direction, with and without the
optional inputs, every registered version and both layouts; gradients against central
differences of the kernels in float64."""

from __future__ import annotations

import numpy as np
import pytest

from popart_backend.errors import ShapeError, UnsupportedOpError
from popart_backend.importer.onnx_model import import_model
from popart_backend.ops.registry import registered_versions
from tests.helpers import (
    assert_close,
    check_grad,
    check_op,
    one_op_model,
    run_onnxruntime,
    run_popart,
)

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OUTPUTS = {"RNN": 2, "GRU": 2, "LSTM": 3}
DIRECTIONS = ["forward", "reverse", "bidirectional"]


def operands(kind, direction, seq=4, batch=3, inp=5, hidden=2, layout=0, bias=True, lens=False,
             initial=False, peepholes=False, seed=0):
    """Inputs of a ``kind`` node in ONNX order (None = omitted optional input)."""
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    d = 2 if direction == "bidirectional" else 1
    g = GATES[kind]
    state = (batch, d, hidden) if layout else (d, batch, hidden)
    ins = [r(batch, seq, inp) if layout else r(seq, batch, inp), r(d, g * hidden, inp),
           r(d, g * hidden, hidden), r(d, 2 * g * hidden) if bias else None,
           np.array([seq, 2, 3, 1][:batch], np.int32) if lens else None,
           r(*state) if initial else None]
    if kind == "LSTM":
        ins += [r(*state) if initial else None, r(d, 3 * hidden) if peepholes else None]
    while ins[-1] is None:
        ins.pop()
    return ins


def test_registered_versions():
    assert registered_versions("RNN") == [1, 7, 14, 22]
    assert registered_versions("GRU") == [1, 3, 7, 14, 22]
    assert registered_versions("LSTM") == [1, 7, 14, 22]


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("optional", ["none", "bias", "all"])
@pytest.mark.parametrize("opset", [7, 14, 22])
def test_against_onnxruntime(kind, direction, optional, opset):
    full = optional == "all"
    ins = operands(kind, direction, bias=optional != "none", lens=full, initial=full,
                   peepholes=full)
    attrs = {"hidden_size": 2, "direction": direction}
    if kind == "GRU":
        attrs["linear_before_reset"] = int(full)
    check_op(kind, ins, attrs, opset=opset, num_outputs=OUTPUTS[kind])


@pytest.mark.parametrize("kind,attrs", [
    ("RNN", {"clip": 0.3}),
    ("GRU", {"clip": 0.5}),
    ("LSTM", {"clip": 0.5}),
    ("LSTM", {"input_forget": 1}),
    ("LSTM", {"input_forget": 1, "clip": 0.4}),
    ("GRU", {"linear_before_reset": 1}),
    ("RNN", {"activations": ["Relu"]}),
    ("RNN", {"activations": ["HardSigmoid"]}),
    ("RNN", {"activations": ["HardSigmoid"], "activation_alpha": [0.3], "activation_beta": [0.4]}),
    ("RNN", {"activations": ["LeakyRelu"], "activation_alpha": [0.2]}),
    ("RNN", {"activations": ["Elu"]}),
    ("RNN", {"activations": ["Softsign"]}),
    ("RNN", {"activations": ["Softplus"]}),
    ("RNN", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.1]}),
    ("RNN", {"activations": ["ScaledTanh"], "activation_alpha": [0.5], "activation_beta": [2.0]}),
    ("RNN", {"activations": ["Affine"], "activation_alpha": [0.5], "activation_beta": [0.1]}),
    ("GRU", {"activations": ["HardSigmoid", "Tanh"], "activation_alpha": [0.3],
             "activation_beta": [0.6]}),
    ("LSTM", {"activations": ["HardSigmoid", "Tanh", "Relu"], "activation_alpha": [0.3],
              "activation_beta": [0.6]}),
    ("LSTM", {"direction": "bidirectional",
              "activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Relu", "Tanh"],
              "activation_alpha": [0.25], "activation_beta": [0.5]}),
])
def test_attributes_against_onnxruntime(kind, attrs):
    ins = operands(kind, attrs.get("direction", "forward"), lens=True, initial=True,
                   peepholes=True)
    check_op(kind, ins, {"hidden_size": 2, **attrs}, opset=14, num_outputs=OUTPUTS[kind])


@pytest.mark.parametrize("kind,version", [("RNN", 1), ("GRU", 1), ("GRU", 3), ("LSTM", 1)])
def test_early_versions_match_version_7(kind, version):
    # onnxruntime has no kernels before version 7; the semantics are the same.
    ins = operands(kind, "bidirectional", lens=True, initial=True)
    attrs = {"hidden_size": 2, "direction": "bidirectional"}
    if version == 3:
        attrs["linear_before_reset"] = 1
    model, feeds = one_op_model(kind, ins, attrs, opset=version, num_outputs=OUTPUTS[kind])
    ours = run_popart(model, feeds)
    ref = run_onnxruntime(one_op_model(kind, ins, attrs, opset=7, num_outputs=OUTPUTS[kind])[0],
                          feeds)
    for name, value in ref.items():
        assert_close(ours[name], value, f"{kind}-{version} {name}")


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1_matches_layout_0(kind, direction):
    # onnxruntime has no batch-first kernels: compare with its layout-0 result, transposed.
    ins = operands(kind, direction, layout=1, lens=True, initial=True, peepholes=True)
    attrs = {"hidden_size": 2, "direction": direction}
    model, feeds = one_op_model(kind, ins, {**attrs, "layout": 1}, opset=14,
                                num_outputs=OUTPUTS[kind])
    ours = run_popart(model, feeds)
    flipped = [x.swapaxes(0, 1) if i in (0, 5, 6) and x is not None else x
               for i, x in enumerate(ins)]
    model0, feeds0 = one_op_model(kind, flipped, attrs, opset=14, num_outputs=OUTPUTS[kind])
    ref = run_onnxruntime(model0, feeds0)
    assert_close(ours["out0"], ref["out0"].transpose(2, 0, 1, 3), "Y")
    for name in list(ref)[1:]:
        assert_close(ours[name], ref[name].swapaxes(0, 1), name)


def test_only_y_h_requested():
    ins = operands("LSTM", "forward")
    model, feeds = one_op_model("LSTM", ins, {"hidden_size": 2}, opset=14, num_outputs=2)
    model.graph.node[0].output[0] = ""
    del model.graph.output[0]
    ours = run_popart(model, feeds)
    assert_close(ours["out1"], run_onnxruntime(model, feeds)["out1"], "Y_h")


# --- gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("variant", ["plain", "full_layout1", "clip"])
def test_gradients(kind, direction, variant):
    full = variant == "full_layout1"
    ins = operands(kind, direction, seq=3, batch=2, inp=2, hidden=2, layout=int(full),
                   lens=full, initial=full or variant == "clip", peepholes=full)
    attrs = {"hidden_size": 2, "direction": direction}
    if full:
        attrs["layout"] = 1
    if kind == "GRU":
        attrs["linear_before_reset"] = int(full)
    if variant == "clip":
        attrs["clip"] = 0.6
        if kind == "LSTM":
            attrs["input_forget"] = 1
    check_grad(kind, ins, attrs, opset=14, num_outputs=OUTPUTS[kind], rtol=1e-3, atol=1e-4)


def test_gradient_with_other_activations():
    ins = operands("LSTM", "bidirectional", seq=3, batch=2, inp=2, hidden=2, initial=True,
                   peepholes=True)
    attrs = {"hidden_size": 2, "direction": "bidirectional",
             "activations": ["HardSigmoid", "Softsign", "Elu", "Sigmoid", "LeakyRelu", "Tanh"],
             "activation_alpha": [0.3, 0.9, 0.1], "activation_beta": [0.45]}
    check_grad("LSTM", ins, attrs, opset=14, num_outputs=3, rtol=1e-3, atol=1e-4)


# --- errors ------------------------------------------------------------------------------------


def test_wrong_weight_shape():
    ins = operands("GRU", "forward")
    ins[1] = ins[1][:, :4]
    model, _ = one_op_model("GRU", ins, {"hidden_size": 2}, opset=14, num_outputs=2)
    with pytest.raises(ShapeError, match="GRU .*W is f32\\[1,4,5\\], expected shape \\[1, 6, 5\\]"):
        import_model(model)


def test_unknown_activation():
    model, _ = one_op_model("RNN", operands("RNN", "forward"),
                            {"hidden_size": 2, "activations": ["Gelu"]}, opset=14, num_outputs=2)
    with pytest.raises(UnsupportedOpError, match="RNN .*activation 'Gelu'"):
        import_model(model)


def test_activation_count_per_direction():
    model, _ = one_op_model("LSTM", operands("LSTM", "bidirectional"),
                            {"hidden_size": 2, "direction": "bidirectional",
                             "activations": ["Sigmoid", "Tanh", "Tanh"]},
                            opset=14, num_outputs=3)
    with pytest.raises(ShapeError, match="3 function\\(s\\) per direction, 6 in all"):
        import_model(model)
