"""The sessions' executable methods (F53): ``compileAndExport``, ``saveExecutable``,
``loadExecutable``, ``updateEngineCache`` and the engine cache of ``enableEngineCaching``.

An executable file (``executable/__init__.py``) of a session holds a fingerprint of what was
compiled (the IR after the passes, the options, the data flow, the device size), the variables
(weights, optimizer state, accumulators; as the device holds them when saved) and the RNG seed
and state. ``loadExecutable`` checks the fingerprint against this session's, every variable's
name, shape and dtype, and only then replaces the session's host variables and seed: the
following ``prepareDevice(); weightsFromHost()`` continues exactly where the saved session was.

The engine cache (``enableEngineCaching``, folder ``cachePath``, or the environment variable
``POPART_CACHE_DIR``): ``prepareDevice`` looks for ``<folder>/<key>.popart``. The key hashes the
same fingerprint (the IR after the passes, hence the input signature), the device (its full
spec, type and sync pattern), the builder's input settings and output locations, the package
versions and the device model's sources (path, size and modification time of device/, ops/,
ir/ and the tensor locations: an edit there misses). As in PopART the IR is still built on a
hit (the key hashes it); what a hit skips is our equivalent of the Poplar compile, the device
model's analysis (``device.analysis.analyse``): the entry stores its result as JSON and arrays
(``device/model_io.py``) with the warnings the analysis logged, so memory, cycles, reports,
the fit verdict and the warnings are those of a miss. An entry is written on a miss even when
the model does not fit, so a hit raises the same ``OutOfMemoryException``. Hits, misses,
writes and corrupt entries are counted (``engine_cache_stats``); a corrupted entry is logged
once and written again.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ..device.analysis import DeviceModel
from ..device.model_io import model_from_json, model_to_json
from ..errors import popart_exception
from ..ir.dump import ir_to_json
from ..logging import MODULES as LOGGERS
from ..tensorinfo import input_settings_from_model
from ..transforms.tensor_locations import output_locations_from_model
from . import read_executable_file, write_executable_file

__all__ = ["ExecutableMixin", "engine_cache_stats"]

_log = logging.getLogger("popart:session")
_SESSION_KIND = "popart-session"
_ENGINE_KIND = "popart-engine-cache"
# Options that say where and whether to cache: not part of what is compiled.
_NOT_COMPILED = frozenset({"enableEngineCaching", "cachePath", "enableVariablesCaching",
                           "compilationProgressLogger", "logDir"})

# Counters of the engine cache in this process: hits, misses, writes, corrupt entries.
engine_cache_stats = {"hits": 0, "misses": 0, "writes": 0, "corrupt": 0}
_WARNED: set[str] = set()


def _versions() -> dict[str, str]:
    package = sys.modules[__name__.split(".")[0]]
    return {"popart_backend": getattr(package, "__version__", "unknown")}


# The sources the device model's analysis runs (what an entry stores): an edit misses.
_ANALYSIS_SOURCES = ("device", "ops", "ir", "transforms/tensor_locations.py")


@functools.lru_cache(maxsize=1)
def _sources_stamp() -> str:
    """A hash of the analysis' source files (relative path, size, modification time), once per
    process: an engine cache entry written by other device-model code is never reused."""
    root = Path(__file__).resolve().parents[1]
    paths = []
    for name in _ANALYSIS_SOURCES:
        path = root / name
        paths.extend(path.rglob("*.py") if path.is_dir() else [path])
    digest = hashlib.sha256()
    for path in sorted(paths):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _options_text(options) -> str:
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
              if f.name not in _NOT_COMPILED}
    return repr(sorted((k, sorted(map(repr, v)) if isinstance(v, set) else repr(v))
                       for k, v in values.items()))


class _Capture(logging.Handler):
    """The warnings (and worse) logged while the device model is analysed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.warnings: list[list] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.warnings.append([record.name, record.levelno, record.getMessage()])


