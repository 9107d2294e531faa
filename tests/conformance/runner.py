"""Run one ONNX backend test case through the public API and compare with its expected outputs.

The model goes through ``popart.InferenceSession`` exactly as a user's would: ``DataFlow(1, all
outputs anchored "All")``, a CPU device, ``prepareDevice()``, ``PyStepIO`` with
``initAnchorArrays()``. Two adaptations, both part of the backend's documented contract:

- The simulated IPU has static shapes, so inputs an op reads at compile time (axes, shapes,
  sizes: ``OpDefinition.Input.constant`` in ``getSupportedOperationsDefinition``) must be
  constants. A case that feeds such a slot from a graph input, directly or through ops that
  compute the slot's value, gets that input bound to its test value as an initializer (only
  when every data set gives it the same value).
- Graph inputs without a complete static shape get it from the test data through
  ``InputShapeInfo``, as a user would.

The comparison is onnx's backend runner's: same shape, same dtype, ``assert_allclose`` at the
case's rtol / atol (1e-3 / 1e-7), exact for strings.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

import popart_backend as popart

from .cases import Case

_DEFINITIONS: dict | None = None
_VERSIONS: dict[tuple[str, str], list[int]] = {}


def _resolved_definition(domain: str, op_type: str, opset: int):
    """The OpDefinition a node resolves to: the highest supported version <= the opset."""
    global _DEFINITIONS
    if _DEFINITIONS is None:
        _DEFINITIONS = popart.getSupportedOperationsDefinition(True)
        for op in _DEFINITIONS:
            _VERSIONS.setdefault((op.domain, op.type), []).append(op.version)
    domain = domain or "ai.onnx"
    versions = [v for v in _VERSIONS.get((domain, op_type), ()) if v <= opset]
    if not versions:
        return None
    return _DEFINITIONS[popart.OperatorIdentifier(domain, op_type, max(versions))]


# Ops whose outputs depend on their input's static shape only, never on its values.
_SHAPE_ONLY = {"Shape", "Size"}


def _outer_scope_reads(node: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of ``node`` read (a superset of their outer-scope reads)."""
    names = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names.update(n for n in inner.input if n)
                names.update(_outer_scope_reads(inner))
    return names


def _constant_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that an input slot the op must know at compile time depends on: directly,
    or through ops computing that slot's value (the ``_expanded`` function bodies compute
    shapes and sizes from scalar graph inputs)."""
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    graph_inputs = {i.name for i in model.graph.input}
    needed = set()
    for node in model.graph.node:
        definition = _resolved_definition(node.domain, node.op_type,
                                          opsets.get(node.domain or "ai.onnx", 1))
        if definition is None:
            continue
        for slot, name in enumerate(node.input):
            if name and slot < len(definition.inputs) and definition.inputs[slot].constant:
                needed.add(name)
        carried = len(node.input) - 2
        if node.op_type == "Loop" and (_value_inputs(model) & set(node.input[2:])
                                       or len(node.output) > carried):
            # A Loop carrying a sequence / optional is unrolled at compile time, and one with
            # scan outputs stacks a number of iterations known at compile time (static
            # shapes): its trip count and condition are compile-time values.
            needed.update(n for n in node.input[:2] if n)
    # A value needed at compile time needs every value it is computed from, including the
    # outer-scope values an If / Loop / Scan body reads.
    changed = True
    while changed:
        changed = False
        for node in model.graph.node:
            if node.op_type in _SHAPE_ONLY or not needed.intersection(node.output):
                continue
            for name in [*node.input, *_outer_scope_reads(node)]:
                if name and name not in needed:
                    needed.add(name)
                    changed = True
    return needed & graph_inputs


def _value_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that are sequences or optionals, not tensors."""
    return {i.name for i in model.graph.input if not i.type.HasField("tensor_type")}


def _is_static(value_info: onnx.ValueInfoProto) -> bool:
    ttype = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type") or not ttype.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in ttype.shape.dim)


