"""Every ``poptorch_lite.Options`` setter has a status (options/status.py) and keeps it: BACKEND
setters change their SessionOptions field, NO_EFFECT ones log once, REFUSED ones raise,
DEPRECATED ones warn. Also the setters whose effect was missing: logDir, maxRepeatLogs,
_Popart.setPatterns / setEngineOptions, and the accessor's arguments."""

from __future__ import annotations

import inspect
import json
import logging

import pytest
import torch

import popart_backend as popart
import poptorch_lite as poptorch
from poptorch_lite import data as data_module
from poptorch_lite.errors import Error
from poptorch_lite.options import groups, logs, status
from poptorch_lite.options.status import NOT_SETTERS, SETTER_STATUS, SetterState

_CLASSES = [(poptorch.Options, ""), (groups._Training, "Training."),
            (groups._Precision, "Precision."), (groups._TensorLocations, "TensorLocations."),
            (groups._Distributed, "Distributed."), (groups._Jit, "Jit."),
            (groups._Popart, "_Popart."), (groups.TensorLocationSettings, "TensorLocationSettings.")]

_OFF_CHIP = poptorch.TensorLocationSettings().useOnChipStorage(False)

# One call per setter that sets a value other than the inert default (BACKEND, NO_EFFECT,
# REFUSED, DEPRECATED setters must have one).
EXAMPLES = {
    "anchorTensor": lambda o: o.anchorTensor("g", "Gradient___fc.weight"),
    "enableExecutableCaching": lambda o: o.enableExecutableCaching("/tmp/cache"),
    "setAvailableMemoryProportion": lambda o: o.setAvailableMemoryProportion({"IPU0": 0.3}),
    "enableStableNorm": lambda o: o.enableStableNorm(True),
    "enableSyntheticData": lambda o: o.enableSyntheticData(True),
    "disableModuleNamescope": lambda o: o.disableModuleNamescope(),
    "relaxOptimizerAttributesChecks": lambda o: o.relaxOptimizerAttributesChecks(),
    "Training.accumulationAndReplicationReductionType":
        lambda o: o.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum),
    "Training.setMeanAccumulationAndReplicationReductionStrategy":
        lambda o: o.Training.setMeanAccumulationAndReplicationReductionStrategy(
            poptorch.MeanReductionStrategy.Running),
    "Training.setAutomaticLossScaling": lambda o: o.Training.setAutomaticLossScaling(True),
    "Training.setConvolutionDithering": lambda o: o.Training.setConvolutionDithering(True),
    "Precision.setPartialsType": lambda o: o.Precision.setPartialsType(torch.half),
    "Precision.enableFloatingPointExceptions":
        lambda o: o.Precision.enableFloatingPointExceptions(True),
    "Precision.enableStochasticRounding": lambda o: o.Precision.enableStochasticRounding(True),
    "Precision.halfFloatCasting": lambda o: o.Precision.halfFloatCasting(0),
    "Precision.runningStatisticsAlwaysFloat":
        lambda o: o.Precision.runningStatisticsAlwaysFloat(True),
    "TensorLocations.numIOTiles": lambda o: o.TensorLocations.numIOTiles(32),
    "TensorLocations.setActivationLocation":
        lambda o: o.TensorLocations.setActivationLocation(_OFF_CHIP),
    "TensorLocations.setWeightLocation": lambda o: o.TensorLocations.setWeightLocation(_OFF_CHIP),
    "TensorLocations.setOptimizerLocation":
        lambda o: o.TensorLocations.setOptimizerLocation(_OFF_CHIP),
    "TensorLocations.setAccumulatorLocation":
        lambda o: o.TensorLocations.setAccumulatorLocation(_OFF_CHIP),
    "Jit.traceModel": lambda o: o.Jit.traceModel(False),
}


def _public_methods():
    for cls, prefix in _CLASSES:
        for name, _ in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                yield prefix + name, name


def _names(state):
    return sorted(n for n, s in SETTER_STATUS.items() if s.state is state)


@pytest.fixture
def records(monkeypatch):
    """Records of the frontend logger (it does not propagate), with the once-sets reset."""
    monkeypatch.setattr(status, "_LOGGED", set())
    monkeypatch.setattr(data_module, "_LOGGED", set())
    seen = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = seen.append
    logs.logger.addHandler(handler)
    yield seen
    logs.logger.removeHandler(handler)


def test_every_setter_has_a_status():
    methods = dict(_public_methods())
    missing = sorted(q for q, name in methods.items()
                     if q not in SETTER_STATUS and name not in NOT_SETTERS)
    assert not missing, f"add these setters to options/status.py SETTER_STATUS: {missing}"
    stale = sorted(set(SETTER_STATUS) - set(methods))
    assert not stale, f"SETTER_STATUS names no such setter: {stale}"
    for name, entry in SETTER_STATUS.items():
        assert entry.note, f"{name}: say where it is read / which field / why"
        if entry.state is not SetterState.BUILT:
            assert name in EXAMPLES, f"{name} ({entry.state.name}) needs an example call here"


@pytest.mark.parametrize("name", _names(SetterState.BACKEND))
def test_backend_setters_change_their_field(name):
    field = SETTER_STATUS[name].note
    default = getattr(poptorch.Options().to_backend(True), field)
    opts = poptorch.Options()
    EXAMPLES[name](opts)
    assert getattr(opts.to_backend(True), field) != default


