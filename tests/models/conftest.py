"""Session-wide cache of exported models: each (model, exporter, opset) is exported once per run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.models import zoo

MICRO_BATCH = 2


@dataclasses.dataclass
class Exported:
    key: tuple[str, str, int]
    model: onnx.ModelProto
    path: Path
    feeds: dict[str, np.ndarray]  # one micro-batch, keyed by ONNX input name
    eager: dict[str, np.ndarray]  # eager torch outputs on ``feeds``
    module: torch.nn.Module


class ExportCache:
    def __init__(self, folder: Path):
        self.folder = folder
        self.done: dict[tuple[str, str, int], Exported] = {}

    def get(self, name: str, exporter: str, opset: int) -> Exported:
        key = (name, exporter, opset)
        if key in self.done:
            return self.done[key]
        spec = zoo.SPECS[name]
        overrides = zoo.TORCHSCRIPT_OVERRIDES.get(name, {}) if exporter == "torchscript" else {}
        module = spec.model(**overrides)
        feeds = spec.inputs(MICRO_BATCH)
        limit = zoo.EXPORT_LIMITS.get(key)
        if limit is not None:
            with pytest.raises(torch.onnx.errors.UnsupportedOperatorError):
                zoo.export(module, feeds, spec.output_names, exporter, opset)
            pytest.skip(limit)
        model = zoo.export(module, feeds, spec.output_names, exporter, opset)
        path = self.folder / f"{name}_{exporter}_{opset}.onnx"
        onnx.save(model, str(path))
        eager = dict(zip(spec.output_names, zoo.eager_outputs(module, feeds)))
        self.done[key] = Exported(key, model, path, feeds, eager, module)
        return self.done[key]


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> ExportCache:
    return ExportCache(tmp_path_factory.mktemp("exported_models"))
