"""Shape-manipulation ops (ops/shape.py) at every registered since-version (F78, F82).

Each case runs a one-op model here and in onnxruntime (or against numpy where onnxruntime has no
kernel for an old version), and checks inferred against runtime shapes and dtypes.
"""

from __future__ import annotations

import numpy as np
import onnx.defs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from popart_backend.errors import ShapeError
from popart_backend.importer.onnx_model import import_model
from popart_backend.ops.registry import registered_versions
from tests.helpers import check_op, rand, run_onnxruntime, run_popart

I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min

SHAPE_OPS = (
    "Reshape Squeeze Unsqueeze Split Slice Pad Shape Concat Flatten Tile Expand Range "
    "ConstantOfShape Trilu Identity Constant Size Transpose DepthToSpace SpaceToDepth EyeLike"
).split()


def i64(*values):
    return np.array(values, dtype=np.int64)


def x(*shape, dtype=np.float32, seed=0):
    return rand(*shape, dtype=dtype, low=-5, high=5, seed=seed)


def case(op, version, inputs, attrs=None, const=(), outputs=1, ref=None, name=""):
    return pytest.param(op, version, inputs, attrs or {}, const, outputs, ref,
                        id=f"{op}-{version}{'-' + name if name else ''}")


def _np_pad(data, pads, mode="constant", value=0.0):
    rank = data.ndim
    widths = [(pads[i], pads[i + rank]) for i in range(rank)]
    np_mode = {"edge": "edge", "reflect": "reflect", "wrap": "wrap"}.get(mode, "constant")
    if np_mode == "constant":
        return np.pad(data, widths, mode="constant", constant_values=value)
    return np.pad(data, widths, mode=np_mode)


def _sparse_constant():
    values = numpy_helper.from_array(np.array([1.5, -2.0, 3.0], np.float32), "values")
    indices = numpy_helper.from_array(i64(1, 5, 10), "indices")
    return helper.make_sparse_tensor(values, indices, [3, 4])


