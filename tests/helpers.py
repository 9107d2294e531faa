"""Shared test helpers: build one-op ONNX models, run them here and in onnxruntime, compare."""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

import popart_backend as popart
from popart_backend.device.plan import ExecutionPlan, to_torch
from popart_backend.dtypes import DataType, to_host
from popart_backend.importer.onnx_model import import_model

# STYLE.md §4: one tolerance table per dtype.
TOLERANCES = {
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float16): (1e-3, 1e-3),
    np.dtype(np.float64): (1e-7, 1e-9),
}

_rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, low=-1.0, high=1.0, seed=None) -> np.ndarray:
    """Seeded uniform random array."""
    rng = np.random.default_rng(seed) if seed is not None else _rng
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(int(low), int(high), size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) > 0.5
    return rng.uniform(low, high, size=shape).astype(dtype)


def run_popart(model: onnx.ModelProto | bytes | str, feeds: dict[str, np.ndarray],
               constant_weights: bool = True, outputs: Sequence[str] | None = None
               ) -> dict[str, np.ndarray]:
    """Import ``model`` and execute it once on the simulated device; also checks that every
    output's runtime shape and dtype equal what shape inference said."""
    ir = import_model(model, constant_weights=constant_weights)
    graph = ir.main
    names = list(outputs or graph.outputs)
    plan = ExecutionPlan(graph, keep=names)
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(np.asarray(feeds[name])))
    plan.execute()
    result = {}
    for name in names:
        tensor = graph.tensors[name]
        value = plan.get_value(name)
        # STRING values stay numpy object arrays on the device (ops/string_tensors.py).
        if isinstance(value, torch.Tensor):
            # Narrow and unsigned types live in wider torch dtypes (popart_backend/dtypes.py).
            assert value.dtype == tensor.info.dtype.torch, (
                f"'{name}': runtime storage {value.dtype} != {tensor.info.dtype.torch} of "
                f"inferred {tensor.info}")
            value = to_host(value, tensor.info.dtype)
        array = value if value is not None else np.asarray(tensor.data)
        assert tuple(array.shape) == tensor.info.shape, (
            f"'{name}': runtime shape {list(array.shape)} != inferred {tensor.info}")
        assert array.dtype == tensor.info.dtype.numpy, (
            f"'{name}': runtime dtype {array.dtype} != inferred {tensor.info}")
        result[name] = array
    return result


# The newest ai.onnx opset onnxruntime loads. Opsets 27-28 changed few ops, mostly by widening
# their type lists; a model stamped above this runs in onnxruntime at this opset, i.e. with the
# op's previous version. Tests of versions whose semantics changed pass an explicit ``ref``.
ORT_MAX_OPSET = 26


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if any(o.domain in ("", "ai.onnx") and o.version > ORT_MAX_OPSET for o in model.opset_import):
        model = copy.deepcopy(model)
        for opset in model.opset_import:
            if opset.domain in ("", "ai.onnx"):
                opset.version = min(opset.version, ORT_MAX_OPSET)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    needed = {i.name for i in session.get_inputs()}
    values = session.run(names, {k: v for k, v in feeds.items() if k in needed})
    return dict(zip(names, values))


