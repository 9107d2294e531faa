"""File writes of the backend (popart_backend/files.py): confined to the target folder, never
into the source model's files, atomic (a failed write leaves the old file whole)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import external_data_helper, numpy_helper

import popart_backend as popart
from popart_backend.files import confined_path, write_atomic

from .models import SHAPE, affine

NEW_B = np.full(SHAPE, -4, np.float32)


def external_affine(folder: Path, location: str = "weights.bin") -> Path:
    """The affine model saved in ``folder`` with w and b in the external file ``location``."""
    model = affine()
    external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save_model(model, str(folder / "m.onnx"))
    if location != "weights.bin":
        for init in model.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save_model(model, str(folder / "m.onnx"))
    return folder / "m.onnx"


def session_with_new_b(path: Path) -> popart.InferenceSession:
    options = popart.SessionOptions()
    options.constantWeights = False
    session = popart.InferenceSession(str(path), popart.DataFlow(1, {"y": popart.AnchorReturnType(
        "All")}), popart.DeviceManager().createCpuDevice(), userOptions=options)
    session.prepareDevice()
    session.writeWeights(popart.PyWeightsIO({"b": NEW_B.copy()}))
    session.weightsFromHost()
    return session


def saved_values(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))  # onnx's loader reads the external data next to the model
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def test_model_to_host_never_writes_through_a_traversing_location(tmp_path):
    """A location like ../../../<model folder>/weights.bin reads from the model's own folder;
    writing a copy elsewhere must not follow it back into the source folder."""
    source = tmp_path / "src"
    source.mkdir()
    external_affine(source)  # writes src/weights.bin
    traversal = "../" * 12 + str(source.resolve()).lstrip("/") + "/weights.bin"
    path = external_affine(source, traversal)
    original = (source / "weights.bin").read_bytes()
    session = session_with_new_b(path)
    target = tmp_path / "dst"
    target.mkdir()
    session.modelToHost(str(target / "m.onnx"))
    assert (source / "weights.bin").read_bytes() == original
    values = saved_values(target / "m.onnx")
    np.testing.assert_array_equal(values["b"], NEW_B)
    np.testing.assert_array_equal(values["w"], np.full(SHAPE, 2, np.float32))
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == [
        "m.onnx", "m.onnx.weights.bin"]


def test_model_to_host_copy_next_to_the_original_keeps_the_original_data(tmp_path):
    path = external_affine(tmp_path)
    original = (tmp_path / "weights.bin").read_bytes()
    session = session_with_new_b(path)
    session.modelToHost(str(tmp_path / "copy.onnx"))
    assert (tmp_path / "weights.bin").read_bytes() == original
    np.testing.assert_array_equal(saved_values(path)["b"], np.ones(SHAPE, np.float32))
    np.testing.assert_array_equal(saved_values(tmp_path / "copy.onnx")["b"], NEW_B)


def test_model_to_host_over_the_original_updates_it(tmp_path):
    path = external_affine(tmp_path)
    session = session_with_new_b(path)
    session.modelToHost(str(path))
    np.testing.assert_array_equal(saved_values(path)["b"], NEW_B)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_confined_path_refuses_traversal_absolute_and_symlinks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "link").symlink_to(outside)
    assert confined_path(folder, "a/b.bin", "t") == (folder / "a" / "b.bin").resolve()
    for location in ["../outside/x", str(outside / "x"), "link/x", "", "."]:
        with pytest.raises(popart.popart_exception, match="folder"):
            confined_path(folder, location, "t")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"old model")

    def half_then_fail(f):
        f.write(b"new half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, half_then_fail)
    assert path.read_bytes() == b"old model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


# A file-size limit makes the write fail midway (EFBIG), as a full disk would.
_SAVE_UNDER_A_SIZE_LIMIT = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np
    import popart_backend as popart
    folder = sys.argv[1]
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4096]))
    w = builder.addInitializedInputTensor(np.ones(4096, np.float32))
    builder.addOutputTensor(builder.aiOnnx.add([x, w]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    for what, call in [("model", lambda: builder.saveModelProto(folder + "/m.onnx")),
                       ("data", lambda: builder.saveInitializersExternally([w], folder + "/w.bin"))]:
        try:
            call()
            print(what, "written")
        except OSError as exc:
            print(what, "failed", exc.errno)
""")


def test_builder_saves_are_atomic_when_the_write_fails_midway(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"old model")
    (tmp_path / "w.bin").write_bytes(b"old data")
    result = subprocess.run([sys.executable, "-c", _SAVE_UNDER_A_SIZE_LIMIT, str(tmp_path)],
                            check=False, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert "model failed" in result.stdout and "data failed" in result.stdout, result.stderr
    assert (tmp_path / "m.onnx").read_bytes() == b"old model"
    assert (tmp_path / "w.bin").read_bytes() == b"old data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "w.bin"]


def test_builder_external_data_round_trip_still_runs(tmp_path):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    w = builder.addInitializedInputTensor(np.array([1, 2, 3], np.float32))
    b = builder.addInitializedInputTensor(np.array([4, 5, 6], np.float32))
    y = builder.aiOnnx.add([builder.aiOnnx.mul([x, w]), b])
    builder.addOutputTensor(y)
    builder.saveInitializersExternally([w], str(tmp_path / "data.bin"))
    builder.saveInitializersExternally([b], str(tmp_path / "data.bin"))  # same file: keeps w
    builder.saveModelProto(str(tmp_path / "m.onnx"))
    values = saved_values(tmp_path / "m.onnx")
    np.testing.assert_array_equal(values[w], [1, 2, 3])
    np.testing.assert_array_equal(values[b], [4, 5, 6])
