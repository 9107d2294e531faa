"""The sessions' executable methods (F53): ``compileAndExport``, ``saveExecutable``,
``loadExecutable``, ``updateEngineCache`` and the engine cache of ``enableEngineCaching``.

An executable file (``executable/__init__.py``) of a session holds a fingerprint of what was
compiled (the IR after the passes, the options, the data flow, the device size), the variables
(weights, optimizer state, accumulators; as the device holds them when saved) and the RNG seed
and state. ``loadExecutable`` checks the fingerprint against this session's, every variable's
name, shape and dtype, and only then replaces the session's host variables and seed: the
following ``prepareDevice(); weightsFromHost()`` continues exactly where the saved session was.

The engine cache (``enableEngineCaching``, folder ``cachePath``, or the environment variable
``POPART_CACHE_DIR``): ``prepareDevice`` looks for ``<folder>/<key>.popart``, where the key
hashes the same fingerprint and the package versions. The simulator's compile is the IR passes,
which the session runs when it is built; an entry records that compile and a hit is logged and
counted (``engine_cache_stats``). A corrupted entry is logged once and written again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

from ..errors import popart_exception
from ..ir.dump import ir_to_json
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


def _options_text(options) -> str:
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
              if f.name not in _NOT_COMPILED}
    return repr(sorted((k, sorted(map(repr, v)) if isinstance(v, set) else repr(v))
                       for k, v in values.items()))


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
        """Called by prepareDevice once the device exists: restore a loaded RNG state and
        look up / write the engine cache."""
        if self._pending_rng_state is not None:
            self._device.set_rng_state(self._pending_rng_state)
            self._pending_rng_state = None
        self._engine_cache()

    # --- engine cache -------------------------------------------------------------------------

    def _cache_file(self) -> Path | None:
        folder = os.environ.get("POPART_CACHE_DIR") or (
            self._options.cachePath if self._options.enableEngineCaching else "")
        if not folder:
            return None
        key = hashlib.sha256(json.dumps([self._fingerprint(), _versions()],
                                        sort_keys=True).encode()).hexdigest()[:32]
        return Path(folder) / f"{key}.popart"

    def _engine_cache(self) -> None:
        entry = self._cache_file()
        if entry is None:
            return
        if entry.exists():
            try:
                contents = read_executable_file(entry, _ENGINE_KIND, _versions())
                if contents.meta.get("fingerprint") != self._fingerprint():
                    raise popart_exception(f"'{entry}' holds another model's engine.")
            except popart_exception as exc:
                engine_cache_stats["corrupt"] += 1
                if str(entry) not in _WARNED:
                    _WARNED.add(str(entry))
                    _log.warning("Engine cache entry '%s' is unusable (%s); compiling again "
                                 "and replacing it.", entry, exc)
            else:
                engine_cache_stats["hits"] += 1
                _log.info("Engine cache hit: '%s' (on the simulator the compile is the IR "
                          "passes, which ran when the session was built; the hit is recorded, "
                          "nothing else is loaded)", entry)
                return
        engine_cache_stats["misses"] += 1
        self.updateEngineCache()

    def updateEngineCache(self) -> None:
        """Write (or replace) this session's engine cache entry; needs ``enableEngineCaching``
        (or ``POPART_CACHE_DIR``) and a compiled session."""
        entry = self._cache_file()
        if entry is None:
            raise popart_exception(
                "updateEngineCache(): engine caching is off; set "
                "SessionOptions.enableEngineCaching = True (and cachePath) or POPART_CACHE_DIR.")
        if self._device is None:
            raise popart_exception("updateEngineCache(): call prepareDevice() first.")
        write_executable_file(entry, _ENGINE_KIND, _versions(),
                              {"fingerprint": self._fingerprint(), "name": self.name})
        engine_cache_stats["writes"] += 1
        _log.info("Engine cache entry written: '%s'", entry)