def assert_close(actual: np.ndarray, expected: np.ndarray, name: str = "output",
                 rtol: float | None = None, atol: float | None = None) -> None:
    """Compare with the per-dtype tolerance; on failure report the worst element."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind in "biuUO" or actual.dtype == np.bool_:
        mismatch = np.argwhere(actual != expected)
        assert mismatch.size == 0, (
            f"{name}: {len(mismatch)} elements differ; first at {tuple(mismatch[0])}: "
            f"{actual[tuple(mismatch[0])]} vs {expected[tuple(mismatch[0])]}")
        return
    default_rtol, default_atol = TOLERANCES.get(actual.dtype, (1e-5, 1e-6))
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    nan_mismatch = np.isnan(a) != np.isnan(e)
    assert not nan_mismatch.any(), f"{name}: NaN positions differ at {np.argwhere(nan_mismatch)[:3]}"
    both = ~np.isnan(a)
    inf_ok = np.where(np.isinf(e) & both, a == e, True)
    assert inf_ok.all(), f"{name}: infinities differ at {np.argwhere(~inf_ok)[:3]}"
    finite = both & np.isfinite(e)
    err = np.where(finite, np.abs(a - e) - (atol + rtol * np.abs(e)), 0.0)
    if err.size and err.max() > 0:
        idx = np.unravel_index(np.argmax(err), err.shape)
        raise AssertionError(
            f"{name}: largest error at index {idx}: got {a[idx]!r}, expected {e[idx]!r} "
            f"(|diff| {abs(a[idx] - e[idx]):.3g} > atol {atol} + rtol {rtol}·|expected|)")


def _value_info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    elem = DataType.from_numpy(array.dtype).onnx
    return helper.make_tensor_value_info(name, elem, list(array.shape))


def one_op_model(op_type: str, inputs: Sequence[np.ndarray | None], attrs: dict | None = None,
                 opset: int = 18, num_outputs: int = 1, domain: str = "",
                 const_inputs: Sequence[int] = (), output_names: Sequence[str] | None = None
                 ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model with one node. ``None`` inputs are omitted optional inputs; indices in
    ``const_inputs`` become initializers (for operands that must be constant, like shapes)."""
    input_names, graph_inputs, initializers, feeds = [], [], [], {}
    for i, value in enumerate(inputs):
        if value is None:
            input_names.append("")
            continue
        name = f"in{i}"
        input_names.append(name)
        value = np.asarray(value)
        if i in const_inputs:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            graph_inputs.append(_value_info(name, value))
            feeds[name] = value
    outs = list(output_names or [f"out{i}" for i in range(num_outputs)])
    node = helper.make_node(op_type, input_names, outs, domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node], f"{op_type.lower()}_test", graph_inputs,
        [helper.make_empty_tensor_value_info(o) for o in outs], initializer=initializers)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)
    return model, feeds


def check_op(op_type: str, inputs: Sequence[np.ndarray | None], attrs: dict | None = None,
             opset: int = 18, num_outputs: int = 1, const_inputs: Sequence[int] = (),
             rtol: float | None = None, atol: float | None = None, ref=None):
    """Run a one-op model here and compare every output with onnxruntime (or ``ref(*inputs)``
    returning a list of arrays), plus inferred vs runtime shape/dtype. Returns our outputs."""
    model, feeds = one_op_model(op_type, inputs, attrs, opset, num_outputs,
                                const_inputs=const_inputs)
    ours = run_popart(model, feeds)
    if ref is None:
        expected = run_onnxruntime(model, feeds)
    else:
        values = ref(*inputs)
        values = values if isinstance(values, (list, tuple)) else [values]
        expected = {f"out{i}": np.asarray(v) for i, v in enumerate(values)}
    for name, value in expected.items():
        assert_close(ours[name], value, f"{op_type}-opset{opset} {name}", rtol, atol)
    return [ours[f"out{i}"] for i in range(num_outputs)]


