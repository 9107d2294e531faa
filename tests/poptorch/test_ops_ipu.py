"""IPU ops inside forward (P59, P62): dynamic_slice/update, serializedMatMul,
recomputationCheckpoint, IO overlap, ctc_beam_search_decoder, fps/nearest (against numpy),
NameScope, Attribute, MultiConv, CPU and ipu_print_tensor, each against eager torch or numpy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.device.planner import planner_plan
import poptorch_lite as poptorch
from poptorch_lite.testing import assert_allclose

from .training_helpers import compare_training


def _nodes(wrapper):
    return list(wrapper._active.traced.proto.graph.node)


def _attrs(node):
    return {a.name: a for a in node.attribute}


# --- dynamic_slice / dynamic_update -------------------------------------------------------------


class SliceModel(torch.nn.Module):
    def __init__(self, step=1):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(8, 3))
        self.step = step

    def forward(self, x, start, target):
        window = poptorch.dynamic_slice(self.w * x, 0, start, 3, self.step)
        updated = poptorch.dynamic_update(self.w, window * 2, 0, start + 1, 3)
        out = updated.sum(1)
        return out, torch.nn.functional.mse_loss(out, target)


def _slice_reference(w, x, start, step, target):
    """The same model with plain Python indexing (start clamped so the window fits)."""
    first = min(max(start, 0), 8 - (2 * step + 1))
    window = (w * x)[first:first + 2 * step + 1:step]
    first_update = min(max(start + 1, 0), 8 - 3)
    updated = torch.cat([w[:first_update], window * 2, w[first_update + 3:]])
    return updated.sum(1), torch.nn.functional.mse_loss(updated.sum(1), target)


@pytest.mark.parametrize("step", [1, 2])
def test_dynamic_slice_and_update_match_indexing_forward_and_grad(step):
    model = SliceModel(step)
    x, target = torch.randn(8, 3), torch.randn(8)
    wrapper = poptorch.inferenceModel(model)
    for start in (0, 2, 7):  # 7: the windows are moved back to fit
        index = torch.tensor([start], dtype=torch.int32)
        expected = _slice_reference(model.w.detach(), x, start, step, target)
        assert_allclose(actual=wrapper(x, index, target), expected=expected)
    assert {"DynamicSlice", "DynamicUpdate"} <= {n.op_type for n in _nodes(wrapper)}
    # gradients: eager autograd of the custom ops against plain indexing, and the IPU against
    # the eager model
    w = model.w.detach().clone().requires_grad_()
    _slice_reference(w, x, 3, step, target)[1].backward()
    mine = model.w.detach().clone().requires_grad_()
    model_copy = SliceModel(step)
    model_copy.w = torch.nn.Parameter(mine)
    model_copy(x, torch.tensor([3]), target)[1].backward()
    assert_allclose(actual=model_copy.w.grad, expected=w.grad)
    batches = [(x, torch.tensor([s], dtype=torch.int32), target) for s in (1, 4)]
    compare_training(SliceModel(step), lambda p: torch.optim.SGD(p, lr=0.1), batches)


def test_dynamic_slice_errors():
    x = torch.zeros(4, 5)
    with pytest.raises(poptorch.Error, match="size must be a Python int"):
        poptorch.dynamic_slice(x, 0, torch.tensor([0]), 2.0, 1)
    with pytest.raises(poptorch.Error, match="dim must be a Python int"):
        poptorch.dynamic_slice(x, torch.tensor(0), torch.tensor([0]), 2, 1)
    with pytest.raises(poptorch.Error, match="spans 7 elements"):
        poptorch.dynamic_slice(x, 0, torch.tensor([0]), 4, 2)
    with pytest.raises(poptorch.Error, match="start must be a one-element integer"):
        poptorch.dynamic_slice(x, 0, 1, 2, 1)
    with pytest.raises(poptorch.Error, match="src must be float32"):
        poptorch.dynamic_update(x, torch.zeros(3, 5), 0, torch.tensor([0]), 2)


# --- serializedMatMul / recomputationCheckpoint -------------------------------------------------


class MatMulModel(torch.nn.Module):
    def __init__(self, mode, factor, checkpoint=False):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 6))
        self.mode, self.factor, self.checkpoint = mode, factor, checkpoint

    def forward(self, x, target):
        h = poptorch.serializedMatMul(x, self.w, self.mode, self.factor, True)
        if self.checkpoint:
            h = poptorch.recomputationCheckpoint(torch.tanh(h))
        out = torch.tanh(h)
        return out, torch.nn.functional.mse_loss(out, target)


def _matmul_batches():
    generator = torch.Generator().manual_seed(3)
    return [(torch.randn(2, 4, generator=generator), torch.randn(2, 6, generator=generator))
            for _ in range(2)]


@pytest.mark.parametrize("mode,factor", [(poptorch.MatMulSerializationMode.ReducingDim, 2),
                                         (poptorch.MatMulSerializationMode.OutputChannels, 3)])
def test_serialized_matmul_numbers_gradient_and_annotations(mode, factor):
    wrapper, _, _ = compare_training(MatMulModel(mode, factor),
                                     lambda p: torch.optim.SGD(p, lr=0.1), _matmul_batches())
    matmul = next(n for n in _nodes(wrapper) if n.op_type == "MatMul")
    attrs = _attrs(matmul)
    assert attrs["__serialize_matmul_mode"].s.decode() == mode.value
    assert attrs["__serialize_matmul_factor"].i == factor
    assert attrs["__serialize_matmul_precision"].i == 1


def _planner_temporaries(wrapper) -> dict[str, int]:
    """Planner temporary bytes per op name in the backend's device model."""
    memory = wrapper._active.session.getReport().model.memory.ipus[0]
    return {t.id: t.num_bytes for t in memory.tensors if t.category == "planner temporaries"}


