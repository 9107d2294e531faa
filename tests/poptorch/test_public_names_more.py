"""More public names of PopTorch 3.x: custom input types (ICustomArgParser), profiling channels,
module_repr / print, the internal helpers, strategy ``stage`` look-ups, executor RNG state,
copyWeightsToHostIfNeeded, replicaGrouping, the optimizer state API, the accessor's
``__next__``, and the checks on param-group keys, int64 weights and exporter failures."""

import importlib.util
import logging
import pickle
import time
import warnings

import pytest
import torch

import poptorch_lite as poptorch


def _opts():
    return poptorch.Options().showCompilationProgressBar(False)


# --- custom input types ------------------------------------------------------------------------


class Pair:
    """A user type holding two tensors and a plain scale."""

    def __init__(self, a, b, scale):
        self.a, self.b, self.scale = a, b, scale


class PairParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct):  # noqa: N802
        yield struct.a
        yield struct.b

    def reconstruct(self, original_structure, tensor_iterator):
        return Pair(next(tensor_iterator), next(tensor_iterator), original_structure.scale)


class PairModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, pair):
        return self.fc(pair.a) * pair.scale + pair.b


@pytest.fixture
def pair_parser():
    poptorch.registerCustomArgParser(Pair, PairParser())
    yield
    poptorch.registerCustomArgParser(Pair, None)


def test_custom_arg_parser_matches_eager(pair_parser):
    torch.manual_seed(0)
    model = PairModel().eval()
    wrapper = poptorch.inferenceModel(model, _opts())
    a, b = torch.randn(4, 3), torch.randn(4, 2)
    torch.testing.assert_close(wrapper(Pair(a, b, 2.0)), model(Pair(a, b, 2.0)))
    # A changed plain field is part of the input signature: refused, as a changed shape.
    with pytest.raises(poptorch.Error, match="expected 2.0, got 3.0"):
        wrapper(Pair(a, b, 3.0))
    wrapper.destroy()
    torch.testing.assert_close(wrapper(Pair(a, b, 3.0)), model(Pair(a, b, 3.0)))


def test_custom_arg_parser_registration_errors():
    from torch.utils import _pytree as pytree

    with pytest.raises(TypeError, match="ICustomArgParser"):
        poptorch.registerCustomArgParser(Pair, object())
    with pytest.raises(ValueError, match="needs no parser"):
        poptorch.registerCustomArgParser(tuple, PairParser())
    poptorch.registerCustomArgParser(Pair, PairParser())
    assert Pair in pytree.SUPPORTED_NODES
    poptorch.registerCustomArgParser(Pair, None)
    assert Pair not in pytree.SUPPORTED_NODES


def test_geometric_parsers_log_when_missing():
    if importlib.util.find_spec("torch_geometric") is not None:
        pytest.skip("torch_geometric is installed: the parsers are registered")
    messages = _capture(poptorch.registerGeometricCustomArgParsers)
    assert any("torch_geometric is not installed" in m for m in messages)


def _capture(call, level=logging.INFO):
    """Messages the poptorch_lite logger emits during ``call()`` (it does not propagate)."""
    messages = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger("poptorch_lite")
    handler, old = Keep(level), logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level, old))
    try:
        call()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return messages


# --- profiling ---------------------------------------------------------------------------------


def test_profiling_channel_records_host_time():
    channel = poptorch.profiling.Channel("data")
    with channel.tracepoint("sleep"):
        time.sleep(0.02)
    (record,) = channel.records
    assert (record.channel, record.name) == ("data", "sleep")
    assert record.duration_s >= 0.02

    class Loader:
        def load(self, x):
            return x * 2

    loader = channel.instrument(Loader(), "load")
    assert loader.load(21) == 42
    assert [r.name for r in channel.records] == ["sleep", "Loader.load"]
    with pytest.raises(AttributeError, match="no method 'save'"):
        channel.instrument(Loader(), "save")


