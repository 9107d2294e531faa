"""Fuzzing the model loader: mutated tiny models (byte flips of the serialized proto, mutated
dims, element types, attributes, op types and names, cycles, deep subgraphs) are loaded and run
in an InferenceSession. Whatever the mutation, the only exceptions allowed are
popart_exception subclasses: no raw onnx, numpy, torch or Python error, no hang, no blow-up.

Derandomized (the same examples on every run) and bounded to about 40 s in total. A crash
found here is kept as a tiny .onnx file in regressions/ (test_regressions.py loads them all).
``scripts/fuzz_atheris.py`` runs the same harness for longer, locally.
"""

from __future__ import annotations

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import popart_backend as popart

from .models import SEEDS, load_and_run

# The guard's limit during fuzzing: small, so a mutated size is refused fast, never allocated.
FUZZ_MAX_BYTES = str(64 << 20)

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

OP_TYPES = ["Add", "Mul", "Relu", "Reshape", "Concat", "MatMul", "Gather", "Slice", "Expand",
            "ConstantOfShape", "Tile", "Loop", "If", "Identity", "Transpose", "Split", "Where",
            "Cast", "Range", "Pad", "NotAnOp", ""]


@pytest.fixture(autouse=True)
def small_guard(monkeypatch):
    monkeypatch.setenv("POPART_SIM_MAX_BYTES", FUZZ_MAX_BYTES)


def check_only_popart_errors(model) -> None:
    """Load and run ``model``; a popart_exception is an accepted answer, anything else fails."""
    try:
        load_and_run(model)
    except popart.popart_exception:
        pass


def seed_bytes(name: str) -> bytes:
    return SEEDS[name]().SerializeToString()


# --- byte flips -------------------------------------------------------------------------------


@FUZZ
@given(name=st.sampled_from(sorted(SEEDS)),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
                      min_size=1, max_size=6))
def test_byte_flipped_models_raise_only_popart_errors(name, flips):
    data = bytearray(seed_bytes(name))
    for where, mask in flips:
        data[int(where * len(data))] ^= mask
    check_only_popart_errors(bytes(data))


# --- field mutations --------------------------------------------------------------------------

_dims = st.lists(st.one_of(st.integers(-2, 8), st.integers(2**20, 2**62)), max_size=4)


def _tensors(proto: onnx.ModelProto):
    """Initializers and tensor attributes of every graph, with the nodes and value infos."""
    graphs, tensors, infos, nodes = [proto.graph], [], [], []
    while graphs:
        g = graphs.pop()
        tensors.extend(g.initializer)
        infos.extend([*g.input, *g.output])
        for node in g.node:
            nodes.append(node)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    tensors.append(attr.t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attr.g)
    return tensors, infos, nodes


@st.composite
def mutated_models(draw) -> onnx.ModelProto:
    proto = SEEDS[draw(st.sampled_from(sorted(SEEDS)))]()
    for _ in range(draw(st.integers(1, 4))):
        tensors, infos, nodes = _tensors(proto)
        kind = draw(st.sampled_from(["dims", "dtype", "shape", "elem", "attr", "op", "input",
                                     "cycle", "drop", "opset"]))
        if kind == "dims" and tensors:
            t = draw(st.sampled_from(tensors))
            t.dims[:] = draw(_dims)
        elif kind == "dtype" and tensors:
            draw(st.sampled_from(tensors)).data_type = draw(st.integers(0, 30))
        elif kind == "shape" and infos:
            info = draw(st.sampled_from(infos))
            shape = info.type.tensor_type.shape
            del shape.dim[:]
            for d in draw(_dims):
                shape.dim.add().dim_value = d
        elif kind == "elem" and infos:
            draw(st.sampled_from(infos)).type.tensor_type.elem_type = draw(st.integers(0, 30))
        elif kind == "attr" and nodes:
            node = draw(st.sampled_from(nodes))
            ints = [a for a in node.attribute if a.type in (onnx.AttributeProto.INT,
                                                            onnx.AttributeProto.FLOAT)]
            if ints:
                attr = draw(st.sampled_from(ints))
                attr.i = draw(st.integers(-2**62, 2**62))
                attr.f = draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
            else:
                node.attribute.add(name=draw(st.sampled_from(["axis", "to", "perm", "value"])),
                                   type=onnx.AttributeProto.INT, i=draw(st.integers(-9, 9)))
        elif kind == "op" and nodes:
            draw(st.sampled_from(nodes)).op_type = draw(st.sampled_from(OP_TYPES))
        elif kind == "input" and nodes:
            node = draw(st.sampled_from(nodes))
            names = [n for other in nodes for n in (*other.input, *other.output)] + ["", "?"]
            if node.input:
                node.input[draw(st.integers(0, len(node.input) - 1))] = draw(
                    st.sampled_from(names))
            else:
                node.input.append(draw(st.sampled_from(names)))
        elif kind == "cycle" and nodes:
            node = draw(st.sampled_from(nodes))
            if node.output:
                node.input.append(node.output[0])  # a node reading its own output
        elif kind == "drop":
            where = draw(st.sampled_from(["node", "initializer", "input", "output"]))
            field = getattr(proto.graph, where)
            if len(field):
                del field[draw(st.integers(0, len(field) - 1))]
        elif kind == "opset":
            proto.opset_import[0].version = draw(st.integers(-1, 40))
    return proto


@FUZZ
@given(proto=mutated_models(), as_bytes=st.booleans())
def test_field_mutated_models_raise_only_popart_errors(proto, as_bytes):
    check_only_popart_errors(proto.SerializeToString() if as_bytes else proto)


# --- deep subgraphs ---------------------------------------------------------------------------


def nested_ifs(depth: int) -> onnx.ModelProto:
    """``depth`` Ifs, each inside the then-branch of the one before, on a data condition.
    Built in place: protobuf's copies refuse messages nested past ~100 levels."""
    info = onnx.helper.make_tensor_value_info
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [], "main", [info("x", 1, [2, 3]), info("c", onnx.TensorProto.BOOL, [])], []),
        opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    graph = model.graph
    for level in range(depth):
        graph.output.add().CopyFrom(info(f"o{level}", 1, [2, 3]))
        node = graph.node.add(op_type="If", name=f"if{level}", input=["c"], output=[f"o{level}"])
        other = node.attribute.add(name="else_branch", type=onnx.AttributeProto.GRAPH).g
        other.name = f"e{level}"
        other.node.add(op_type="Neg", name=f"neg{level}", input=["x"], output=[f"n{level}"])
        other.output.add().CopyFrom(info(f"n{level}", 1, [2, 3]))
        graph = node.attribute.add(name="then_branch", type=onnx.AttributeProto.GRAPH).g
        graph.name = f"g{level}"
    graph.node.add(op_type="Identity", name="id", input=["x"], output=[f"o{depth}"])
    graph.output.add().CopyFrom(info(f"o{depth}", 1, [2, 3]))
    return model


@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(depth=st.integers(1, 300))
def test_deep_subgraphs_raise_only_popart_errors(depth):
    check_only_popart_errors(nested_ifs(depth))


@pytest.mark.parametrize("depth", [40, 300])
def test_deep_subgraph_bytes_raise_only_popart_errors(depth):
    """Past protobuf's nesting limit the bytes do not parse: a ModelError, not a DecodeError."""
    try:
        data = nested_ifs(depth).SerializeToString()
    except Exception:  # protobuf refuses to write it: nothing to load
        pytest.skip(f"protobuf does not serialize {depth} nested subgraphs")
    check_only_popart_errors(data)