def check_grad(op_type: str, inputs: Sequence[np.ndarray | None], attrs: dict | None = None,
               opset: int = 18, wrt: Sequence[int] | None = None, const_inputs: Sequence[int] = (),
               num_outputs: int = 1, domain: str = "", ref=None, rtol: float = 1e-4,
               atol: float = 1e-5, eps: float = 1e-6) -> dict[int, np.ndarray]:
    """Check the gradients our autodiff builds for one op (STYLE.md §4, item 3).

    Inputs listed in ``wrt`` (default: every float input not in ``const_inputs``) become
    weights; the backward pass is seeded with random gradients R_k of the float outputs, so the
    checked quantity is d(sum_k R_k * out_k)/d input. The reference is torch.autograd of
    ``ref(*inputs)`` (torch float64 tensors in, a tensor or list out), or central differences of
    the op's own kernel in float64. Returns our gradients by input index."""
    import torch

    from popart_backend.ir.verify import verify
    from popart_backend.transforms.autodiff import Autodiff

    if wrt is None:
        wrt = [i for i, x in enumerate(inputs) if x is not None and i not in const_inputs
               and np.asarray(x).dtype.kind == "f"]
    model, feeds = one_op_model(op_type, inputs, attrs, opset, num_outputs, domain,
                                const_inputs=set(const_inputs) | set(wrt))
    ir = import_model(model, constant_weights=False)
    graph = ir.main
    forward = [op for op in graph.ops.values() if op.op_type == op_type]
    outs = [graph.tensors.get(f"out{k}") for k in range(num_outputs)]
    rng = np.random.default_rng(1)
    seeds = {t.id: rng.uniform(-1, 1, t.info.shape).astype(t.info.dtype.numpy)
             for t in outs if t is not None and t.info.dtype.is_float}
    autodiff = Autodiff(None, output_grads=seeds)
    autodiff.run(ir)
    verify(graph)
    missing = [i for i in wrt if f"in{i}" not in autodiff.variable_grads]
    assert not missing, f"{op_type}: no gradient produced for inputs {missing}"
    grad_ids = {i: autodiff.variable_grads[f"in{i}"] for i in wrt}
    plan = ExecutionPlan(graph, keep=list(grad_ids.values()))
    for name in plan.stream_ids:
        plan.set_value(name, to_torch(np.asarray(feeds[name])))
    plan.execute()
    ours = {i: plan.get_value(gid).numpy() for i, gid in grad_ids.items()}

    def as_double(x):
        x = np.asarray(x)
        return torch.from_numpy(x.astype(np.float64) if x.dtype.kind == "f" else x.copy())

    seed_list = [torch.from_numpy(seeds[t.id].astype(np.float64)) if t is not None and t.id in seeds
                 else None for t in outs]
    if ref is not None:
        leaves = [None if x is None else as_double(x).requires_grad_(i in wrt)
                  for i, x in enumerate(inputs)]
        result = ref(*leaves)
        result = list(result) if isinstance(result, (list, tuple)) else [result]
        total = sum((r * s).sum() for r, s in zip(result, seed_list) if s is not None)
        total.backward()
        expected = {i: leaves[i].grad.numpy() for i in wrt}
    else:
        assert len(forward) == 1, f"{op_type}: expected one forward op, found {len(forward)}"
        op = forward[0]

        def objective(values):
            with torch.no_grad():
                result = op.kernel(*values)
            result = list(result) if isinstance(result, (list, tuple)) else [result]
            return float(sum((r.double() * s).sum() for r, s in zip(result, seed_list)
                             if s is not None))

        base = [None if x is None else as_double(x) for x in inputs]
        expected = {}
        for i in wrt:
            grad = np.zeros(base[i].shape)
            flat = base[i].view(-1)
            for j in range(flat.numel()):
                keep = float(flat[j])
                flat[j] = keep + eps
                up = objective(base)
                flat[j] = keep - eps
                down = objective(base)
                flat[j] = keep
                grad.reshape(-1)[j] = (up - down) / (2 * eps)
            expected[i] = grad
    for i in wrt:
        dtype = np.asarray(inputs[i]).dtype
        assert_close(ours[i], expected[i].astype(dtype), f"{op_type} d/d input {i}", rtol, atol)
    return ours


def sgd_step(model, loss: str, feeds: dict, weight: str, initial: np.ndarray, lr: float,
             options=None):
    """One ConstSGD(lr) step of a TrainingSession on the CPU device: (the weight ``weight``
    read back after the step, the session)."""
    session = popart.TrainingSession(model, popart.DataFlow(1, [loss]), loss,
                                     popart.ConstSGD(lr), popart.DeviceManager().createCpuDevice(),
                                     userOptions=options)
    session.prepareDevice()
    session.weightsFromHost()
    session.run(popart.PyStepIO(feeds, session.initAnchorArrays()))
    session.weightsToHost()
    weights = {weight: np.zeros_like(initial)}
    session.readWeights(popart.PyWeightsIO(weights))
    return weights[weight], session


__all__ = ["TensorProto", "assert_close", "check_grad", "check_op", "one_op_model", "rand",
           "run_onnxruntime", "run_popart", "sgd_step"]
