"""Public names of PopTorch 3.x: the ``enums`` submodule, ``setLogLevel`` / ``logger`` /
``POPTORCH_LOG_LEVEL``, and the OptionsDict face of ``Options`` (value keys and methods)."""

import logging
import os
import subprocess
import sys

import pytest

import poptorch_lite as poptorch
from poptorch_lite import enums
from poptorch_lite.enums import MatMulSerializationMode, OverlapMode, VariableRetrievalMode

# --- enums ------------------------------------------------------------------------------------

def test_enums_submodule_reexports_the_same_classes():
    # Re-exported, not duplicated: one class object wherever it is imported from.
    for name in ("OutputMode", "ReductionType", "MeanReductionStrategy", "ConnectionType",
                 "SyncPattern", "CommGroupType", "DataLoaderMode", "Liveness", "AutoStage"):
        assert getattr(enums, name) is getattr(poptorch, name)
    assert poptorch.enums is enums


@pytest.mark.parametrize("enum_name, members", [
    ("SharingStrategy", {"SharedMemory": 0, "FileSystem": 1, "Fork": 2, "ForkServer": 3}),
    ("HalfFloatCastingBehavior", {"FloatDowncastToHalf": 0, "HalfUpcastToFloat": 1,
                                  "Default": 2}),
    ("MatMulSerializationMode", {"InputChannels": "input_channels",
                                 "ReducingDim": "reducing_dim",
                                 "OutputChannels": "output_channels", "Disabled": "none"}),
    ("OverlapMode", {"NoOverlap": "no_overlap",
                     "OverlapAccumulationLoop": "overlap_accumulation_loop",
                     "OverlapDeviceIterationLoop": "overlap_device_iteration_loop"}),
    ("MultiConvPlanType", {"Parallel": 0, "Serial": 1}),
    ("VariableRetrievalMode", {"OnePerGroup": 0, "AllReplicas": 2}),
    ("OutputMode", {"Final": 0, "EveryN": 1, "All": 2, "Sum": 3, "Default": 4}),
])
def test_enum_members_have_poptorch_values(enum_name, members):
    cls = getattr(enums, enum_name)
    assert getattr(poptorch, enum_name) is cls
    assert {m.name: m.value for m in cls} == members


def test_string_enums_look_up_by_value():
    assert MatMulSerializationMode("output_channels") is MatMulSerializationMode.OutputChannels
    assert OverlapMode("no_overlap") is OverlapMode.NoOverlap
    assert VariableRetrievalMode(2) is VariableRetrievalMode.AllReplicas


# --- logging ----------------------------------------------------------------------------------

@pytest.fixture
def restore_level():
    level = poptorch.logger.level
    yield
    poptorch.logger.setLevel(level)


def _period_ignored_log():
    # A frontend INFO message: the period is ignored for modes other than EveryN.
    poptorch.Options().outputMode(poptorch.OutputMode.All, 3)


def test_set_log_level_changes_what_is_printed(capsys, restore_level):
    assert poptorch.logger is logging.getLogger("poptorch_lite")
    poptorch.setLogLevel("INFO")
    _period_ignored_log()
    assert "output_return_period 3 ignored" in capsys.readouterr().err
    poptorch.setLogLevel("WARN")
    _period_ignored_log()
    assert capsys.readouterr().err == ""
    poptorch.setLogLevel("DEBUG")
    poptorch.logger.debug("a debug line")
    assert "[poptorch:python] [DEBUG] a debug line" in capsys.readouterr().err
    poptorch.setLogLevel("OFF")
    poptorch.logger.error("an error")
    assert capsys.readouterr().err == ""
    poptorch.setLogLevel(logging.INFO)  # ints are logging levels
    _period_ignored_log()
    assert "ignored" in capsys.readouterr().err


