"""Profiling from PopTorch (P35): ``Options.enableProfiling(dir)`` writes the simulated IPU's
report (profile.json, profile.html, trace.json) into ``dir/<model name>`` after compiling and
after the first run; the ``POPLAR_ENGINE_OPTIONS`` variable does the same; nothing otherwise."""

from __future__ import annotations

import json

import torch

import poptorch_lite as poptorch
from popart_backend.report import auto
from tests.report.test_auto_report import check_report_files

from .conftest import make_mlp


class _WithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = make_mlp()

    def forward(self, x, y):
        out = self.model(x)
        return out, torch.nn.functional.mse_loss(out, y)


def test_inference_and_training_wrappers_write_reports(tmp_path, monkeypatch):
    monkeypatch.delenv(auto.ENV_ENGINE_OPTIONS, raising=False)
    inference = poptorch.inferenceModel(make_mlp(), poptorch.Options().enableProfiling(
        str(tmp_path)))
    try:
        inference(torch.randn(2, 4))
    finally:
        inference.destroy()
    report = check_report_files(tmp_path / "inference")
    assert report["execution"]["runs"] == 1

    model = _WithLoss()
    opts = poptorch.Options().logDir(str(tmp_path / "logs")).enableProfiling().modelName("mlp")
    training = poptorch.trainingModel(model, opts,
                                      torch.optim.SGD(model.parameters(), lr=0.01))
    try:
        training(torch.randn(2, 4), torch.randn(2, 3))
    finally:
        training.destroy()
    check_report_files(tmp_path / "logs" / "mlp")


def test_environment_variable_profiles_a_wrapper(tmp_path, monkeypatch):
    monkeypatch.setenv(auto.ENV_ENGINE_OPTIONS, json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(tmp_path)}))
    wrapper = poptorch.inferenceModel(make_mlp())
    try:
        wrapper(torch.randn(2, 4))
    finally:
        wrapper.destroy()
    check_report_files(tmp_path / "inference")


def test_nothing_written_when_profiling_is_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(auto.ENV_ENGINE_OPTIONS, raising=False)
    wrapper = poptorch.inferenceModel(make_mlp())
    try:
        wrapper(torch.randn(2, 4))
    finally:
        wrapper.destroy()
    assert list(tmp_path.iterdir()) == []
