"""Constant folding of uint16/uint32 values (transforms/const_fold.py; spec §3.3 dtypes, §6.2's
constant folder), against numpy's unsigned arithmetic.

uint16/uint32 live in int32/int64 surrogates (popart_backend/dtypes.py); the execution plan
reduces every kernel's unsigned outputs modulo 2**bits. Folding must reduce the same way, so a
folded ``a - b`` that underflows is the large unsigned value numpy gives, not a negative
surrogate, wherever it is read next (Greater, Div, Add, Mul).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from popart_backend import dtypes
from popart_backend.dtypes import DataType
from popart_backend.importer.onnx_model import import_model
from popart_backend.transforms import const_fold
from tests.helpers import run_popart

UNSIGNED = [(np.uint16, TensorProto.UINT16, DataType.UINT16),
            (np.uint32, TensorProto.UINT32, DataType.UINT32)]


def _underflow_model(np_type, proto_type) -> tuple[onnx.ModelProto, dict, dict]:
    """d = Sub(a, b) of constants (folded, underflowing), read by Greater, Div, Add and Mul."""
    a = np.array([1, 5, 0, 7, 2], np_type)
    b = np.array([2, 3, 1, 7, 9], np_type)
    x = np.array([100, 2, np.iinfo(np_type).max - 1, 0, 5], np_type)
    y = np.array([3, 3, 7, 1, 2], np_type)
    nodes = [
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("Greater", ["d", "x"], ["greater"]),
        helper.make_node("Div", ["d", "y"], ["quotient"]),
        helper.make_node("Add", ["d", "d"], ["twice"]),  # folded too: reads a folded value
        helper.make_node("Mul", ["twice", "x"], ["product"]),
    ]
    outputs = [helper.make_tensor_value_info("greater", TensorProto.BOOL, [5])]
    outputs += [helper.make_tensor_value_info(n, proto_type, [5])
                for n in ("quotient", "twice", "product")]
    graph = helper.make_graph(
        nodes, "uint_fold",
        [helper.make_tensor_value_info(n, proto_type, [5]) for n in ("x", "y")], outputs,
        initializer=[numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    d = a - b  # numpy wraps unsigned arithmetic modulo 2**bits
    twice = d + d
    expected = {"greater": d > x, "quotient": d // y, "twice": twice, "product": twice * x}
    return model, {"x": x, "y": y}, expected


@pytest.mark.parametrize("np_type, proto_type, dtype", UNSIGNED)
def test_folded_unsigned_underflow_matches_numpy(np_type, proto_type, dtype):
    model, feeds, expected = _underflow_model(np_type, proto_type)
    ir = import_model(model)
    assert "Sub" not in [op.op_type for op in ir.main.topo_order()], "Sub was not folded"
    folded = ir.main.tensors["d"]
    assert folded.is_const and folded.data.dtype == np_type
    np.testing.assert_array_equal(folded.data, np.array([1, 5, 0, 7, 2], np_type)
                                  - np.array([2, 3, 1, 7, 9], np_type))
    results = run_popart(model, feeds)
    for name, want in expected.items():
        np.testing.assert_array_equal(results[name], want, err_msg=name)


@pytest.mark.parametrize("np_type, proto_type, dtype", UNSIGNED)
def test_folding_reduces_before_the_host_conversion(np_type, proto_type, dtype, monkeypatch):
    """Folding reduces the surrogates itself, as the plan does, instead of leaning on the host
    conversion's wrapping cast: a strict host conversion sees only in-range surrogates."""
    real_to_host = dtypes.to_host
    high = 2 ** (np.dtype(np_type).itemsize * 8)

    def strict_to_host(tensor: torch.Tensor, dtype_: DataType):
        if dtype_ is dtype and tensor.numel():
            low_seen, high_seen = int(tensor.min()), int(tensor.max())
            assert 0 <= low_seen and high_seen < high, (
                f"unreduced {dtype_.name} surrogate reached the host conversion: "
                f"range [{low_seen}, {high_seen}]")
        return real_to_host(tensor, dtype_)

    monkeypatch.setattr(const_fold, "to_host", strict_to_host)
    model, _, _ = _underflow_model(np_type, proto_type)
    ir = import_model(model)
    assert ir.main.tensors["twice"].is_const


def test_folding_equals_the_plan_for_unsigned_ops():
    """Metamorphic: the same uint16 ops folded (constant inputs) and run by the plan (streamed
    inputs) give the same values, both numpy's."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2**16, size=16).astype(np.uint16)
    b = rng.integers(0, 2**16, size=16).astype(np.uint16)
    for op_type, ref in [("Sub", np.subtract), ("Add", np.add), ("Mul", np.multiply)]:
        node = helper.make_node(op_type, ["a", "b"], ["out"])
        out = [helper.make_tensor_value_info("out", TensorProto.UINT16, [16])]
        streamed = helper.make_model(helper.make_graph(
            [node], "streamed",
            [helper.make_tensor_value_info(n, TensorProto.UINT16, [16]) for n in "ab"], out),
            opset_imports=[helper.make_opsetid("", 18)])
        constant = helper.make_model(helper.make_graph(
            [node], "constant", [], out,
            initializer=[numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")]),
            opset_imports=[helper.make_opsetid("", 18)])
        with np.errstate(over="ignore"):
            want = ref(a, b)
        np.testing.assert_array_equal(run_popart(streamed, {"a": a, "b": b})["out"], want,
                                      err_msg=f"{op_type} run by the plan")
        np.testing.assert_array_equal(run_popart(constant, {})["out"], want,
                                      err_msg=f"{op_type} folded")