@pytest.mark.parametrize("mode,factor", [(poptorch.MatMulSerializationMode.InputChannels, 4),
                                         (poptorch.MatMulSerializationMode.OutputChannels, 3)])
def test_serialized_matmul_divides_the_partials_and_adds_syncs(mode, factor):
    """The serialised matmul's partials buffer (4-byte partials per output element) is split
    in ``factor`` slices, each paying one sync; the numbers are the plain matmul's."""
    x, target = torch.randn(8, 4), torch.randn(8, 6)
    plain_model = MatMulModel(poptorch.MatMulSerializationMode.Disabled, 0).eval()
    plain = poptorch.inferenceModel(plain_model)
    serial = poptorch.inferenceModel(MatMulModel(mode, factor).eval())
    assert_allclose(actual=serial(x, target), expected=plain(x, target))
    assert_allclose(actual=serial(x, target)[0], expected=plain_model(x, target)[0])
    # Every matmul holds its plan's temporaries (device/planner.py); the serialised one a
    # factor-th of the plain one's, slice by slice.
    [plain_bytes] = _planner_temporaries(plain).values()
    assert list(_planner_temporaries(serial).values()) == [-(-plain_bytes // factor)]
    plain_model_report = plain._active.session.getReport().model
    serial_report = serial._active.session.getReport().model
    assert (serial_report.cycles.step_cycles - plain_model_report.cycles.step_cycles
            == (factor - 1) * serial_report.spec.sync_latency_cycles)


def test_serialized_matmul_errors():
    a, b = torch.zeros(2, 4), torch.zeros(4, 6)
    with pytest.raises(ValueError, match="MatMulSerializationMode"):
        poptorch.serializedMatMul(a, b, "reducing_dim", 2)
    with pytest.raises(poptorch.Error, match="divide the ReducingDim dimension"):
        poptorch.serializedMatMul(a, b, poptorch.MatMulSerializationMode.ReducingDim, 3)
    plain = poptorch.serializedMatMul(a + 1, b + 2, poptorch.MatMulSerializationMode.Disabled)
    assert_allclose(actual=plain, expected=(a + 1) @ (b + 2))


def test_recomputation_checkpoint_keeps_numbers_and_marks_the_node():
    options = poptorch.Options()
    # RecomputeAll: every forward op recomputes except the checkpoints
    options._Popart.set("autoRecomputation", popart.RecomputationType.RecomputeAll)
    wrapper, _, _ = compare_training(
        MatMulModel(poptorch.MatMulSerializationMode.Disabled, 0, checkpoint=True),
        lambda p: torch.optim.SGD(p, lr=0.1), _matmul_batches(), options=options)
    nop = next(n for n in _nodes(wrapper) if n.op_type == "Nop")
    assert _attrs(nop)["__recompute_output_in_backward_pass"].i == 1  # Checkpoint
    with pytest.raises(ValueError, match="only tensors"):
        poptorch.recomputationCheckpoint(torch.ones(1), 2)
    a, b = torch.ones(1), torch.zeros(2)
    first, second = poptorch.recomputationCheckpoint(a, b)
    assert torch.equal(first, a) and torch.equal(second, b)


def test_set_overlap_checks_its_mode_and_returns_the_tensors():
    x = torch.ones(2)
    assert poptorch.set_overlap_for_input(x, poptorch.OverlapMode.NoOverlap) is x
    assert poptorch.set_overlap_for_output(  # eager on CPU: returned as they are
        [x], poptorch.OverlapMode.OverlapDeviceIterationLoop)[0] is x
    with pytest.raises(ValueError, match="OverlapMode"):
        poptorch.set_overlap_for_input(x, "overlap")


class _Streamed(torch.nn.Module):
    """Large inputs and outputs and enough compute per iteration to hide a transfer behind."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.w = torch.nn.Parameter(torch.eye(1024) * 0.5)

    def forward(self, x):
        if self.mode is not None:
            x = poptorch.set_overlap_for_input(x, self.mode)
        for _ in range(4):
            x = x @ self.w
        return x if self.mode is None else poptorch.set_overlap_for_output(x, self.mode)


def _streamed_cycles(mode, io_tiles=32):
    opts = poptorch.Options().deviceIterations(8).logCycleCount(True)
    if io_tiles:
        opts.TensorLocations.numIOTiles(io_tiles)
    wrapper = poptorch.inferenceModel(_Streamed(mode), opts)
    x = torch.randn(8 * 64, 1024)
    assert_allclose(actual=wrapper(x), expected=x / 16)
    cycles = wrapper.cycleCount()
    wrapper.destroy()
    return cycles


def test_set_overlap_streams_through_io_tiles_and_hides_transfers():
    """P62: overlapped IO moves the streams to the IO tiles and hides all but two transfers
    of each per step behind compute (device/io_overlap.py), so a step of 8 iterations gets
    cheaper; inference has no accumulation loop, so both overlap modes are the same."""
    plain = _streamed_cycles(None)
    no_overlap = _streamed_cycles(poptorch.OverlapMode.NoOverlap)
    device_loop = _streamed_cycles(poptorch.OverlapMode.OverlapDeviceIterationLoop)
    accumulation_loop = _streamed_cycles(poptorch.OverlapMode.OverlapAccumulationLoop)
    assert no_overlap == plain
    assert device_loop < plain
    assert accumulation_loop == device_loop
    with pytest.raises(poptorch.Error, match=r"numIOTiles\(32\)"):
        _streamed_cycles(poptorch.OverlapMode.OverlapDeviceIterationLoop, io_tiles=0)


# --- ctc_beam_search_decoder ----------------------------------------------------------------


def _exact_label_probs(log_probs: np.ndarray, blank: int):
    """Every label sequence's probability by enumerating all alignments (tiny T and C)."""
    t, c = log_probs.shape
    totals: dict = {}
    for path in itertools.product(range(c), repeat=t):
        labels, previous = [], None
        for symbol in path:
            if symbol != previous and symbol != blank:
                labels.append(symbol)
            previous = symbol
        p = math.exp(sum(log_probs[i, s] for i, s in enumerate(path)))
        totals[tuple(labels)] = totals.get(tuple(labels), 0.0) + p
    return sorted(totals.items(), key=lambda kv: -kv[1])


def test_ctc_beam_search_decoder_matches_exhaustive_search():
    class Decoder(torch.nn.Module):
        def forward(self, probs, lengths):
            return poptorch.ctc_beam_search_decoder(probs, lengths, blank=0, beam_width=50,
                                                    top_paths=2)

    generator = torch.Generator().manual_seed(4)
    probs = torch.log_softmax(torch.randn(4, 2, 3, generator=generator), -1)  # [T, N, C]
    lengths = torch.tensor([4, 3], dtype=torch.int32)
    scores, path_lengths, paths = poptorch.inferenceModel(Decoder())(probs, lengths)
    for b in range(2):
        expected = _exact_label_probs(probs[:lengths[b], b].double().numpy(), blank=0)
        for j in range(2):
            labels, p = expected[j]
            assert_allclose(actual=scores[b, j], expected=torch.tensor(math.log(p)), rtol=1e-5,
                            atol=1e-5)
            assert int(path_lengths[b, j]) == len(labels)
            assert paths[b, j, :len(labels)].tolist() == list(labels)
            assert not paths[b, j, len(labels):].any()
    eager = poptorch.ctc_beam_search_decoder(probs, lengths, 0, 50, 2)
    for actual, expected in zip(eager, (scores, path_lengths, paths)):
        assert_allclose(actual=actual, expected=expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(poptorch.Error, match="top_paths <= beam_width"):
        poptorch.ctc_beam_search_decoder(probs, lengths, 0, 1, 2)


def _numpy_fps(points, ptr, ratio):
    """Farthest point sampling written plainly in numpy (the reference)."""
    out = []
    for start, end in zip(ptr, ptr[1:]):
        seg = points[start:end].astype(np.float64)
        picks = [0]
        while len(picks) < math.ceil(ratio * (end - start)):
            d = np.min([((seg - seg[p]) ** 2).sum(1) for p in picks], axis=0)
            picks.append(int(np.argmax(d)))
        out += [start + p for p in picks]
    return np.array(out)


def _numpy_nearest(x, y, bx, by):
    out = []
    for point, b in zip(x, bx):
        candidates = [j for j in range(len(y)) if by[j] == b]
        d = [((point - y[j]) ** 2).sum() for j in candidates]
        out.append(candidates[int(np.argmin(d))])
    return np.array(out)


def test_fps_and_nearest_match_numpy_on_cpu_and_ipu():
    """P62: torch_cluster-style fps / nearest, run on the IPU as host callbacks."""
    generator = torch.Generator().manual_seed(3)
    points = torch.randn(13, 3, generator=generator)
    ptr = [0, 6, 13]
    centres = torch.randn(5, 3, generator=generator)
    bx = torch.tensor([0] * 6 + [1] * 7)
    by = torch.tensor([0, 0, 1, 1, 1])

    class Model(torch.nn.Module):
        def forward(self, src, c, batch_x, batch_y):
            picked = poptorch.fps(src, ptr, ratio=0.5)
            return (picked, poptorch.nearest(src, c, batch_x, batch_y),
                    poptorch.nearest(src, c), src[picked.long()] * 2)

    expected_fps = _numpy_fps(points.numpy(), ptr, 0.5)
    expected_near = _numpy_nearest(points.numpy(), centres.numpy(), bx.numpy(), by.numpy())
    expected_plain = _numpy_nearest(points.numpy(), centres.numpy(), [0] * 13, [0] * 5)
    assert len(expected_fps) == 3 + 4
    eager = Model()(points, centres, bx, by)
    assert eager[0].tolist() == expected_fps.tolist()
    assert eager[1].tolist() == expected_near.tolist()
    wrapper = poptorch.inferenceModel(Model())
    picked, near, plain, gathered = wrapper(points, centres, bx, by)
    assert picked.tolist() == expected_fps.tolist()
    assert near.tolist() == expected_near.tolist()
    assert plain.tolist() == expected_plain.tolist()
    assert_allclose(actual=gathered, expected=points[expected_fps] * 2)
    # Data the host callback sees at run time, not the trace's: new points, new picks.
    moved = points.flip(0).contiguous()
    assert wrapper(moved, centres, bx, by)[0].tolist() == _numpy_fps(moved.numpy(), ptr,
                                                                    0.5).tolist()
    wrapper.destroy()


def test_fps_and_nearest_check_their_arguments():
    with pytest.raises(poptorch.Error, match="ptr must rise strictly from 0"):
        poptorch.fps(torch.zeros(4, 3), [0, 5])
    with pytest.raises(poptorch.Error, match="ratio must be a number"):
        poptorch.fps(torch.zeros(4, 3), [0, 4], ratio=0.0)
    with pytest.raises(poptorch.Error, match="same point size"):
        poptorch.nearest(torch.zeros(4, 3), torch.zeros(2, 2))
    with pytest.raises(poptorch.Error, match="both batch_x and batch_y"):
        poptorch.nearest(torch.zeros(4, 3), torch.zeros(2, 3), torch.zeros(4, dtype=torch.long))
    picks = poptorch.fps(torch.randn(10, 2), torch.tensor([0, 10]), random_start=True)
    assert picks.dtype == torch.int64 and len(set(picks.tolist())) == 5


def test_fps_random_start_on_the_ipu_says_which_generator_it_uses(caplog, monkeypatch):
    """The host callback draws from torch's generator, which Options.randomSeed does not
    seed: logged once, and torch.manual_seed makes the picks repeat."""
    monkeypatch.setattr(poptorch.ops.cluster, "_warned_random_start", False)
    points = torch.randn(12, 2, generator=torch.Generator().manual_seed(1))

    class Model(torch.nn.Module):
        def forward(self, src):
            return poptorch.fps(src, [0, 12], ratio=0.5, random_start=True)

    wrapper = poptorch.inferenceModel(Model())
    with caplog.at_level("WARNING", logger="poptorch_lite"):
        wrapper.compile(points)  # tracing runs the op once on the CPU, drawing too
        torch.manual_seed(5)
        first = wrapper(points).tolist()
        torch.manual_seed(5)
        again = wrapper(points).tolist()
    assert first == again
    warnings = [r for r in caplog.records if "random_start" in r.getMessage()]
    assert len(warnings) == 1 and "Options.randomSeed" in warnings[0].getMessage()
    wrapper.destroy()


# --- NameScope / Attribute / MultiConv ----------------------------------------------------------


class ScopedConvs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.b = torch.nn.Conv2d(2, 3, 1)

    def forward(self, x):
        with poptorch.NameScope("outer"), poptorch.NameScope("inner"):
            y = torch.relu(x)
        with poptorch.Attribute(__outline={"layer": "convs"}):
            with poptorch.MultiConv().availableMemoryProportions([0.2, 0.5]).partialsTypes(
                    torch.half).planType(poptorch.MultiConvPlanType.Serial):
                p = self.a(y)
                q = self.b(y)
        return p + q


def test_scopes_name_and_annotate_nodes_and_keep_numbers():
    model = ScopedConvs().eval()
    x = torch.randn(1, 2, 5, 5)
    wrapper = poptorch.inferenceModel(model)
    assert_allclose(actual=wrapper(x), expected=model(x))
    nodes = _nodes(wrapper)
    relu = next(n for n in nodes if n.op_type == "Relu")
    assert relu.name.startswith("outer/inner/")
    convs = [n for n in nodes if n.op_type == "Conv"]
    assert [_attrs(c)["__available_memory"].f for c in convs] == pytest.approx([0.2, 0.5])
    assert all(_attrs(c)["__partials_type"].s == b"half" for c in convs)
    assert all(_attrs(c)["__multiconv_plan_type"].s == b"serial" for c in convs)
    assert all(list(_attrs(c)["__outline"].strings) == [b"layer", b"convs"] for c in convs)
    assert "__outline" not in _attrs(relu)
    # The backend plans each convolution with its own proportion: its temporaries stay within
    # that proportion of the memory of the tiles its plan uses (device/planner.py).
    ops = [op for op in wrapper._active.session.getIr().main.ops.values()
           if op.op_type == "Conv"]
    assert sorted(op.settings.available_memory_proportion for op in ops) == pytest.approx(
        [0.2, 0.5])
    temporaries = _planner_temporaries(wrapper)
    assert len(temporaries) == 2
    model = wrapper._active.session.getReport().model
    for op in ops:
        plan = planner_plan(op, model.spec)
        assert 0 < plan.temporary_bytes <= (op.settings.available_memory_proportion
                                             * model.spec.tile_bytes * plan.tiles_used)
    assert sorted(temporaries.values()) == sorted(planner_plan(op, model.spec).temporary_bytes
                                                  for op in ops)


def test_scope_argument_errors():
    with pytest.raises(ValueError, match="NameScope"):
        poptorch.NameScope("a/b")
    with pytest.raises(ValueError, match="planType"):
        poptorch.MultiConv().planType("parallel")
    with pytest.raises(ValueError, match="availableMemoryProportions"):
        poptorch.MultiConv().availableMemoryProportions(1.5)
    with pytest.raises(ValueError, match="Attribute"):
        poptorch.Attribute()


# --- CPU host callbacks and ipu_print_tensor ----------------------------------------------------


def test_cpu_op_runs_on_the_host_mid_graph():
    calls = []

    def host(a, b):
        calls.append(a.shape)
        return torch.from_numpy(np.sort(a.numpy(), axis=1)) + b, a.sum(1)

    callback = poptorch.CPU(host, "SortOnHost")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            sorted_plus, total = callback(self.lin(x), x)
            return torch.relu(sorted_plus) * 2, total

    model = Model().eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model(x)
    calls.clear()
    wrapper = poptorch.inferenceModel(model)
    assert_allclose(actual=wrapper(x), expected=expected)
    assert any(n.domain == "poptorch_lite.cpu" for n in _nodes(wrapper))
    before = len(calls)
    wrapper(x)
    assert len(calls) == before + 1  # the host function ran during the device run
    with pytest.raises(poptorch.Error, match="callable"):
        poptorch.CPU(3, "x")


def test_ipu_print_tensor_prints_value_and_gradient(capsys):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))

        def forward(self, x):
            y = poptorch.ipu_print_tensor(self.w * x, "wx")
            return y, poptorch.identity_loss(y.sum(), "sum")

    model = Model()
    wrapper = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0))
    capsys.readouterr()
    wrapper(torch.tensor([[3.0, 4.0]]))
    out = capsys.readouterr().out
    assert "wx: [[3.0, 8.0]]" in out
    assert "Gradient___wx: [[1.0, 1.0]]" in out
    # Eager on CPU, the gradient is printed under the same title the device uses.
    model(torch.tensor([[3.0, 4.0]]))[1].backward()
    eager = capsys.readouterr().out
    assert "Gradient___wx tensor([[1., 1.]])" in eager
    with pytest.raises(ValueError, match="float_format"):
        poptorch.ipu_print_tensor(torch.ones(1), float_format="hex")


