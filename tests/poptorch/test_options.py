"""Options: typed setters, freezing, files, JSON and backend mapping (spec §2.5, P21-P36)."""

import pytest
import torch

import poptorch_lite as poptorch


def test_setters_chain_and_check_types():
    opts = poptorch.Options().deviceIterations(4).randomSeed(3)
    opts.Training.gradientAccumulation(2)
    assert opts.device_iterations == 4 and opts.Training.gradient_accumulation == 2
    with pytest.raises(TypeError, match="deviceIterations: expected int"):
        opts.deviceIterations("4")
    with pytest.raises(ValueError, match=">= 1"):
        opts.deviceIterations(0)
    with pytest.raises(AttributeError):
        opts.noSuchOption(1)
    with pytest.raises(ValueError, match="period"):
        opts.outputMode(poptorch.OutputMode.EveryN)


def test_replication_factor_is_checked():
    # Replicated runs are tested in test_replication.py.
    assert poptorch.Options().replicationFactor(2).replication_factor == 2
    with pytest.raises(ValueError, match=">= 1"):
        poptorch.Options().replicationFactor(0)


def test_frozen_once_used_and_clone_is_editable(mlp):
    opts = poptorch.Options()
    poptorch.inferenceModel(mlp, opts)
    with pytest.raises(AttributeError, match="frozen.*clone"):
        opts.deviceIterations(2)
    with pytest.raises(AttributeError, match="frozen"):
        opts.Training.gradientAccumulation(2)
    copy = opts.clone().deviceIterations(2)
    assert copy.device_iterations == 2 and opts.device_iterations == 1


def test_inference_rejects_gradient_accumulation(mlp):
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="deviceIterations"):
        poptorch.inferenceModel(mlp, opts)
    with pytest.raises(poptorch.Error, match="Options"):
        poptorch.inferenceModel(mlp, {"deviceIterations": 2})


def test_to_dict_json_round_trip():
    opts = poptorch.Options().deviceIterations(3).outputMode(poptorch.OutputMode.Sum)
    data = opts.toDict()
    assert data["deviceIterations"] == 3 and data["outputMode"] == "OutputMode.Sum"
    import json

    other = poptorch.Options().from_json(json.dumps({"deviceIterations": 3,
                                                     "outputMode": "OutputMode.Sum"}))
    assert other.toDict() == data


def test_load_from_file(tmp_path):
    path = tmp_path / "opts.txt"
    path.write_text("# comment\ndeviceIterations(5)\nTraining.gradientAccumulation(2)\n"
                    "outputMode(poptorch.OutputMode.Final)\nPrecision.setPartialsType(torch.half)\n")
    opts = poptorch.Options().loadFromFile(str(path))
    assert opts.device_iterations == 5 and opts.output_mode is poptorch.OutputMode.Final
    assert opts.toDict()["Precision.partialsType"] == "half"
    path.write_text("deviceIterations(5)\ndeviceIterations('x')\n")
    with pytest.raises(poptorch.ConfigFileError, match=r"TypeError in .*opts.txt:2"):
        poptorch.Options().loadFromFile(str(path))


def test_backend_mapping():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    opts._Popart.set("strictOpVersions", False)
    backend = opts.to_backend(training=True)
    assert backend.enableGradientAccumulation and backend.accumulationFactor == 4
    assert backend.accumulationAndReplicationReductionType.name == "Sum"
    assert backend.constantWeights is False and backend.strictOpVersions is False
    bad = poptorch.Options()
    bad._Popart.set("noSuchKey", 1)
    with pytest.raises(poptorch.Error, match="noSuchKey"):
        bad.to_backend(training=False)
    with pytest.raises(ValueError):
        opts.Precision.setPartialsType(torch.int32)