def prepare_model(case: Case) -> tuple[bytes, list[str], set[str], popart.InputShapeInfo]:
    """The model bytes to import, the names the test data feeds (in order), those bound as
    initializers, and the InputShapeInfo to give."""
    model = onnx.load_from_string(case.model)
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    # Data-set values by input name; test data lists the non-initializer inputs in order.
    values = {vi.name: [ds[0][k] for ds in case.data_sets]
              for k, vi in enumerate(graph_inputs) if all(k < len(ds[0]) for ds in case.data_sets)}
    bind = set()
    for name in _constant_inputs(model):
        vals = values.get(name)
        if vals and all(isinstance(v, (np.ndarray, np.generic)) for v in vals) and all(
                np.array_equal(v, vals[0]) for v in vals[1:]):
            bind.add(name)
    if bind:
        for name in sorted(bind):
            value = np.asarray(values[name][0])
            model.graph.initializer.append(numpy_helper.from_array(value, name))
        case_model = model.SerializeToString()
    else:
        case_model = case.model
    fed = [vi.name for vi in graph_inputs]
    shape_info = popart.InputShapeInfo()
    for vi in graph_inputs:
        if vi.name in bind or _is_static(vi) or vi.name not in values:
            continue
        value = values[vi.name][0]
        if isinstance(value, (np.ndarray, np.generic)):
            shape_info.add(vi.name, popart.TensorInfo(np.asarray(value)))
        elif value is None or isinstance(value, list):  # optional / sequence inputs
            shape_info.add(vi.name, None if value is None else [
                popart.TensorInfo(np.asarray(v)) for v in value])
    return case_model, fed, bind, shape_info


def assert_similar(name: str, actual: np.ndarray, expected, rtol: float, atol: float) -> None:
    """onnx's backend comparison: shape, dtype, then allclose (exact for strings)."""
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (
        f"output '{name}': shape {list(actual.shape)} != expected {list(expected.shape)}")
    if expected.dtype == object:
        np.testing.assert_array_equal(actual, expected, err_msg=f"output '{name}'")
        return
    assert actual.dtype == expected.dtype, (
        f"output '{name}': dtype {actual.dtype} != expected {expected.dtype}")
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol,
                               err_msg=f"output '{name}'")


def run_case(case: Case) -> None:
    """Import, compile and run ``case``; raise AssertionError / popart errors on a mismatch."""
    model_bytes, fed, bound, shape_info = prepare_model(case)
    outputs = [o.name for o in onnx.load_from_string(case.model).graph.output]
    data_flow = popart.DataFlow(1, {o: popart.AnchorReturnType("All") for o in outputs})
    device = popart.DeviceManager().createCpuDevice()
    session = popart.InferenceSession(model_bytes, data_flow, device, inputShapeInfo=shape_info,
                                      userOptions=popart.SessionOptions())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    for inputs, expected in case.data_sets:
        feeds = {name: _host_value(value) for name, value in zip(fed, inputs) if name not in bound}
        session.run(popart.PyStepIO(feeds, anchors))
        assert len(expected) == len(outputs), (
            f"the case gives {len(expected)} expected outputs for {len(outputs)} graph outputs")
        for name, want in zip(outputs, expected):
            _assert_value(name, anchors[name], want, case.rtol, case.atol)


def _host_value(value):
    """Test data as fed: arrays, lists of arrays (sequences) and None (empty optionals)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [np.asarray(v) for v in value]
    return np.asarray(value)


def _assert_value(name: str, actual, expected, rtol: float, atol: float) -> None:
    """``assert_similar`` element by element for sequence (list) and optional (None) outputs."""
    if expected is None or actual is None:
        assert actual is None and expected is None, f"output '{name}': {actual!r} != {expected!r}"
        return
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (
            f"output '{name}': expected a sequence of {len(expected)}, got {actual!r}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_similar(f"{name}[{i}]", a, e, rtol, atol)
        return
    assert_similar(name, actual, expected, rtol, atol)
