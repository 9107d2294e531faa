"""``NumericsReport``: compares the weight updates of two training runs given as ONNX models
(PopART's numerics tool). Run A goes from model ``A0`` to ``A1``, run B from ``B0`` to ``B1``;
for each weight the updates dA = A1 − A0 and dB = B1 − B0 are compared by their relative
error ‖dA − dB‖ / (‖dA‖ + ‖dB‖) (0 when neither run moved the weight), a number in [0, 1]:
0 for identical updates, 1 for opposite ones."""

from __future__ import annotations

import numpy as np

from ..errors import popart_exception
from ..importer.onnx_model import initializer_value, load_model

__all__ = ["NumericsReport"]


def _weights(model, which: str) -> dict[str, np.ndarray]:
    loaded = load_model(model)
    return {init.name: initializer_value(init, loaded.base_dir).astype(np.float64)
            for init in loaded.proto.graph.initializer}


class NumericsReport:
    """``NumericsReport(A0, A1, B0, B1)``: four models (paths, bytes or ModelProtos) with the
    same weights."""

    def __init__(self, A0, A1, B0, B1):  # noqa: N803 - PopART's names
        models = {name: _weights(m, name) for name, m in
                  (("A0", A0), ("A1", A1), ("B0", B0), ("B1", B1))}
        ids = sorted(models["A0"])
        for name, weights in models.items():
            if sorted(weights) != ids:
                raise popart_exception(
                    f"NumericsReport: model {name} has weights {sorted(weights)}, A0 has {ids}; "
                    f"the four models must have the same weights."
                )
            for tensor_id in ids:
                if weights[tensor_id].shape != models["A0"][tensor_id].shape:
                    raise popart_exception(
                        f"NumericsReport: weight '{tensor_id}' is "
                        f"{list(weights[tensor_id].shape)} in {name} but "
                        f"{list(models['A0'][tensor_id].shape)} in A0."
                    )
        self._stats = {}
        for tensor_id in ids:
            d_a = models["A1"][tensor_id] - models["A0"][tensor_id]
            d_b = models["B1"][tensor_id] - models["B0"][tensor_id]
            norm_a, norm_b = float(np.linalg.norm(d_a)), float(np.linalg.norm(d_b))
            diff = float(np.linalg.norm(d_a - d_b))
            rel = diff / (norm_a + norm_b) if norm_a + norm_b > 0 else 0.0
            self._stats[tensor_id] = (norm_a, norm_b, diff, rel)

    def getRelativeErrors(self) -> dict[str, float]:  # noqa: N802
        return {tensor_id: stats[3] for tensor_id, stats in self._stats.items()}

    def report(self, id: str) -> str:  # noqa: A002 - PopART's name
        if id not in self._stats:
            raise popart_exception(
                f"NumericsReport.report('{id}'): no such weight; weights are {sorted(self._stats)}."
            )
        norm_a, norm_b, diff, rel = self._stats[id]
        return (f"{id}: |dA| = {norm_a:.6g}, |dB| = {norm_b:.6g}, |dA - dB| = {diff:.6g}, "
                f"relative error = {rel:.6g}")

    def fullReport(self) -> str:  # noqa: N802
        return "\n".join(self.report(tensor_id) for tensor_id in self._stats)