class ExecutableMixin:
    """See the module docstring. Uses the session's ``_ir``, ``_model``, ``_options``,
    ``_data_flow``, ``_device_info``, ``_device``, ``_program`` and ``_host_weights``."""

    _pending_rng_state = None
    _loaded_executable = ""

    # --- fingerprint --------------------------------------------------------------------------

    def _fingerprint(self) -> dict[str, str]:
        if "_fingerprint_cache" not in self.__dict__:
            ir_text = json.dumps(ir_to_json(self._ir, self._model.proto.graph.name),
                                 sort_keys=True, default=str)
            flow = self._data_flow
            flow_text = repr((flow.batchesPerStep(), sorted(
                (a, repr(flow.art(a).id()), flow.art(a).rp()) for a in flow.anchors())))
            parts = {"kind": type(self).__name__, "ir": ir_text,
                     "options": _options_text(self._options), "dataflow": flow_text,
                     "device": repr((self._device_info.numIpus, type(self._device_info.spec)))}
            self.__dict__["_fingerprint_cache"] = {
                k: hashlib.sha256(v.encode()).hexdigest() for k, v in parts.items()}
        return self.__dict__["_fingerprint_cache"]

    # --- executables --------------------------------------------------------------------------

    def compileAndExport(self, filename) -> None:
        """Compile (OutOfMemoryException if the model does not fit) and write the executable
        with its variables to ``filename``, without loading it on the device."""
        self.prepareDevice(loadEngine=False)
        self.saveExecutable(filename)

    def saveExecutable(self, path, savePopartMetadata: bool = True,
                       saveVariables: bool = True) -> None:
        """Write the compiled executable to ``path`` (a folder gets ``executable.popart``).
        Needs ``prepareDevice()`` (or ``compileAndExport``)."""
        if not savePopartMetadata:
            raise popart_exception(
                "saveExecutable(savePopartMetadata=False) is not supported: the metadata is what "
                "loadExecutable checks the file against. Leave it True.")
        if self._device is None:
            raise popart_exception(
                f"saveExecutable('{path}'): nothing is compiled yet; call "
                f"session.prepareDevice() (or compileAndExport) first.")
        target = Path(path)
        if target.is_dir():
            target = target / "executable.popart"
        variables = self._saved_variables() if saveVariables else {}
        rng = None
        if self._engine_loaded and self._options.enableLoadAndOffloadRNGState:
            rng = self._device.rng_state()
        meta = {"fingerprint": self._fingerprint(), "name": self.name,
                "seed": self._random_seed, "rng_state": rng, "variables": bool(saveVariables)}
        write_executable_file(target, _SESSION_KIND, _versions(), meta, b"", variables)
        _log.info("%s '%s': executable written to '%s'", type(self).__name__, self.name, target)

    def _saved_variables(self) -> dict:
        """Every variable (weights, optimizer state, accumulators) as the device holds it
        when its weights were written, else the host copies (also used by poptorch_lite)."""
        variables = {k: v.copy() for k, v in self._host_weights.items()}
        if self._device is not None and self._engine_loaded and not self._offline() \
                and self._weights_written:
            variables.update(self._device.read_weights(self._program.weights))
        return variables

    def loadExecutable(self, filename) -> None:
        """Load an executable written by ``compileAndExport`` / ``saveExecutable`` of the same
        model, options and data flow: its variables and RNG state replace this session's. Call
        it before ``prepareDevice()``, then ``weightsFromHost()``."""
        if self._device is not None:
            raise popart_exception(
                f"loadExecutable('{filename}'): the session is already compiled; call "
                f"loadExecutable before prepareDevice().")
        contents = read_executable_file(filename, _SESSION_KIND, _versions())
        meta = contents.meta
        mine = self._fingerprint()
        theirs = meta.get("fingerprint")
        if not isinstance(theirs, dict) or theirs != mine:
            differ = sorted(k for k in mine if not isinstance(theirs, dict)
                            or theirs.get(k) != mine[k])
            raise popart_exception(
                f"loadExecutable('{filename}'): the file was compiled from a different "
                f"{', '.join(differ)} than this session's. Build the session with the same "
                f"model, options and data flow as the one that exported it.")
        variables = contents.tensors
        if meta.get("variables"):
            mismatched = sorted(set(variables) ^ set(self._host_weights)) + sorted(
                k for k in set(variables) & set(self._host_weights)
                if variables[k].shape != self._host_weights[k].shape
                or variables[k].dtype != self._host_weights[k].dtype)
            if mismatched:
                raise popart_exception(
                    f"loadExecutable('{filename}'): the variables {mismatched[:5]} differ in "
                    f"name, shape or dtype from this session's. The file does not belong to "
                    f"this model.")
        seed, rng = meta.get("seed"), meta.get("rng_state")
        if type(seed) is not int or not (rng is None or (
                isinstance(rng, list) and all(type(v) is int for v in rng))):
            raise popart_exception(f"loadExecutable('{filename}'): malformed RNG metadata.")
        # Everything checked: now change the session.
        for key, value in variables.items():
            self._host_weights[key][...] = value
        self._random_seed = seed
        self._pending_rng_state = rng
        self._loaded_executable = str(filename)
        _log.info("%s '%s': executable loaded from '%s'", type(self).__name__, self.name,
                  filename)

    def _device_built(self) -> None:
        """Called by prepareDevice once the device exists: restore a loaded RNG state."""
        if self._pending_rng_state is not None:
            self._device.set_rng_state(self._pending_rng_state)
            self._pending_rng_state = None

    # --- engine cache -------------------------------------------------------------------------

    def _cache_file(self) -> Path | None:
        folder = os.environ.get("POPART_CACHE_DIR") or (
            self._options.cachePath if self._options.enableEngineCaching else "")
        if not folder:
            return None
        if "_engine_key" not in self.__dict__:
            info, proto = self._device_info, self._model.proto
            settings = input_settings_from_model(proto) if proto is not None else {}
            outputs = output_locations_from_model(proto) if proto is not None else {}
            engine = repr((info.spec, info.type.name, info.numIpus,
                           str(getattr(info, "syncPattern", None)),
                           sorted((k, repr(v)) for k, v in settings.items()),
                           sorted((k, repr(v)) for k, v in outputs.items())))
            text = json.dumps([self._fingerprint(), _versions(), engine, _sources_stamp()],
                              sort_keys=True)
            self.__dict__["_engine_key"] = hashlib.sha256(text.encode()).hexdigest()[:32]
        return Path(folder) / f"{self.__dict__['_engine_key']}.popart"

    def _cached_device_model(self) -> DeviceModel | None:
        """prepareDevice's engine cache lookup: the stored device model on a hit, None on a
        miss, on an unusable entry (logged once, counted; rewritten after the analysis) or
        with caching off."""
        entry = self._cache_file()
        if entry is None or not entry.exists():
            return None
        collecting = gc.isenabled()
        gc.disable()  # a burst of long-lived objects: cyclic GC passes over them are wasted
        try:
            contents = read_executable_file(entry, _ENGINE_KIND, _versions())
            if contents.meta.get("fingerprint") != self._fingerprint():
                raise popart_exception(f"'{entry}' holds another model's engine.")
            model = model_from_json(contents.meta.get("device_model"), contents.tensors)
            warnings = contents.meta.get("warnings")
            if not isinstance(warnings, list) or not all(
                    isinstance(w, list) and len(w) == 3 and w[0] in LOGGERS.values()
                    and type(w[1]) is int and isinstance(w[2], str) for w in warnings):
                raise popart_exception(f"'{entry}' has malformed warnings.")
        except popart_exception as exc:
            engine_cache_stats["corrupt"] += 1
            if str(entry) not in _WARNED:
                _WARNED.add(str(entry))
                _log.warning("Engine cache entry '%s' is unusable (%s); compiling again "
                             "and replacing it.", entry, exc)
            return None
        finally:
            if collecting:
                gc.enable()
        engine_cache_stats["hits"] += 1
        _log.info("Engine cache hit: '%s' (the device model's memory and cycles are loaded "
                  "from it instead of being computed)", entry)
        for name, level, message in warnings:  # what the analysis logged when it ran
            logging.getLogger(name).log(level, "%s", message)
        return model

    def _computed_device_model(self, analyse: Callable[[], DeviceModel]) -> DeviceModel:
        """prepareDevice found no usable entry: run ``analyse`` and, with caching on, write the
        entry before the fit check (a model that does not fit is cached too), with the
        warnings the analysis logged, which a hit logs again."""
        if self._cache_file() is None:
            return analyse()
        capture = _Capture()
        loggers = [logging.getLogger(name) for name in sorted(set(LOGGERS.values()))]
        for logger in loggers:
            logger.addHandler(capture)
        try:
            model = analyse()
        finally:
            for logger in loggers:
                logger.removeHandler(capture)
        engine_cache_stats["misses"] += 1
        self._write_engine_entry(model, capture.warnings)
        return model

    def _write_engine_entry(self, model: DeviceModel, warnings: list | None = None) -> None:
        entry = self._cache_file()
        collecting = gc.isenabled()
        gc.disable()  # a burst of acyclic temporaries, freed by reference counting
        try:
            document, arrays = model_to_json(model)
            write_executable_file(entry, _ENGINE_KIND, _versions(),
                                  {"fingerprint": self._fingerprint(), "name": self.name,
                                   "device_model": document, "warnings": warnings or []},
                                  b"", arrays)
        except popart_exception as exc:
            _log.warning("Engine cache entry '%s' not written: %s", entry, exc)
            return
        finally:
            if collecting:
                gc.enable()
        engine_cache_stats["writes"] += 1
        _log.info("Engine cache entry written: '%s'", entry)

    def updateEngineCache(self) -> None:
        """Write (or replace) this session's engine cache entry; needs ``enableEngineCaching``
        (or ``POPART_CACHE_DIR``) and a compiled session."""
        entry = self._cache_file()
        if entry is None:
            raise popart_exception(
                "updateEngineCache(): engine caching is off; set "
                "SessionOptions.enableEngineCaching = True (and cachePath) or POPART_CACHE_DIR.")
        if self._device is None or self._device_model is None:
            raise popart_exception("updateEngineCache(): call prepareDevice() first.")
        self._write_engine_entry(self._device_model)