# --- printing and internal helpers ---------------------------------------------------------------


def test_module_repr_marks_blocks():
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert poptorch.module_repr(plain) == repr(plain)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2),
                                torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 1)))
    poptorch.BeginBlock(model[1], "B", ipu_id=1)
    text = poptorch.module_repr(model)
    marker = "  ==> BeginBlock(user_id='B', ipu_id=1)"
    assert text.count(marker) == 1
    assert text.replace(marker, "") == repr(model)


def test_print_writes_module_repr(capsys):
    model = torch.nn.Sequential(poptorch.BeginBlock(torch.nn.Linear(2, 2), "A", ipu_id=0))
    poptorch.print(model)
    assert capsys.readouterr().out == poptorch.module_repr(model) + "\n"


def test_internal_helpers():
    error = poptorch.createPoptorchError("bad thing")
    assert isinstance(error, poptorch.Error) and error.message == "bad thing"
    from poptorch_lite.internals import store_attributes

    key = store_attributes({"__outline": {"ipu": 1}})
    assert poptorch.accessAttributes(key) == {"__outline": {"ipu": 1}}
    with pytest.raises(poptorch.Error, match="no attributes"):
        poptorch.accessAttributes("nope")
    with pytest.raises(poptorch.Error, match="no compiled wrapper holds this tensor"):
        poptorch.getIpuTensorId(torch.ones(1))
    with pytest.raises(poptorch.Error, match="no file"):
        poptorch.importPoptorchMetadataFromFile("/nonexistent/model.poptorch")
    assert isinstance("x", poptorch.BlockId)