def test_set_log_level_levels_and_errors(restore_level):
    for name, number in (("TRACE", 5), ("trace_all", 5), ("DEBUG", logging.DEBUG),
                         ("INFO", logging.INFO), ("WARN", logging.WARNING),
                         ("ERR", logging.ERROR)):
        poptorch.setLogLevel(name)
        assert poptorch.logger.level == number
    poptorch.setLogLevel("OFF")
    assert poptorch.logger.level > logging.CRITICAL
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        poptorch.setLogLevel("LOUD")
    with pytest.raises(TypeError, match="level name or a logging level int"):
        poptorch.setLogLevel(2.5)
    # The chainable Options form sets the same process-wide level.
    assert isinstance(poptorch.Options().setLogLevel("ERR"), poptorch.Options)
    assert poptorch.logger.level == logging.ERROR


def test_poptorch_log_level_environment_variable_is_read_at_import():
    code = ("import poptorch_lite as p, logging; print(p.logger.level); "
            "p.Options().outputMode(p.OutputMode.All, 3)")
    env = {**os.environ, "POPTORCH_LOG_LEVEL": "ERR"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == str(logging.ERROR)
    assert "ignored" not in done.stderr
    env["POPTORCH_LOG_LEVEL"] = "INFO"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    assert "output_return_period 3 ignored" in done.stderr


# --- OptionsDict: value keys ------------------------------------------------------------------

def test_value_keys_have_poptorch_defaults():
    opts = poptorch.Options()
    assert opts.input_group_size == 1
    assert opts.input_cgt is poptorch.CommGroupType.Consecutive
    assert opts.broadcast_buffers is True
    assert opts.log_dir == "."
    assert opts.max_repeat_logs == 4
    assert opts.anchored_tensors == {}
    assert opts.available_memory_proportion == {}
    assert opts.defaultOutputMode() is True
    assert opts.Training.accumulation_and_replication_reduction_type is (
        poptorch.ReductionType.Mean)
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy is (
        poptorch.MeanReductionStrategy.Post)
    assert opts.Distributed.ipuof_configs == {}


def test_value_keys_follow_their_setters():
    opts = poptorch.Options().replicationFactor(4)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal)
    assert (opts.input_group_size, opts.input_cgt) == (2, poptorch.CommGroupType.Orthogonal)
    opts.broadcastBuffers(False).logDir("/tmp/x").maxRepeatLogs(7)
    opts.setAvailableMemoryProportion({"IPU0": 0.3}).anchorTensor("g", "Gradient___fc.weight")
    assert (opts.broadcast_buffers, opts.log_dir, opts.max_repeat_logs) == (False, "/tmp/x", 7)
    assert opts.available_memory_proportion == {"IPU0": 0.3}
    assert list(opts.anchored_tensors) == ["g"]
    opts.outputMode(poptorch.OutputMode.Sum)
    assert opts.defaultOutputMode() is False
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    assert opts.Training.accumulation_and_replication_reduction_type is (
        poptorch.ReductionType.Sum)
    opts.Distributed.configureProcessId(1, 3)
    assert (opts.Distributed.distributed_process_id,
            opts.Distributed.num_distributed_processes) == (1, 3)


def test_keys_that_exist_only_after_their_setter():
    opts = poptorch.Options()
    for key in ("use_model", "ipu_version", "model_name", "ipu_id", "random_seed"):
        assert not opts.exists(key)
    with pytest.raises(AttributeError, match="use_model"):
        _ = opts.use_model
    opts.useIpuModel(True).useOfflineIpuTarget(21).modelName("m").useIpuId(3).randomSeed(5)
    assert (opts.use_model, opts.ipu_version, opts("model_name"), opts("ipu_id"),
            opts.random_seed) == (True, 21, "m", 3, 5)
    opts.deleteIfExists("ipu_version")
    assert not opts.exists("ipu_version") and opts.offline_ipu_version is None
    opts.deleteIfExists("random_seed")
    assert opts.random_seed is None


# --- OptionsDict: methods ---------------------------------------------------------------------