CASES = [
    # Reshape: attribute (1), constant input (5+), allowzero (14+).
    case("Reshape", 1, [x(2, 3, 4)], {"shape": [4, 0, -1]}),
    case("Reshape", 5, [x(2, 3, 4), i64(-1, 4)], const=(1,)),
    case("Reshape", 13, [x(2, 3, 4, dtype=np.int32), i64(0, -1)], const=(1,)),
    case("Reshape", 14, [x(0, 4), i64(4, 0)], {"allowzero": 1}, const=(1,), name="allowzero"),
    case("Reshape", 14, [x(2, 3, 4), i64(0, 2, -1)], {"allowzero": 0}, const=(1,), name="copy0"),
    case("Reshape", 19, [x(6), i64(2, -1)], const=(1,)),
    case("Reshape", 21, [x(1, 1), i64()], const=(1,), name="to-scalar"),
    # Squeeze / Unsqueeze: axes attribute before 13, input from 13.
    case("Squeeze", 1, [x(1, 3, 1, 2)], {"axes": [0, 2]}),
    case("Squeeze", 11, [x(2, 3, 1)], {"axes": [-1]}),
    case("Squeeze", 13, [x(2, 1, 3), i64(-2)], const=(1,)),
    case("Squeeze", 13, [x(1, 2, 1, 3)], name="all"),
    case("Squeeze", 21, [x(1, 2, 1), i64(0, 2)], const=(1,)),
    case("Unsqueeze", 1, [x(2, 3)], {"axes": [0, 3]}),
    case("Unsqueeze", 11, [x(2, 3)], {"axes": [-1, 0]}),
    case("Unsqueeze", 13, [x(2, 3), i64(1, -1)], const=(1,)),
    case("Unsqueeze", 21, [x(), i64(0)], const=(1,), name="scalar"),
    # Split: attribute (1, 2, 11), input (1, 13+), num_outputs (18+), even split otherwise.
    case("Split", 1, [x(2, 4)], {"axis": 1, "split": [1, 3]}, outputs=2,
         ref=lambda a: np.split(a, [1], axis=1)),
    case("Split", 1, [x(5, 2), i64(2, 3)], const=(1,), outputs=2, name="input",
         ref=lambda a, s: np.split(a, [2], axis=0)),
    case("Split", 2, [x(4, 3)], outputs=2, name="even"),
    case("Split", 2, [x(4, 3)], {"split": [3, 1]}, outputs=2),
    case("Split", 11, [x(2, 4)], {"axis": -1, "split": [2, 1, 1]}, outputs=3),
    case("Split", 13, [x(3, 6), i64(1, 0, 5)], {"axis": 1}, const=(1,), outputs=3),
    case("Split", 13, [x(6, 2, dtype=np.int64)], outputs=3, name="even"),
    case("Split", 18, [x(7, 2)], {"num_outputs": 3}, outputs=3, name="num-outputs"),
    case("Split", 18, [x(2, 5), i64(4, 1)], {"axis": -1}, const=(1,), outputs=2),
    case("Split", 18, [x(4)], {"num_outputs": 1}, outputs=1, name="one-output"),
    # Slice: attributes (1), inputs with steps (10+), clamping and INT64 sentinels.
    case("Slice", 1, [x(4, 5)], {"starts": [1, -3], "ends": [100, -1]}),
    case("Slice", 1, [x(4, 5)], {"starts": [1], "ends": [3], "axes": [1]}, name="axes"),
    case("Slice", 10, [x(6, 4), i64(-1), i64(-1000), i64(0), i64(-2)], const=(1, 2, 3, 4),
         name="neg-step"),
    case("Slice", 11, [x(3, 7), i64(I64_MAX, 1), i64(I64_MIN, I64_MAX), i64(0, -1),
                       i64(-1, 3)], const=(1, 2, 3, 4), name="sentinels"),
    case("Slice", 11, [x(3, 7), i64(5), i64(2)], const=(1, 2), name="empty"),
    case("Slice", 13, [x(2, 3, 8, dtype=np.int32), i64(-2, 10), i64(0, -10), i64(1, -1),
                       i64(-1, -3)], const=(1, 2, 3, 4)),
    # Pad: paddings (1), pads attribute (2), inputs (11+), axes (18+), wrap (19+).
    case("Pad", 1, [x(2, 3)], {"paddings": [1, 0, 0, 2], "value": 1.5},
         ref=lambda a: _np_pad(a, [1, 0, 0, 2], value=1.5)),
    case("Pad", 2, [x(2, 3)], {"pads": [0, 1, 2, 1], "value": -3.0}),
    case("Pad", 2, [x(3, 4)], {"pads": [1, 2, 2, 1], "mode": "reflect"}, name="reflect"),
    case("Pad", 2, [x(3, 4)], {"pads": [2, 0, 1, 3], "mode": "edge"}, name="edge"),
    case("Pad", 11, [x(2, 3), i64(1, 1, 0, 2), np.array(2.5, np.float32)], const=(1, 2)),
    case("Pad", 11, [x(4, 5), i64(-1, 1, 0, -2)], const=(1,), name="crop"),
    case("Pad", 13, [x(1, 2, 3, 3), i64(0, 0, 1, 1, 0, 0, 1, 2)], {"mode": "edge"}, const=(1,)),
    case("Pad", 13, [x(3, 3, dtype=np.int64), i64(1, 1, 1, 1)], {"mode": "reflect"}, const=(1,),
         name="int"),
    case("Pad", 18, [x(2, 3, 4), i64(1, 2, 0, 1), np.array(7.0, np.float32), i64(0, -1)],
         const=(1, 2, 3)),
    case("Pad", 19, [x(3, 4), i64(2, 1, 1, 3)], {"mode": "wrap"}, const=(1,), name="wrap",
         ref=lambda a, p: _np_pad(a, list(p), "wrap")),
    case("Pad", 19, [x(2, 3), i64(1, 1), None, i64(1)], const=(1, 3), name="axes"),
    case("Pad", 21, [x(2, 5), i64(2, 3), None, i64(-1)], {"mode": "reflect"}, const=(1, 3)),
    # Shape (start/end from 15) and Size.
    case("Shape", 1, [x(2, 3, 4)]),
    case("Shape", 13, [x()], name="scalar"),
    case("Shape", 15, [x(2, 3, 4, 5)], {"start": 1, "end": -1}),
    case("Shape", 19, [x(2, 3, 4)], {"start": -2}),
    case("Shape", 21, [x(2, 3, 4)], {"start": -10, "end": 100}, name="clamp"),
    case("Size", 1, [x(2, 3)]),
    case("Size", 13, [x(0, 3)]),
    case("Size", 19, [x()]),
    case("Size", 21, [x(4, 5, dtype=np.int32)]),
    # Concat (axis default 1 in version 1, negative from 11).
    case("Concat", 1, [x(2, 2), x(2, 3, seed=1)],
         ref=lambda a, b: np.concatenate([a, b], axis=1)),
    case("Concat", 4, [x(1, 3), x(2, 3, seed=1)], {"axis": 0}),
    case("Concat", 11, [x(2, 1), x(2, 3, seed=1), x(2, 0)], {"axis": -1}),
    case("Concat", 13, [i64(1, 2), i64(3)], {"axis": 0}),
    # Flatten.
    case("Flatten", 1, [x(2, 3, 4)], {"axis": 0}),
    case("Flatten", 9, [x(2, 3, 4)], {"axis": 2}),
    case("Flatten", 11, [x(2, 3, 4)], {"axis": -1}),
    case("Flatten", 13, [x(2, 3, 4, dtype=np.int32)]),
    case("Flatten", 21, [x(2, 3, 4)], {"axis": 3}),
    # Tile (tiles/axis inputs in 1, repeats from 6) and Expand.
    case("Tile", 1, [x(2, 3), np.array(3.0, np.float32), np.array(1.0, np.float32)],
         const=(1, 2), ref=lambda a, t, ax: np.tile(a, (1, 3))),
    case("Tile", 6, [x(2, 1, 3), i64(2, 3, 1)], const=(1,)),
    case("Tile", 13, [x(2, 3, dtype=np.int32), i64(1, 2)], const=(1,)),
    case("Expand", 8, [x(3, 1), i64(2, 1, 6)], const=(1,)),
    case("Expand", 13, [x(2, 3), i64(1)], const=(1,), name="smaller"),
    # Generators: Range, ConstantOfShape, EyeLike, Trilu, Constant.
    case("Range", 11, [np.array(2, np.int64), np.array(11, np.int64), np.array(3, np.int64)],
         const=(0, 1, 2)),
    case("Range", 11, [np.array(1.0, np.float32), np.array(-2.0, np.float32),
                       np.array(-0.5, np.float32)], const=(0, 1, 2), name="float"),
    case("Range", 11, [np.array(5, np.int32), np.array(1, np.int32), np.array(1, np.int32)],
         const=(0, 1, 2), name="empty"),
    case("ConstantOfShape", 9, [i64(2, 3)], const=(0,)),
    case("ConstantOfShape", 20, [i64(4)], {"value": numpy_helper.from_array(
        np.array([7], np.int32))}, const=(0,)),
    case("ConstantOfShape", 21, [i64()], {"value": numpy_helper.from_array(
        np.array([2.5], np.float32))}, const=(0,), name="scalar"),
    case("EyeLike", 9, [x(3, 3)]),
    case("EyeLike", 9, [x(3, 5)], {"dtype": TensorProto.INT32, "k": 1}, name="k"),
    case("EyeLike", 9, [x(4, 2, dtype=np.int64)], {"k": -2}, name="neg-k"),
    case("Trilu", 14, [x(4, 5), np.array(1, np.int64)], const=(1,)),
    case("Trilu", 14, [x(2, 3, 4), np.array(-1, np.int64)], {"upper": 0}, const=(1,),
         name="lower-batched"),
    case("Trilu", 14, [x(3, 3, dtype=np.int64)], {"upper": 0}, name="no-k"),
    case("Identity", 1, [x(2, 3)]),
    case("Identity", 13, [x(2, 3, dtype=np.int64)]),
    case("Identity", 14, [x()]),
    case("Identity", 16, [x(3)]),
    case("Identity", 19, [x(1, 2)]),
    case("Identity", 21, [x(2, 2, dtype=np.int32)]),
    case("Constant", 1, [], {"value": numpy_helper.from_array(x(2, 3))}),
    case("Constant", 9, [], {"value": numpy_helper.from_array(i64(1, 2, 3))}),
    case("Constant", 11, [], {"value": numpy_helper.from_array(np.array(4.0, np.float32))}),
    case("Constant", 11, [], {"sparse_value": _sparse_constant()}, name="sparse",
         ref=lambda: np.array([[0, 1.5, 0, 0], [0, -2, 0, 0], [0, 0, 3, 0]], np.float32)),
    case("Constant", 12, [], {"value_float": 0.25}),
    case("Constant", 12, [], {"value_ints": [3, -1, 4]}, name="ints"),
    case("Constant", 13, [], {"value_floats": [1.0, 2.5]}),
    case("Constant", 13, [], {"value_int": -7}, name="int"),
    case("Constant", 19, [], {"value": numpy_helper.from_array(x(2, dtype=np.int32))}),
    case("Constant", 21, [], {"value": numpy_helper.from_array(x(1, 2))}),
    # Transpose, DepthToSpace, SpaceToDepth.
    case("Transpose", 1, [x(2, 3, 4)]),
    case("Transpose", 13, [x(2, 3, 4)], {"perm": [1, 2, 0]}),
    case("Transpose", 21, [x(2, 3, 4, 5, dtype=np.int32)], {"perm": [0, 3, 1, 2]}),
    case("DepthToSpace", 1, [x(1, 8, 2, 3)], {"blocksize": 2}),
    case("DepthToSpace", 11, [x(2, 8, 2, 3)], {"blocksize": 2, "mode": "DCR"}),
    case("DepthToSpace", 11, [x(2, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, name="crd"),
    case("DepthToSpace", 13, [x(1, 9, 2, 2)], {"blocksize": 3, "mode": "CRD"}),
    case("SpaceToDepth", 1, [x(1, 2, 4, 6)], {"blocksize": 2}),
    case("SpaceToDepth", 13, [x(2, 1, 6, 3)], {"blocksize": 3}),
    # Opset 27/28 changes with new semantics; onnxruntime stops at opset 25, numpy is the
    # reference (the CRD layout is the inverse of DepthToSpace's CRD).
    case("DepthToSpace", 28, [x(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"},
         ref=lambda d: d.reshape(1, 2, 2, 2, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(1, 2, 4, 6)),
    case("SpaceToDepth", 28, [x(1, 2, 4, 6)], {"blocksize": 2},
         ref=lambda d: d.reshape(1, 2, 2, 2, 3, 2).transpose(0, 3, 5, 1, 2, 4).reshape(1, 8, 2, 3)),
    case("SpaceToDepth", 28, [x(1, 2, 4, 6)], {"blocksize": 2, "mode": "CRD"}, name="crd",
         ref=lambda d: d.reshape(1, 2, 2, 2, 3, 2).transpose(0, 1, 3, 5, 2, 4).reshape(1, 8, 2, 3)),
    case("Range", 27, [np.array(1000, np.float16), np.array(1100, np.float16),
                       np.array(0.3, np.float16)], const=(0, 1, 2), name="float16-stash",
         ref=lambda a, b, d: (np.float32(a) + np.arange(334, dtype=np.float32) * np.float32(d))
         .astype(np.float16)),
    case("Range", 27, [np.array(3, np.int64), np.array(-4, np.int64), np.array(-2, np.int64)],
         const=(0, 1, 2), name="int", ref=lambda a, b, d: np.arange(3, -4, -2, dtype=np.int64)),
]


def _retyped_cases():
    """Versions 23-25 of the data-movement ops only widen their type lists (float4e2m1,
    float8e8m0, int2 / uint2): each op's newest earlier case runs again at those versions."""
    latest = {}
    for param in CASES:
        op, version = param.values[0], param.values[1]
        if version <= 21 and (op not in latest or latest[op].values[1] <= version):
            latest[op] = param
    extra = []
    for op, param in latest.items():
        newer = sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                        if s.domain == "" and s.name == op and 21 < s.since_version <= 25})
        for version in newer:
            values = (op, version) + tuple(param.values[2:])
            extra.append(pytest.param(*values, id=f"{op}-{version}-retyped"))
    return extra


CASES += _retyped_cases()


@pytest.mark.parametrize("op, version, inputs, attrs, const, outputs, ref", CASES)
def test_op_matches_reference(op, version, inputs, attrs, const, outputs, ref):
    """F78: every registered (op, version) against onnxruntime (numpy where it has no kernel)."""
    check_op(op, inputs, attrs, opset=version, num_outputs=outputs, const_inputs=const, ref=ref)


def test_every_onnx_version_is_registered_and_tested():
    """F82: each op of the family is registered at exactly ONNX's since-versions <= 28."""
    history: dict[str, set[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "" and schema.name in SHAPE_OPS and schema.since_version <= 28:
            history.setdefault(schema.name, set()).add(schema.since_version)
    tested = {(p.values[0], p.values[1]) for p in CASES}
    for op in SHAPE_OPS:
        assert registered_versions(op) == sorted(history[op]), op
        missing = [v for v in history[op] if (op, v) not in tested]
        assert not missing, f"{op}: versions {missing} have no test case"


# --- property tests against numpy -----------------------------------------------------------


@st.composite
def reshape_cases(draw):
    in_shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))
    # Regroup the input dims into a target with the same element count.
    factors = [f for d in in_shape for f in _prime_factors(d)]
    factors = draw(st.permutations(factors))
    rank = draw(st.integers(0 if not factors else 1, max(len(factors), 1) + 1))
    target = [1] * rank
    for f in factors:
        target[draw(st.integers(0, rank - 1))] *= f
    requested = list(target)
    if rank and draw(st.booleans()):
        requested[draw(st.integers(0, rank - 1))] = -1
    for i, d in enumerate(requested):
        if i < len(in_shape) and d == in_shape[i] and draw(st.booleans()):
            requested[i] = 0
    return tuple(in_shape), tuple(target), requested


def _prime_factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@settings(max_examples=40, deadline=None, derandomize=True)
@given(reshape_cases())
def test_reshape_property(spec):
    """Reshape with -1 and 0 entries equals numpy's reshape to the resolved shape."""
    in_shape, target, requested = spec
    data = np.arange(int(np.prod(in_shape)), dtype=np.float32).reshape(in_shape)
    check_op("Reshape", [data, np.array(requested, np.int64)], const_inputs=(1,), opset=14,
             ref=lambda a, s: a.reshape(target))


_bounds = st.one_of(st.integers(-9, 9), st.sampled_from([I64_MAX, I64_MIN]))


@st.composite
def slice_cases(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    axes = draw(st.permutations(range(len(shape))))[: draw(st.integers(1, len(shape)))]
    starts = [draw(_bounds) for _ in axes]
    ends = [draw(_bounds) for _ in axes]
    steps = [draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    negative_axes = [a - len(shape) if draw(st.booleans()) else a for a in axes]
    return shape, starts, ends, negative_axes, steps


@settings(max_examples=60, deadline=None, derandomize=True)
@given(slice_cases())
def test_slice_property(spec):
    """Slice (any steps, negative axes, out-of-range and INT64 sentinel bounds) equals numpy."""
    shape, starts, ends, axes, steps = spec
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    index = [slice(None)] * len(shape)
    for a, s, e, st_ in zip(axes, starts, ends, steps):
        index[a] = _onnx_slice(s, e, st_, shape[a])
    expected = data[tuple(index)]
    operands = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
    check_op("Slice", [data, *operands], const_inputs=(1, 2, 3, 4), opset=13,
             ref=lambda *args: expected)
    if not any(e == I64_MAX and st_ < 0 for e, st_ in zip(ends, steps)):
        # onnxruntime reads an INT64-max end with a negative step as "to the beginning"; the
        # ONNX spec (followed here) clamps it to dim - 1.
        check_op("Slice", [data, *operands], const_inputs=(1, 2, 3, 4), opset=13)


def _onnx_slice(start, end, step, dim):
    """A numpy slice for ONNX's bounds. ONNX clamps a negative-step start below -dim to 0, where
    Python slicing makes the result empty, so the bounds are clamped here as the spec says."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    end = min(max(end, -1), dim - 1)
    return slice(min(max(start, 0), dim - 1), None if end < 0 else end, step)


# --- errors -------------------------------------------------------------------------------------


def _import(model):
    return import_model(model, constant_weights=True)


def _model(nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    return model


def test_reshape_element_count_mismatch_names_op_and_shapes():
    model = _model(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(i64(5, 5), "s")])
    with pytest.raises(ShapeError, match=r"Reshape 'bad_reshape'.*\[2,3,4\].*\[5, 5\]"):
        _import(model)


def test_reshape_shape_from_computed_tensor_must_be_constant():
    """A shape computed at run time (here from a streamed input) cannot size a static tensor."""
    model = _model(
        [helper.make_node("Identity", ["s_in"], ["s"]),
         helper.make_node("Reshape", ["x", "s"], ["y"], name="dyn")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("s_in", TensorProto.INT64, [2])],
        [helper.make_empty_tensor_value_info("y")])
    with pytest.raises(ShapeError, match=r"Reshape 'dyn'.*must be a constant"):
        _import(model)


@pytest.mark.parametrize("op, inputs, attrs, outputs, message", [
    ("Split", [x(5)], {"num_outputs": 4}, 4, "cannot split"),
    ("Split", [x(5), i64(2, 2)], {}, 2, "do not partition"),
    ("Split", [x(4)], {}, 2, "Split-18 needs"),
    ("Squeeze", [x(2, 3), i64(0)], {}, 1, "size is not 1"),
    ("Slice", [x(3), i64(0), i64(3), i64(0), i64(0)], {}, 1, "step 0"),
    ("Concat", [x(2, 3), x(3, 2)], {"axis": 0}, 1, "does not match"),
    ("Transpose", [x(2, 3)], {"perm": [0, 0]}, 1, "not a permutation"),
    ("DepthToSpace", [x(1, 6, 2, 2)], {"blocksize": 2}, 1, "divisible"),
    ("Expand", [x(2, 3), i64(4, 3)], {}, 1, "do not broadcast"),
])
def test_shape_errors(op, inputs, attrs, outputs, message):
    with pytest.raises(ShapeError, match=message):
        check_op(op, inputs, attrs, num_outputs=outputs, const_inputs=range(1, len(inputs)))


def test_string_constants():
    """F78: string Constants fold to STRING constants (ops/string_tensors.py)."""
    check_op("Constant", [], {"value_string": "hello"}, opset=13)
    check_op("Constant", [], {"value_strings": ["a", "bc"]}, opset=13)


# --- folding of exporter shape arithmetic -------------------------------------------------------


def _const_node(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def test_shape_gather_concat_reshape_folds():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch exporters emit it, folds to a
    single Reshape at import (F79 constant folding)."""
    if not registered_versions("Gather"):
        pytest.skip("Gather is not registered yet")
    model = _model(
        [helper.make_node("Shape", ["x"], ["s"]),
         _const_node("i0", np.array(0, np.int64)),
         helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
         _const_node("ax", i64(0)),
         helper.make_node("Unsqueeze", ["d0", "ax"], ["d0u"]),
         _const_node("rest", i64(-1)),
         helper.make_node("Concat", ["d0u", "rest"], ["target"], axis=0),
         helper.make_node("Reshape", ["x", "target"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    ir = import_model(model)
    assert [op.op_type for op in ir.main.ops.values()] == ["Reshape"]
    feeds = {"x": x(2, 3, 4)}
    np.testing.assert_array_equal(run_popart(model, feeds)["y"], run_onnxruntime(model, feeds)["y"])


def test_shape_slice_concat_reshape_folds():
    """Shape(start, end) -> Concat -> Reshape also folds away to a single Reshape."""
    model = _model(
        [helper.make_node("Shape", ["x"], ["lead"], end=1),
         _const_node("rest", i64(-1)),
         helper.make_node("Concat", ["lead", "rest"], ["target"], axis=0),
         helper.make_node("Reshape", ["x", "target"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    ir = import_model(model)
    assert [op.op_type for op in ir.main.ops.values()] == ["Reshape"]
    assert ir.main.tensors["y"].info.shape == (2, 12)
