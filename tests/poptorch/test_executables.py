"""PopTorch executables and the executable cache (P30, P67-P69): a fresh process continues a
saved training run bit for bit (``load`` and ``loadExecutable``), a second process hits the
cache without tracing, bad files are refused before anything changes and run no code."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import poptorch_lite as poptorch
from poptorch_lite.executor.executable import cache_stats, model_fingerprint
from poptorch_lite.tracing import flatten_inputs
from tests.poptorch.executable_worker import (
    STEPS,
    batches,
    net,
    options,
    run_steps,
    training_wrapper,
)

REPO = Path(__file__).resolve().parents[2]


def _worker(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.poptorch.executable_worker",
                             *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=None if env is None else {**os.environ, **env})


def _wait(procs) -> None:
    for proc in procs:
        _, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, err[-3000:]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Train STEPS steps, save, train STEPS more: the file and the continued run."""
    path = tmp_path_factory.mktemp("exe") / "net.poptorch"
    wrapper = training_wrapper()
    run_steps(wrapper, batches(0, STEPS))
    wrapper.save(path)
    losses, state = run_steps(wrapper, batches(STEPS, STEPS))
    wrapper.destroy()
    return path, losses, state


def test_p67_p68_fresh_processes_continue_training_bit_identically(exported, tmp_path):
    path, losses, state = exported
    procs = [_worker(mode, path, tmp_path / f"{mode}.npz") for mode in ("load", "loadexe")]
    _wait(procs)
    for mode in ("load", "loadexe"):
        with np.load(tmp_path / f"{mode}.npz", allow_pickle=False) as got:
            np.testing.assert_array_equal(got["losses"], losses, err_msg=mode)
            for name, value in state.items():
                np.testing.assert_array_equal(got[name], value, err_msg=f"{mode} {name}")


def test_p67_compile_and_export_inference_matches_eager(tmp_path):
    model = net(3).eval()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    wrapper = poptorch.inferenceModel(model, options())
    (tmp_path / "infer").mkdir()
    with pytest.warns(UserWarning, match="is a folder"):
        wrapper.compileAndExport(tmp_path / "infer", x)  # model.poptorch inside
    wrapper.destroy()
    loaded = poptorch.load(tmp_path / "infer" / "model.poptorch")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-6)
    plain = tmp_path / "plain.poptorch"
    other = poptorch.inferenceModel(net(3).eval(), options())
    other.compileAndExport(plain, x, export_model=False)
    with pytest.raises(poptorch.Error, match="export_model=False"):
        poptorch.load(plain)