@pytest.mark.parametrize("name", _names(SetterState.NO_EFFECT))
def test_no_effect_setters_log_once(name, records):
    poptorch.Options().to_backend(True)
    assert not [r for r in records if name in r.getMessage()]
    opts = poptorch.Options()
    EXAMPLES[name](opts)
    opts.to_backend(True)
    opts.to_backend(False)
    hits = [r for r in records if f"Options.{name} has no effect" in r.getMessage()]
    assert len(hits) == 1 and hits[0].levelno == logging.WARNING, [r.getMessage() for r in records]


@pytest.mark.parametrize("name", _names(SetterState.REFUSED))
def test_refused_setters_raise_at_compile(name):
    opts = poptorch.Options()
    EXAMPLES[name](opts)
    with pytest.raises(Error, match=name):
        opts.to_backend(True)


@pytest.mark.parametrize("name", _names(SetterState.DEPRECATED))
def test_deprecated_setters_warn(name):
    with pytest.warns(DeprecationWarning):
        EXAMPLES[name](poptorch.Options())


def test_log_dir_reaches_the_backend_and_the_profile(tmp_path):
    opts = poptorch.Options().logDir(str(tmp_path))
    assert opts.to_backend(False).logDir == str(tmp_path)
    assert opts.profiling_dir is None
    assert opts.enableProfiling().profiling_dir == str(tmp_path)
    assert poptorch.Options().enableProfiling("p").profiling_dir == "p"


def test_max_repeat_logs_suppresses_repeats(records):
    try:
        poptorch.Options().maxRepeatLogs(2).to_backend(False)
        for _ in range(5):
            logs.logger.warning("same %d", 1)
        logs.logger.warning("other")
        logs.logger.warning("same %d", 1)
        lines = [r.getMessage() for r in records]
        assert lines[:3] == ["same 1", "same 1", lines[2]] and "suppressed" in lines[2]
        assert lines[3:] == ["other", "same 1"]
        records.clear()
        poptorch.Options().maxRepeatLogs(None).to_backend(False)
        for _ in range(6):
            logs.logger.warning("again")
        assert len(records) == 6
    finally:
        logs.setRepeatLimit(4)
    with pytest.raises(ValueError, match="maxRepeatLogs"):
        poptorch.Options().maxRepeatLogs(0)


def test_set_patterns_builds_backend_patterns():
    assert poptorch.Options().backend_patterns() is None
    opts = poptorch.Options()
    opts._Popart.setPatterns({"InPlace": False, "PreUniRepl": True}, 0)
    patterns = opts.backend_patterns()
    assert isinstance(patterns, popart.Patterns)
    assert patterns.enabledPatterns() == ["PreUniRepl"]
    assert opts.clone().backend_patterns() == patterns
    with pytest.raises(popart.popart_exception, match="Unknown pattern 'NoSuch'"):
        poptorch.Options()._Popart.setPatterns({"NoSuch": True})
    with pytest.raises(ValueError, match="level"):
        poptorch.Options()._Popart.setPatterns({}, 7)


def test_set_engine_options_merge():
    opts = poptorch.Options()
    opts._Popart.setEngineOptions({"autoReport.directory": "d", "debug.retainDebug": True})
    engine = opts.to_backend(False).engineOptions
    # the wrapper's own autoReport.all stays; the user's keys are added
    assert engine == {"autoReport.all": "true", "autoReport.directory": "d",
                      "debug.retainDebug": "true"}


def test_accessor_arguments_without_effect_log_once(records):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 2)),
                                         batch_size=2)
    for _ in range(2):
        accessor = poptorch.AsynchronousDataAccessor(
            loader, sharing_strategy=poptorch.SharingStrategy.ForkServer,
            miss_sleep_time_in_ms=5.0)
        accessor.terminate()
    lines = [r.getMessage() for r in records]
    assert sum("sharing_strategy" in m for m in lines) == 1
    assert sum("miss_sleep_time_in_ms" in m for m in lines) == 1


def test_accessor_rebatches():
    dataset = torch.utils.data.TensorDataset(torch.arange(20.).reshape(10, 2), torch.arange(10))
    loader = torch.utils.data.DataLoader(dataset, batch_size=3)
    accessor = poptorch.AsynchronousDataAccessor(loader, rebatched_size=4,
                                                 load_indefinitely=False)
    batches = list(accessor)
    assert len(accessor) == len(batches) == 2
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert batches[1][0].shape == (4, 2)


def test_backend_values_survive_json():
    opts = poptorch.Options()
    opts._Popart.setPatterns({"InPlace": False}, 1)
    opts._Popart.setEngineOptions({"autoReport.directory": "d"})
    opts.TensorLocations.setWeightLocation(_OFF_CHIP)
    other = poptorch.Options().from_json(json.dumps(opts.toDict()))
    assert other.backend_patterns() == opts.backend_patterns()
    assert other.to_backend(True).weightTensorLocationSettings == (
        opts.to_backend(True).weightTensorLocationSettings)
    assert other.to_backend(True).engineOptions["autoReport.directory"] == "d"