def test_get_ipu_tensor_id_names_the_backend_tensor_of_a_parameter():
    """getIpuTensorId: a compiled wrapper's parameter (tensor or name) -> its backend id,
    which the backend lists and anchorTensor reads back with the parameter's value."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    wrapper = poptorch.inferenceModel(model)
    with pytest.raises(poptorch.Error, match="no compiled wrapper"):
        poptorch.getIpuTensorId(model[0].weight)  # not compiled yet
    wrapper(torch.randn(1, 3))
    tensor_id = poptorch.getIpuTensorId(model[0].weight)
    assert tensor_id == poptorch.getIpuTensorId("0.weight")
    assert tensor_id in wrapper.getTensorNames()
    assert poptorch.getIpuTensorId(model[0].bias) != tensor_id
    wrapper.destroy()
    opts = poptorch.Options().anchorTensor("w", tensor_id)
    reader = poptorch.inferenceModel(model, opts)
    reader(torch.randn(1, 3))
    torch.testing.assert_close(reader.getAnchoredTensor("w"), model[0].weight.detach())
    reader.destroy()


# --- strategies ----------------------------------------------------------------------------------


def test_strategy_stage_lookup():
    strategy = poptorch.PipelinedExecution(poptorch.Stage("A"), poptorch.Stage("B", "C"))
    assert strategy.stage("C") is strategy.stages[1]
    assert strategy.stage("B").ipu(1)._ipu == 1
    with pytest.raises(poptorch.Error, match="no stage holds block 'D'"):
        strategy.stage("D")
    with pytest.raises(poptorch.Error, match="automatically"):
        poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement).stage("A")
    phase = poptorch.Phase(poptorch.Stage("A"), poptorch.Stage("B"))
    assert phase.stage(1).blocks == ["B"]
    with pytest.raises(poptorch.Error, match="2 stage"):
        phase.stage(2)
    phased = poptorch.SerialPhasedExecution(phase)
    assert phased.stage("B") is phase.stages[1]


# --- executor ------------------------------------------------------------------------------------


class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


def test_rng_state_replays_random_draws(monkeypatch):
    wrapper = poptorch.inferenceModel(Noisy(), _opts())
    x = torch.zeros(4, 3)
    with pytest.raises(poptorch.Error, match="not been compiled"):
        wrapper.rng_state  # noqa: B018
    wrapper.compile(x)
    state = wrapper.rng_state
    first, second = wrapper(x), wrapper(x)
    assert not torch.equal(first, second)
    wrapper.rng_state = state
    torch.testing.assert_close(wrapper(x), first, rtol=0, atol=0)
    # Detach keeps the state; attach restores it.
    before = wrapper.rng_state
    wrapper.detachFromDevice()
    assert wrapper.rng_state == before
    wrapper.attachToDevice()
    assert wrapper.rng_state == before
    with pytest.raises(poptorch.Error, match="list of ints"):
        wrapper.rng_state = "seed"
    # poptorchAtExit detaches the live wrappers (here only this one); a call re-attaches.
    from poptorch_lite.executor import executor

    monkeypatch.setattr(executor, "_LIVE", [wrapper])
    poptorch.poptorchAtExit()
    assert not wrapper.isAttachedToDevice()
    wrapper.rng_state = state
    torch.testing.assert_close(wrapper(x), first, rtol=0, atol=0)


def test_copy_weights_to_host_if_needed_matches_eager_sgd():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            return torch.nn.functional.mse_loss(self.inner(x), y)

    wrapped = WithLoss(model)
    wrapper = poptorch.trainingModel(wrapped, _opts(),
                                     torch.optim.SGD(wrapped.parameters(), lr=0.1))
    assert wrapper.copyWeightsToHostIfNeeded() is False  # nothing compiled yet
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    wrapper(x, y)
    assert wrapper.copyWeightsToHostIfNeeded() is True
    assert wrapper.copyWeightsToHostIfNeeded() is False
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    optimizer.step()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value)
    wrapper.destroy()


def test_replica_grouping():
    wrapper = poptorch.inferenceModel(torch.nn.Linear(2, 2), _opts())
    assert wrapper.per_replica_params == {}
    wrapper.weight.replicaGrouping(poptorch.CommGroupType.All, 1,
                                   poptorch.VariableRetrievalMode.OnePerGroup)
    assert wrapper.per_replica_params == {"weight": (poptorch.CommGroupType.All, 1,
                                                     poptorch.VariableRetrievalMode.OnePerGroup)}
    with pytest.raises(TypeError, match="CommGroupType"):
        wrapper.weight.replicaGrouping("All", 1, poptorch.VariableRetrievalMode.OnePerGroup)
    pickle.loads(pickle.dumps(wrapper.model))  # the setter does not block pickling

    replicated = poptorch.inferenceModel(torch.nn.Linear(2, 2),
                                         _opts().replicationFactor(2))
    # Groupings with several groups are accepted (tests/poptorch/test_replica_grouping.py);
    # a group size that does not divide the replicas is not.
    replicated.bias.replicaGrouping(poptorch.CommGroupType.NoGrouping, 1,
                                    poptorch.VariableRetrievalMode.OnePerGroup)
    with pytest.raises(poptorch.Error, match="must divide"):
        replicated.bias.replicaGrouping(poptorch.CommGroupType.Consecutive, 3,
                                        poptorch.VariableRetrievalMode.AllReplicas)


# --- data ----------------------------------------------------------------------------------------


def test_accessor_next():
    data = [torch.ones(2) * i for i in range(3)]
    accessor = poptorch.AsynchronousDataAccessor(data, load_indefinitely=False)
    try:
        got = [next(accessor) for _ in range(3)]
        for a, b in zip(got, data):
            torch.testing.assert_close(a, b)
        with pytest.raises(StopIteration):
            next(accessor)
        assert iter(accessor) is accessor
    finally:
        accessor.terminate()


# --- optimizer state -----------------------------------------------------------------------------


def test_optimizer_state_api_matches_eager_momentum():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            return torch.nn.functional.mse_loss(self.inner(x), y)

    wrapped = WithLoss(model)
    optimizer = poptorch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    assert not optimizer.has_state()
    assert not optimizer.ipu_state_is_dirty and not optimizer.host_state_is_dirty
    wrapper = poptorch.trainingModel(wrapped, _opts(), optimizer)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    wrapper(x, y)
    assert optimizer.ipu_state_is_dirty and optimizer.has_state()
    state = optimizer.get_state_dict()
    assert not optimizer.ipu_state_is_dirty
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    ref_opt.step()
    torch.testing.assert_close(state["state"][0]["momentum_buffer"],
                               ref_opt.state_dict()["state"][0]["momentum_buffer"])
    optimizer.set_state_dict(state)
    assert optimizer.host_state_is_dirty
    wrapper(x, y)
    assert not optimizer.host_state_is_dirty
    with pytest.raises(RuntimeError, match="ipu_state"):
        optimizer.set_state_dict({"state": {}, "param_groups": state["param_groups"]})
    wrapper.destroy()


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.fc(x), y)


def test_unknown_param_group_key_is_ignored_with_one_warning():
    """PopTorch ignores param-group keys it does not read; we say so once per key."""
    from poptorch_lite import optimizer_translation

    model = Regression()
    reference = Regression()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["name"] = "all"
    optimizer_translation._LOGGED.discard(("group", "name"))
    wrapper = poptorch.trainingModel(model, _opts(), optimizer)
    x, y = torch.randn(2, 3), torch.randn(2, 1)
    messages = _capture(lambda: [wrapper(x, y) for _ in range(2)], logging.WARNING)
    assert sum("key 'name' is ignored" in m for m in messages) == 1
    wrapper.copyWeightsToHost()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        ref_opt.zero_grad()
        reference(x, y).backward()
        ref_opt.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    wrapper.destroy()


def test_implementation_keys_are_logged_once():
    from poptorch_lite import optimizer_translation

    model = Regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    optimizer_translation._LOGGED.discard("foreach")
    weights = {f"w{i}": name for i, (name, _) in enumerate(model.named_parameters())}
    messages = _capture(lambda: [optimizer_translation.translate(optimizer, model, weights, set())
                                 for _ in range(2)], logging.WARNING)
    assert sum("foreach=True has no effect" in m for m in messages) == 1


# --- int64 weights and exporter failures ------------------------------------------------------


class Lookup(torch.nn.Module):
    def __init__(self, ids):
        super().__init__()
        self.table = torch.nn.Parameter(torch.arange(8.0))
        self.register_buffer("ids", ids)

    def forward(self, x):
        return self.table[self.ids] + x


def test_int64_buffer_in_range_matches_eager_and_out_of_range_is_refused():
    model = Lookup(torch.tensor([1, 5, 2])).eval()
    wrapper = poptorch.inferenceModel(model, _opts())
    x = torch.randn(3)
    torch.testing.assert_close(wrapper(x), model(x))
    with torch.no_grad():
        model.ids.fill_(2**40)
    with pytest.raises(poptorch.Error, match=r"Buffer 'ids' \(int64\) holds 1099511627776"):
        wrapper.copyWeightsToDevice()
    bad = poptorch.inferenceModel(Lookup(torch.tensor([2**33, 1, 1])).eval(), _opts())
    with pytest.raises(poptorch.Error, match="outside the int32 range"):
        bad.compile(x)


class Kth(torch.nn.Module):
    def forward(self, x):
        return torch.kthvalue(x * 2, 2, dim=1)[0]


def test_exporter_failure_names_op_and_line():
    wrapper = poptorch.inferenceModel(Kth(), _opts())
    with warnings.catch_warnings(), pytest.raises(poptorch.Error) as info:
        warnings.simplefilter("ignore")
        wrapper(torch.randn(2, 4))
    error = info.value
    assert error.type == "unsupported_op"
    assert "aten.kthvalue" in error.message
    assert "test_public_names_more.py" in error.location