def _refused(path, match: str) -> None:
    with pytest.raises(poptorch.Error, match=match):
        poptorch.load(path)
    wrapper = training_wrapper(seed=4)
    before = {k: v.clone() for k, v in wrapper.model.state_dict().items()}
    with pytest.raises(poptorch.Error, match=match):
        wrapper.loadExecutable(path)
    assert not wrapper.isCompiled()  # never half-loaded
    for k, v in wrapper.model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_p68_truncated_pickled_and_mismatched_files_refused(exported, tmp_path):
    data = exported[0].read_bytes()
    cut = tmp_path / "cut.poptorch"
    cut.write_bytes(data[:len(data) // 2])
    _refused(cut, "truncated|not a valid archive")
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    pickled = tmp_path / "pickle.poptorch"
    pickled.write_bytes(pickle.dumps(Payload()))
    _refused(pickled, "not a valid archive")
    with zipfile.ZipFile(exported[0]) as src:
        members = {i.filename: src.read(i.filename) for i in src.infolist()}
    swapped = tmp_path / "swapped.poptorch"
    with zipfile.ZipFile(swapped, "w") as dst:
        for name, value in members.items():
            dst.writestr(name, pickle.dumps(Payload()) if name == "tensors.bin" else value)
    _refused(swapped, "checksum")
    assert not marker.exists()
    meta = json.loads(members["meta.json"])
    meta["versions"]["torch"] = "0.0.1"
    old = tmp_path / "old.poptorch"
    with zipfile.ZipFile(old, "w") as dst:
        for name, value in members.items():
            dst.writestr(name, json.dumps(meta) if name == "meta.json" else value)
    _refused(old, "versions")


def test_p68_loadexecutable_refuses_other_options_and_kind(exported):
    wrapper = poptorch.trainingModel(net().train(), options().deviceIterations(2))
    with pytest.raises(poptorch.Error, match="deviceIterations"):
        wrapper.loadExecutable(exported[0])
    with pytest.raises(poptorch.Error, match="training executable"):
        poptorch.inferenceModel(net().eval(), options()).loadExecutable(exported[0])
    with pytest.raises(poptorch.Error, match="edit_opts_fn changed"):
        poptorch.load(exported[0], edit_opts_fn=lambda o: o.deviceIterations(3))


def test_p69_cache_concurrent_processes_then_hit_with_current_weights(tmp_path, caplog):
    """Two processes compile at once (one compiles under the lock, the other hits; one is given
    the folder by POPTORCH_CACHE_DIR); a third (this one) hits without tracing and runs with its
    model's own weights."""
    cache = tmp_path / "cache"
    _wait([_worker("cache", cache, tmp_path / "s0.json"),
           _worker("cacheenv", "-", tmp_path / "s1.json", env={"POPTORCH_CACHE_DIR": str(cache)})])
    stats = [json.loads((tmp_path / f"s{i}.json").read_text()) for i in range(2)]
    assert sorted((s["hits"], s["misses"]) for s in stats) == [(0, 1), (1, 0)]
    entries = list(cache.glob("*.plite"))
    assert len(entries) == 1 and not list(cache.glob(".*.tmp"))
    model = net(seed=9).eval()  # other weights than the workers'
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(4))
    hits = cache_stats["hits"]
    caplog.set_level("INFO", logger="poptorch_lite")
    wrapper = poptorch.inferenceModel(model, options().enableExecutableCaching(str(cache)))
    out = wrapper(x)
    assert cache_stats["hits"] == hits + 1 and "executable cache hit" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    entries[0].write_bytes(entries[0].read_bytes()[:100])
    corrupt = cache_stats["corrupt"]
    again = poptorch.inferenceModel(model, options().enableExecutableCaching(str(cache)))
    torch.testing.assert_close(again(x), out, rtol=0, atol=0)
    assert cache_stats["corrupt"] == corrupt + 1 and "unusable" in caplog.text
    assert poptorch.Options().enableExecutableCaching(None).toDict()["executableCachePath"] \
        is None


def test_p69_cache_key_follows_model_code_state_and_inputs():
    opts = options()
    _, sig = flatten_inputs({"x": torch.ones(6, 4), "labels": None})
    _, sig2 = flatten_inputs({"x": torch.ones(5, 4), "labels": None})
    base = model_fingerprint(net(0), {}, opts, sig)
    assert model_fingerprint(net(1), {}, opts, sig) == base  # weights are not compiled in
    assert model_fingerprint(net(0), {}, opts, sig2) != base
    assert model_fingerprint(net(0), {}, options().deviceIterations(2), sig) != base
    assert model_fingerprint(net(0), {"": False}, opts, sig) != base
    other = net(0)
    other.fc2 = torch.nn.Linear(8, 4)
    assert model_fingerprint(other, {}, opts, sig) != base
    other = net(0)
    other.scale = 2.0  # a plain attribute forward could read
    assert model_fingerprint(other, {}, opts, sig) != base


def test_p69_training_cache_hit_trains_like_an_uncached_wrapper(tmp_path):
    results = []
    for cached in (False, True, True):  # plain, miss (writes), hit
        model = net(5).train()
        opts = options().enableExecutableCaching(str(tmp_path)) if cached else options()
        wrapper = poptorch.trainingModel(model, opts,
                                         poptorch.optim.Adam(model.parameters(), lr=0.01))
        hits = cache_stats["hits"]
        results.append(run_steps(wrapper, batches(0, 2)))
        wrapper.destroy()
    assert cache_stats["hits"] == hits + 1
    for losses, state in results[1:]:
        np.testing.assert_array_equal(losses, results[0][0])
        for name, value in state.items():
            np.testing.assert_array_equal(value, results[0][1][name])


def _rewrite(src: Path, dst: Path, edit_meta=None, tensors_json=None) -> Path:
    """A copy of ``src`` with edited metadata and consistent checksums (a crafted file)."""
    with zipfile.ZipFile(src) as archive:
        members = {i.filename: archive.read(i.filename) for i in archive.infolist()}
    header = json.loads(members["meta.json"])
    if tensors_json is not None:
        members["tensors.json"] = json.dumps(tensors_json(json.loads(
            members["tensors.json"]))).encode()
        header["sha256"]["tensors.json"] = hashlib.sha256(members["tensors.json"]).hexdigest()
    if edit_meta is not None:
        edit_meta(header["meta"])
    members["meta.json"] = json.dumps(header).encode()
    with zipfile.ZipFile(dst, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return dst


def test_p68_crafted_metadata_refused(exported, tmp_path):
    path = exported[0]

    def object_dtype(table):
        table[0]["dtype"] = "object"
        return table

    _refused(_rewrite(path, tmp_path / "obj.poptorch", tensors_json=object_dtype), "malformed")

    def torch_optimizer(meta):
        meta["optimizer"].update({"class": "SGD", "module": "torch.optim.sgd"})

    with pytest.raises(poptorch.Error, match="not one of poptorch_lite.optim"):
        poptorch.load(_rewrite(path, tmp_path / "opt.poptorch", torch_optimizer))

    def bad_tree(meta):
        meta["traced"]["treedef"] = '[1, {"type": "os.system", "context": "null"}]'

    _refused(_rewrite(path, tmp_path / "tree.poptorch", bad_tree), "malformed")
