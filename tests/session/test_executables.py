"""Session executables and the engine cache (F53): a fresh process continues a saved training
run bit for bit, the cache is hit by a second process, and bad files are refused before any
state changes (no code runs on load)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import popart_backend as popart
from popart_backend.executable.session_mixin import _sources_stamp, engine_cache_stats
from tests.session.executable_worker import STEPS, batches, make_session, run_steps
from tests.session.training_models import WEIGHTS

REPO = Path(__file__).resolve().parents[2]


def _worker(*args) -> None:
    subprocess.run([sys.executable, "-m", "tests.session.executable_worker", *map(str, args)],
                   cwd=REPO, check=True, timeout=300, capture_output=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Train STEPS steps, export, train STEPS more: the file and the continued run."""
    folder = tmp_path_factory.mktemp("exe")
    session = make_session()
    session.prepareDevice()
    session.weightsFromHost()
    run_steps(session, batches(0, STEPS))
    path = folder / "mlp.popart"
    session.saveExecutable(path)
    losses, weights = run_steps(session, batches(STEPS, STEPS))
    return path, losses, weights


def test_f53_fresh_process_continues_training_bit_identically(exported, tmp_path):
    path, losses, weights = exported
    out = tmp_path / "out.npz"
    _worker("train", path, out)
    with np.load(out, allow_pickle=False) as got:
        np.testing.assert_array_equal(got["losses"], losses)
        for name in WEIGHTS:
            np.testing.assert_array_equal(got[name], weights[name])


def test_f53_load_in_process_and_compile_and_export(exported, tmp_path):
    path, losses, _ = exported
    session = make_session()
    session.loadExecutable(path)
    session.prepareDevice()
    session.weightsFromHost()
    got, _ = run_steps(session, batches(STEPS, STEPS))
    np.testing.assert_array_equal(got, losses)
    fresh = make_session()
    fresh.compileAndExport(tmp_path / "new.popart")
    assert (tmp_path / "new.popart").is_file()


def _refused(path, match: str) -> None:
    session = make_session()
    before = {k: v.copy() for k, v in session._host_weights.items()}
    with pytest.raises(popart.popart_exception, match=match):
        session.loadExecutable(path)
    for k, v in before.items():  # never half-loaded
        np.testing.assert_array_equal(session._host_weights[k], v)


def test_f53_truncated_file_refused(exported, tmp_path):
    data = exported[0].read_bytes()
    for size in (0, 10, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{size}.popart"
        bad.write_bytes(data[:size])
        _refused(bad, "truncated|not a valid archive|checksum")


def test_f53_pickle_payload_refused_and_never_run(exported, tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "pickle.popart"
    with zipfile.ZipFile(exported[0]) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == "tensors.bin":
                data = pickle.dumps(Payload())
            dst.writestr(info.filename, data)
    _refused(bad, "checksum")
    plain = tmp_path / "plain.pkl"  # a pickle file given as an executable
    plain.write_bytes(pickle.dumps(Payload()))
    _refused(plain, "not a valid archive")
    assert not marker.exists()


def test_f53_version_mismatch_and_other_model_refused(exported, tmp_path):
    with zipfile.ZipFile(exported[0]) as src:
        members = {i.filename: src.read(i.filename) for i in src.infolist()}
    meta = json.loads(members["meta.json"])
    meta["versions"]["popart_backend"] = "0.0.0-other"
    members["meta.json"] = json.dumps(meta).encode()
    bad = tmp_path / "old.popart"
    with zipfile.ZipFile(bad, "w") as dst:
        for name, data in members.items():
            dst.writestr(name, data)
    _refused(bad, "versions")
    meta["versions"] = json.loads(zipfile.ZipFile(exported[0]).read("meta.json"))["versions"]
    meta["meta"]["fingerprint"]["ir"] = "0" * 64
    members["meta.json"] = json.dumps(meta).encode()
    with zipfile.ZipFile(bad, "w") as dst:
        for name, data in members.items():
            dst.writestr(name, data)
    _refused(bad, "different ir")


def test_f53_engine_cache_concurrent_writers_hit_in_another_process_corrupt_entry(tmp_path,
                                                                                 caplog):
    """Two processes compile at once; this (third) process then hits their entry."""
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.session.executable_worker", mode,
                               str(cache), str(tmp_path / f"s{i}.json")], cwd=REPO,
                              env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
             for i, (mode, env) in enumerate((("cache", {}),
                                              ("cacheenv", {"POPART_CACHE_DIR": str(cache)})))]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    for index in range(2):
        stats = json.loads((tmp_path / f"s{index}.json").read_text())
        assert stats["hits"] + stats["misses"] == 1 and stats["writes"] == stats["misses"]
    entries = list(cache.glob("*.popart"))
    assert len(entries) == 1 and not list(cache.glob(".*.tmp"))
    options = popart.SessionOptions()
    options.enableEngineCaching = True
    options.cachePath = str(cache)
    stats = engine_cache_stats
    hits = stats["hits"]
    # The key hashes the device model's sources as this process first saw them; other edits of
    # the tree since then would make it (rightly) miss the workers' entry.
    _sources_stamp.cache_clear()
    make_session(options).prepareDevice()  # the concurrent writers left a valid entry
    assert stats["hits"] == hits + 1
    entries[0].write_bytes(entries[0].read_bytes()[:50])
    corrupt = stats["corrupt"]
    make_session(options).prepareDevice()
    assert stats["corrupt"] == corrupt + 1
    assert "unusable" in caplog.text
    make_session(options).prepareDevice()  # rebuilt
    assert stats["hits"] == hits + 2


def test_f53_save_needs_compiled_session_and_refuses_no_metadata(tmp_path):
    session = make_session()
    with pytest.raises(popart.popart_exception, match="prepareDevice"):
        session.saveExecutable(tmp_path / "x.popart")
    session.prepareDevice()
    with pytest.raises(popart.popart_exception, match="savePopartMetadata"):
        session.saveExecutable(tmp_path / "x.popart", savePopartMetadata=False)
    with pytest.raises(popart.popart_exception, match="engine caching is off"):
        session.updateEngineCache()
    assert not os.path.exists(tmp_path / "x.popart")