def test_set_available_memory_proportion_bounds_the_planner_temporaries():
    """Options.setAvailableMemoryProportion({"IPU0": p}) reaches each matmul of IPU 0: a lower
    proportion plans it with fewer temporary bytes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512))
    x = torch.randn(64, 512)

    def figures(proportion):
        opts = poptorch.Options()
        if proportion is not None:
            opts.setAvailableMemoryProportion({"IPU0": proportion})
        wrapper = poptorch.inferenceModel(model, opts)
        torch.testing.assert_close(wrapper(x), model(x), rtol=1e-5, atol=1e-5)
        session = wrapper._active.session
        temporaries = session._device_model.memory.ipu(0).categories.get(
            "planner temporaries", 0)
        wrapper.destroy()
        return temporaries

    default_bytes = figures(None)
    assert figures(0.01) < default_bytes
    assert figures(0.6) == default_bytes  # Poplar's default proportion


def _planner_temporary_total(wrapper) -> int:
    """All planner temporary bytes of IPU 0 (``_planner_temporaries`` gives them per op)."""
    return sum(_planner_temporaries(wrapper).values())


class _MarkedLinear(torch.nn.Module):
    """One Linear whose output is marked with set_available_memory (P60)."""

    def __init__(self, proportion):
        super().__init__()
        torch.manual_seed(1)
        self.linear = torch.nn.Linear(512, 1024)
        self.proportion = proportion

    def forward(self, x):
        y = self.linear(x)
        if self.proportion is not None:
            y = poptorch.set_available_memory(y, self.proportion)
        return torch.relu(y)


class _WithLoss(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return poptorch.identity_loss(self.net(x), reduction="sum")


def test_set_available_memory_reaches_the_producing_matmul():
    """set_available_memory(t, p) gives the matmul producing t (through the Linear's bias add)
    the proportion p: its temporaries equal those of setAvailableMemoryProportion(p) for the
    IPU, below the default's; numbers equal eager."""
    x = torch.randn(64, 512)
    figures = {}
    for key, proportion, per_ipu in (("default", None, None), ("marked", 0.01, None),
                                     ("per_ipu", None, 0.01)):
        model = _MarkedLinear(proportion)
        opts = poptorch.Options()
        if per_ipu is not None:
            opts.setAvailableMemoryProportion({"IPU0": per_ipu})
        wrapper = poptorch.inferenceModel(model, opts)
        torch.testing.assert_close(wrapper(x), model(x), rtol=1e-5, atol=1e-5)
        figures[key] = _planner_temporary_total(wrapper)
        wrapper.destroy()
    assert figures["marked"] < figures["default"]
    assert figures["marked"] == figures["per_ipu"]


def test_set_available_memory_trains_like_eager():
    """The mark is an identity for the gradient too: one SGD step equals eager's."""
    model = _MarkedLinear(0.3)
    reference = _MarkedLinear(None)
    x = torch.randn(8, 512)
    wrapper = poptorch.trainingModel(_WithLoss(model), optimizer=poptorch.optim.SGD(
        model.parameters(), lr=0.01))
    wrapper(x)
    wrapper.copyWeightsToHost()
    reference(x).sum().backward()
    torch.optim.SGD(reference.parameters(), lr=0.01).step()
    torch.testing.assert_close(model.linear.weight, reference.linear.weight, rtol=1e-4,
                               atol=1e-5)
    wrapper.destroy()


def test_set_available_memory_on_another_op_is_logged_by_the_backend(caplog):
    """On a producer without planner temporaries (a ReLU) the hint has no effect: said once."""
    class Net(torch.nn.Module):
        def forward(self, x):
            return poptorch.set_available_memory(torch.relu(x), 0.2) * 2

    x = torch.randn(4, 3)
    with caplog.at_level("WARNING"):
        wrapper = poptorch.inferenceModel(Net())
        torch.testing.assert_close(wrapper(x), torch.relu(x) * 2)
        wrapper.destroy()
    assert any("__available_memory has no effect" in r.getMessage() for r in caplog.records)


def test_set_available_memory_checks_its_arguments():
    with pytest.raises(poptorch.Error, match="expected a tensor"):
        poptorch.set_available_memory([1.0], 0.5)
    with pytest.raises(ValueError, match=r"\(0, 1\], got 1.5"):
        poptorch.set_available_memory(torch.ones(2), 1.5)
    torch.testing.assert_close(poptorch.set_available_memory(torch.ones(2), 0.5),
                               torch.ones(2))


def test_zero_proportion_is_refused_where_it_is_given():
    """PopART refuses a proportion of 0 (no temporary memory): both hints say so when called,
    not later as an error about an internal ``__available_memory`` annotation."""
    with pytest.raises(ValueError, match=r"set_available_memory: .*\(0, 1\], got 0.0.*0.01"):
        poptorch.set_available_memory(torch.ones(2), 0.0)
    with pytest.raises(ValueError, match=r"IPU0 = 0 is outside \(0, 1\].*0.01"):
        poptorch.Options().setAvailableMemoryProportion({"IPU0": 0})


def test_set_available_memory_adds_no_op():
    """The mark's Nop is bypassed once its proportion is on the matmul: the backend IR has the
    same ops as without the hint (the Nop would cost an op and split fusions)."""
    x = torch.randn(4, 512)
    kinds = {}
    for proportion in (None, 0.3):
        model = _MarkedLinear(proportion)
        wrapper = poptorch.inferenceModel(model)
        torch.testing.assert_close(wrapper(x), model(x), rtol=1e-5, atol=1e-5)
        ops = wrapper._active.session.getIr().main.ops.values()
        kinds[proportion] = sorted(op.op_type for op in ops)
        amp = [op.settings.available_memory_proportion for op in ops if op.uses_amp]
        assert amp == [pytest.approx(proportion)] if proportion else amp == [None]
        wrapper.destroy()
    assert kinds[0.3] == kinds[None]
    assert "Nop" not in kinds[0.3]


def test_set_available_memory_inside_a_for_loop_body():
    """A mark inside a for_loop body reaches the matmul of that body (not logged as an unknown
    annotation), and the loop computes as eager."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.lin = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x):
            def body(h):
                return torch.tanh(poptorch.set_available_memory(self.lin(h), 0.2))
            return poptorch.for_loop(3, body, [x])[0]

    model, x = Net().eval(), torch.randn(2, 8)
    wrapper = poptorch.inferenceModel(model)
    torch.testing.assert_close(wrapper(x), model(x), rtol=1e-5, atol=1e-5)
    (loop,) = [op for op in wrapper._active.session.getIr().main.ops.values()
               if op.op_type == "Loop"]
    body = loop.attrs.body.graph.ops.values()
    assert [op.settings.available_memory_proportion for op in body if op.uses_amp] == [
        pytest.approx(0.2)]
    assert not any(op.op_type == "Nop" for op in body)
    wrapper.destroy()