def test_set_goes_through_the_setter_and_its_checks():
    opts = poptorch.Options()
    opts.set(device_iterations=3, replication_factor=2)
    assert (opts.device_iterations, opts("replication_factor")) == (3, 2)
    # The setter's effect: the backend options follow.
    assert opts.to_backend(training=False).replicatedGraphCount == 2
    with pytest.raises(TypeError, match="deviceIterations: expected int"):
        opts.set(device_iterations="3")
    with pytest.raises(ValueError, match="invalid option 'nope'"):
        opts.set(nope=1)
    with pytest.raises(ValueError, match="read-only"):
        opts.set(anchored_tensors={})
    opts.Training.set(gradient_accumulation=4)
    assert opts.Training("gradient_accumulation") == 4
    assert opts.to_backend(training=True).accumulationFactor == 4
    opts.Training.set(meanAccumulationAndReplicationReductionStrategy=(
        poptorch.MeanReductionStrategy.Running))
    assert opts.to_backend(
        training=True).meanAccumulationAndReplicationReductionStrategy.name == "Running"
    opts.Distributed.set(num_distributed_processes=2)
    assert opts.Distributed.numProcesses == 2
    with pytest.raises(ValueError, match="outside"):
        opts.Distributed.set(distributed_process_id=5)


def test_create_or_set_stores_unknown_keys_and_logs_once(capsys):
    opts = poptorch.Options()
    opts.createOrSet(device_iterations=2, my_key_for_test=1)
    opts.createOrSet(my_key_for_test=2)
    err = capsys.readouterr().err
    assert err.count("createOrSet(my_key_for_test=...)") == 1 and "no effect" in err
    assert opts.device_iterations == 2
    assert opts.my_key_for_test == 2 and opts("my_key_for_test") == 2
    assert opts.exists("my_key_for_test") and opts.clone().my_key_for_test == 2
    opts.deleteIfExists("my_key_for_test")
    assert not opts.exists("my_key_for_test")
    with pytest.raises(ValueError, match="always defined"):
        opts.deleteIfExists("device_iterations")
    opts.Precision.createOrSet(group_key=True)
    assert opts.Precision.group_key is True and not opts.exists("group_key")


def test_ipuof_configs_is_accepted_and_logged_once_as_no_effect(capsys):
    opts = poptorch.Options()
    opts.Distributed.set(ipuof_configs={"0": "/etc/ipuof.conf"})
    opts.Distributed.set(ipuof_configs={"0": "/etc/other.conf"})
    assert opts.Distributed.ipuof_configs == {"0": "/etc/other.conf"}
    err = capsys.readouterr().err
    # Logged once per process: another test may have logged it already.
    assert err.count("no effect on the simulated IPUs") <= 1
    with pytest.raises(TypeError, match="expected dict"):
        opts.Distributed.set(ipuof_configs=[1])


def test_update_call_and_frozen_check():
    opts = poptorch.Options().deviceIterations(2)
    merged = opts.update({"other": 1})
    assert merged["other"] == 1 and merged["device_iterations"] == 2
    assert "random_seed" not in merged  # not set: does not exist
    with pytest.raises(ValueError, match="keys in common"):
        opts.update({"device_iterations": 1})
    with pytest.raises(ValueError, match="no option 'missing'"):
        opts("missing")
    assert opts.Training.update({}) == {
        "gradient_accumulation": 1,
        "accumulation_and_replication_reduction_type": poptorch.ReductionType.Mean,
        "meanAccumulationAndReplicationReductionStrategy": poptorch.MeanReductionStrategy.Post}
    opts.checkIsFrozen()
    opts._Popart.set("enableStochasticRounding", True)
    assert opts._Popart.options == {"enableStochasticRounding": True}
    opts._freeze()
    for group in (opts, opts.Training, opts.Distributed, opts._Popart):
        with pytest.raises(AttributeError, match="frozen"):
            group.checkIsFrozen()
    with pytest.raises(AttributeError, match="frozen"):
        opts.set(device_iterations=3)
    with pytest.raises(AttributeError, match="frozen"):
        opts.createOrSet(new_key=3)
