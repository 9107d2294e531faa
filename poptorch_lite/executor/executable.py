"""Executables and the executable cache of the wrappers (P30, P67-P69).

``ExecutableMixin`` gives ``PoplarExecutor`` ``compileAndExport``, ``save`` and
``loadExecutable``, and ``load()`` rebuilds a wrapper from a file. The file is the backend's
safe container (``popart_backend.write_executable_file``: a zip of JSON, ONNX and raw arrays;
nothing pickled, nothing evaluated on load) holding

- the traced model: the ONNX graph and every table the wrapper needs to feed and read it
  (input signature, input/output names, pytree structures as JSON), so nothing is traced again;
- the model's parameters and buffers, and the session's variables (optimizer state,
  accumulators) as the device held them, and the RNG state;
- the options (``Options.toDict()``), the train/eval flags, the package versions.

The cache (``Options.enableExecutableCaching(dir)`` or ``POPTORCH_CACHE_DIR``) keys an entry
on a fingerprint computed *without tracing*: the model's classes (the source files that define
them), their plain attributes, parameter and buffer names, shapes and dtypes, the train/eval
flags, the options, the input signature and the package versions. A hit skips tracing and the
ONNX export (the slow part of compiling); the session is built from the stored graph with the
model's current weights. ``forward`` must therefore depend only on the module's code, its
attributes and its state (not on global variables changed between runs). Entries are written
atomically under a file lock (one process compiles, the others then hit); a corrupted entry is
logged once, compiled again and replaced. ``cache_stats`` counts hits, misses and writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch.utils import _pytree as pytree

import popart_backend as popart

from .. import optim, tracing
from ..errors import Error
from ..options.options import Options
from .compilation import _Executable, _post_compile_hooks, _pre_compile_hooks, backend_error

__all__ = ["ExecutableMixin", "ExportedModule", "cache_stats", "prepare_load"]

_log = logging.getLogger("poptorch_lite")
_EXE_KIND = "poptorch-lite-executable"
_CACHE_KIND = "poptorch-lite-cache"
# Options that may differ between the wrapper that saved a file and the one that loads it:
# where the device is and how compiling reports itself, not what is compiled.
_RUNTIME_OPTIONS = frozenset({"useIpuId", "useIpuModel", "connectionType", "syncPattern",
                              "executableCachePath", "showCompilationProgressBar",
                              "logDir", "modelName"})
cache_stats = {"hits": 0, "misses": 0, "writes": 0, "corrupt": 0}
_WARNED: set[str] = set()
_PLAIN = (bool, int, float, str, type(None))


def _versions() -> dict[str, str]:
    lite = sys.modules.get("poptorch_lite")
    return {"poptorch_lite": getattr(lite, "__version__", "unknown"),
            "popart_backend": popart.__version__, "torch": torch.__version__,
            "onnx": onnx.__version__}


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN) and not (isinstance(value, float) and math.isnan(value))


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise Error(f"the executable names an unknown torch dtype {name!r}; it is damaged.")
    return value


# --- the traced model as JSON ----------------------------------------------------------------

def _traced_to_json(traced: tracing.TracedModel) -> dict:
    constants = {str(k): v for k, v in traced.output_constants.items()}
    leaves = []
    for leaf in traced.signature.leaves:
        if not leaf.is_tensor and not _plain(leaf.value):
            raise Error(f"input {leaf.path} is a {type(leaf.value).__name__} constant, which an "
                        f"executable cannot store; pass numbers, strings or tensors.")
        leaves.append({"path": leaf.path, "is_tensor": leaf.is_tensor,
                       "dtype": str(leaf.dtype).removeprefix("torch.") if leaf.is_tensor
                       else None, "shape": list(leaf.shape), "value": leaf.value})
    if not _plain(list(constants.values())):
        raise Error("forward returns non-tensor values that are not plain numbers or strings; "
                    "an executable cannot store them.")
    try:
        treedef = pytree.treespec_dumps(traced.signature.treedef)
        output_spec = pytree.treespec_dumps(traced.output_spec)
    except Exception as exc:  # any type pytree cannot serialise: say which structure
        raise Error(f"the inputs or outputs of forward have a structure an executable cannot "
                    f"store ({exc}); use tensors in tuples, lists and dicts.") from exc
    return {"treedef": treedef, "leaves": leaves, "input_names": traced.input_names,
            "output_names": traced.output_names, "output_spec": output_spec,
            "output_constants": constants,
            "output_leaf_sources": traced.output_leaf_sources,
            "param_map": traced.param_map, "node_locations": traced.node_locations,
            "exporter": traced.exporter, "updated_buffers": list(traced.updated_buffers),
            "updated_parameters": list(traced.updated_parameters),
            "input_updates": [list(u) for u in traced.input_updates],
            "mutation_locations": traced.mutation_locations}


def _traced_from_json(meta: dict, model: bytes) -> tracing.TracedModel:
    try:
        proto = onnx.load_from_string(model)
        leaves = tuple(tracing.LeafSpec(
            str(leaf["path"]), bool(leaf["is_tensor"]),
            _dtype(leaf["dtype"]) if leaf["is_tensor"] else None,
            tuple(int(d) for d in leaf["shape"]), leaf["value"]) for leaf in meta["leaves"])
        signature = tracing.InputSignature(pytree.treespec_loads(meta["treedef"]), leaves)
        return tracing.TracedModel(
            proto=proto, signature=signature, input_names=list(meta["input_names"]),
            output_names=list(meta["output_names"]),
            output_spec=pytree.treespec_loads(meta["output_spec"]),
            output_constants={int(k): v for k, v in meta["output_constants"].items()},
            output_leaf_sources=list(meta["output_leaf_sources"]),
            param_map=dict(meta["param_map"]), node_locations=dict(meta["node_locations"]),
            exporter=str(meta["exporter"]), updated_buffers=tuple(meta["updated_buffers"]),
            updated_parameters=tuple(meta["updated_parameters"]),
            input_updates=tuple((int(i), str(n)) for i, n in meta["input_updates"]),
            mutation_locations=dict(meta["mutation_locations"]))
    except Error:
        raise
    except Exception as exc:  # a crafted file: any malformed field, reported as one error
        raise Error(f"the executable's traced model is malformed ({type(exc).__name__}: "
                    f"{exc}); export it again.") from exc


# --- the cache key (no tracing) --------------------------------------------------------------

def _class_code(cls: type, seen: dict) -> None:
    for klass in cls.__mro__:
        module = klass.__module__ or ""
        if module.split(".")[0] in ("torch", "poptorch_lite", "builtins") or klass in seen:
            continue
        try:
            seen[klass] = inspect.getsource(sys.modules[module])
        except (OSError, TypeError, KeyError):  # no source file: hash the code objects
            seen[klass] = repr([(name, getattr(value, "__code__", None) and
                                 value.__code__.co_code.hex())
                                for name, value in sorted(vars(klass).items())])


def model_fingerprint(model: torch.nn.Module, flags: dict, options: Options,
                      signature: tracing.InputSignature) -> str:
    """What determines the traced graph, hashed without tracing (see the module docstring)."""
    digest = hashlib.sha256()
    code: dict = {}
    for path, module in model.named_modules(remove_duplicate=False):
        _class_code(type(module), code)
        attrs = []
        for name, value in sorted(vars(module).items()):
            if name in ("_parameters", "_buffers", "_modules") or name.endswith("hooks"):
                continue
            if _plain(value):
                attrs.append((name, value))
            elif isinstance(value, torch.Tensor):
                attrs.append((name, hashlib.sha256(value.detach().cpu().numpy().tobytes())
                              .hexdigest(), str(value.dtype), tuple(value.shape)))
        state = [(n, tuple(t.shape), str(t.dtype), bool(t.requires_grad))
                 for n, t in (*module._parameters.items(), *module._buffers.items())
                 if t is not None]
        hooks = [getattr(h, "__qualname__", repr(type(h)))
                 for h in module._forward_pre_hooks.values()]
        digest.update(repr((path, type(module).__qualname__, attrs, state, hooks,
                            flags.get(path))).encode())
    for klass, text in sorted(code.items(), key=lambda kv: kv[0].__qualname__):
        digest.update(klass.__qualname__.encode() + text.encode())
    values = {k: v for k, v in options.toDict().items() if k != "executableCachePath"}
    digest.update(json.dumps(values, sort_keys=True, default=str).encode())
    digest.update(repr(signature.key()).encode())
    digest.update(json.dumps(_versions(), sort_keys=True).encode())
    return digest.hexdigest()[:32]


@contextlib.contextmanager
def _locked(entry: Path):
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_suffix(".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path, kind: str):
    try:
        return popart.read_executable_file(path, kind, _versions())
    except popart.popart_exception as exc:
        raise Error(str(exc)) from exc


def _state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = dict(model.named_parameters())
    state.update(model.named_buffers())
    return state


def _refresh_initializers(traced: tracing.TracedModel, model: torch.nn.Module) -> None:
    """The model's current values into the traced graph's initializers (what tracing bakes)."""
    state = _state_of(model)
    for init in traced.proto.graph.initializer:
        fqn = traced.param_map.get(init.name)
        if fqn is None:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        value = state[fqn].detach().cpu().numpy().astype(dtype)
        if tuple(value.shape) != tuple(init.dims):
            raise Error(f"'{fqn}' has shape {tuple(value.shape)} but the executable was "
                        f"compiled with {tuple(init.dims)}.")
        init.CopyFrom(numpy_helper.from_array(value, init.name))


class ExecutableMixin:
    """``PoplarExecutor``'s executable files and cache (see the module docstring)."""

    # --- the cache -------------------------------------------------------------------------

    def _compile(self, leaves, signature) -> _Executable:
        folder = self._options.toDict().get("executableCachePath")
        if not folder:
            return super()._compile(leaves, signature)
        key = model_fingerprint(self._user_model, self._flags, self._options, signature)
        entry = Path(folder) / f"{key}.plite"
        with _locked(entry):
            traced = self._cached_trace(entry, signature) if entry.exists() else None
            if traced is not None:
                cache_stats["hits"] += 1
                _log.info("executable cache hit: '%s' (tracing skipped)", entry)
                return self._compile_traced(traced)
            cache_stats["misses"] += 1
            executable = super()._compile(leaves, signature)
            try:
                meta = {"traced": _traced_to_json(executable.traced), "key": key}
            except Error as exc:
                _log.info("executable cache: this model is not cached (%s)", exc)
                return executable
            popart.write_executable_file(entry, _CACHE_KIND, _versions(), meta,
                                         executable.traced.proto.SerializeToString())
            cache_stats["writes"] += 1
            _log.info("executable cache entry written: '%s'", entry)
        return executable

    def _cached_trace(self, entry: Path, signature) -> tracing.TracedModel | None:
        try:
            contents = _read(entry, _CACHE_KIND)
            traced = _traced_from_json(contents.meta["traced"], contents.model)
            if traced.signature.key() != signature.key():
                raise Error("it was compiled for another input signature")
            self._pull_host()  # the current weights go into the stored graph
            _refresh_initializers(traced, self._user_model)
            return traced
        except (Error, KeyError, TypeError) as exc:
            cache_stats["corrupt"] += 1
            if str(entry) not in _WARNED:
                _WARNED.add(str(entry))
                _log.warning("executable cache entry '%s' is unusable (%s); compiling again "
                             "and replacing it.", entry, exc)
            return None

    def _compile_traced(self, traced: tracing.TracedModel) -> _Executable:
        """``_compile`` from a stored traced model: the checks, placement and session, no
        tracing. The initializers already hold the model's current values."""
        for hook in _pre_compile_hooks:
            hook()
        start = time.monotonic()
        divisor = tracing.check_combined_batch(traced.signature, self._options)
        self._check_int64_state(traced.param_map.values())
        tracing.check_supported(traced)
        if self._training:
            self._check_batch_norms()
        self._check_replicated_buffers(traced)
        self._check_mutations(traced, divisor)
        placement = self._place(traced)
        session, translation, anchored = self._build_session(traced, placement)
        executable = _Executable(traced, session, divisor,
                                 self._device_weight_map(session, traced), translation)
        executable.placement = placement
        executable.anchored = anchored
        executable.buffer_layout = [(path, m, tuple(m._buffers))
                                    for path, m in self._user_model.named_modules()]
        self.__dict__["_compile_seconds"] = time.monotonic() - start
        if not self._offline():
            self.__dict__["_attached"] = True
        for hook in _post_compile_hooks:
            hook()
        return executable

    # --- files -----------------------------------------------------------------------------

    def compileAndExport(self, filename, *args, export_model: bool = True,
                         **kwargs) -> None:
        """Compile for these inputs (without running) and ``save`` to ``filename``."""
        if not self.isCompiled():
            self.compile(*args, **kwargs)
        self.save(filename, export_model=export_model)

    def save(self, filename, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Write the compiled executable, the weights, the optimizer state and (with
        ``save_rng_state``) the RNG state; ``export_model`` also stores the module tree, so
        ``poptorch_lite.load`` can rebuild a wrapper without the model's code."""
        executable = self._require_compiled("save()")
        target = Path(filename)
        if target.is_dir():
            target = target / "model.poptorch"
            warnings.warn(f"save(): '{filename}' is a folder; writing '{target}'.",
                          UserWarning, stacklevel=2)
        self._pull_host()
        state = {f"state/{k}": v.detach().cpu().numpy() for k, v in
                 _state_of(self._user_model).items()}
        variables = {}
        if self._attached and not self._offline():
            variables = {f"variables/{k}": v for k, v in
                         executable.session._saved_variables().items()}
        rng = self.rng_state if save_rng_state and (
            self._attached or self._rng_state_host is not None) else None
        meta = {"traced": _traced_to_json(executable.traced), "training": self._training,
                "options": self._options.toDict(), "flags": self._flags, "rng_state": rng,
                "model": _model_tree(self._user_model, self._running_stat_names())
                if export_model else None,
                "optimizer": _optimizer_meta(self._optimizer, self._user_model)
                if self._training and export_model else None}
        try:
            popart.write_executable_file(target, _EXE_KIND, _versions(), meta,
                                         executable.traced.proto.SerializeToString(),
                                         {**state, **variables})
        except popart.popart_exception as exc:
            raise Error(str(exc)) from exc
        _log.info("executable written to '%s'", target)

    def loadExecutable(self, filename) -> None:
        """Load a file of ``compileAndExport`` / ``save`` for this model: its weights,
        optimizer and RNG state replace the wrapper's; nothing is traced or compiled again."""
        if self.isCompiled():
            raise Error(f"loadExecutable('{filename}'): the wrapper is already compiled; load "
                        f"into a new wrapper (or call destroy() first).")
        contents = _read(filename, _EXE_KIND)
        self._load_contents(contents, filename)

    def _load_contents(self, contents, filename) -> None:
        meta = contents.meta
        where = f"loadExecutable('{filename}')"
        if meta.get("training") is not self._training:
            kind = "training" if meta.get("training") else "inference"
            raise Error(f"{where}: the file holds a {kind} executable; load it into a wrapper "
                        f"of that kind.")
        saved = meta.get("options") or {}
        mine = json.loads(json.dumps(self._options.toDict(), default=str))
        differ = sorted(k for k in set(saved) | set(mine)
                        if k not in _RUNTIME_OPTIONS and saved.get(k) != mine.get(k))
        if differ:
            raise Error(f"{where}: the options differ from the saved ones in {differ[:6]}; "
                        f"build the wrapper with the options it was saved with.")
        traced = _traced_from_json(meta.get("traced") or {}, contents.model)
        state = _state_of(self._user_model)
        saved_state = {k[6:]: v for k, v in contents.tensors.items() if k.startswith("state/")}
        wrong = sorted(set(saved_state) ^ set(state)) + sorted(
            k for k in set(saved_state) & set(state)
            if tuple(saved_state[k].shape) != tuple(state[k].shape)
            or str(torch.from_numpy(saved_state[k][...]).dtype) != str(state[k].dtype))
        if wrong:
            raise Error(f"{where}: the parameters / buffers {wrong[:6]} differ in name, shape "
                        f"or dtype from the wrapped model's; the file belongs to another model.")
        variables = {k[10:]: v for k, v in contents.tensors.items()
                     if k.startswith("variables/")}
        rng = meta.get("rng_state")
        if rng is not None and not (isinstance(rng, list) and all(type(v) is int for v in rng)):
            raise Error(f"{where}: the saved RNG state is malformed.")
        # Everything checked: change the wrapper.
        with torch.no_grad():
            for fqn, value in saved_state.items():
                state[fqn].copy_(torch.from_numpy(value))
        _refresh_initializers(traced, self._user_model)
        executable = self._compile_traced(traced)
        self._executables[traced.signature.key()] = executable
        self.__dict__["_active"] = executable
        if variables and self._attached:
            try:
                executable.session.writeWeights(popart.PyWeightsIO(variables))
                executable.session.weightsFromHost()
            except popart.popart_exception as exc:
                raise backend_error(exc, traced) from exc
            if self._training:
                self.__dict__["_optimizer_state_dirty"] = True
        if rng is not None:
            self.rng_state = rng
        _log.info("executable loaded from '%s'", filename)


def _model_tree(model: torch.nn.Module, running_stats) -> dict:
    params = {name: bool(p.requires_grad) for name, p in model.named_parameters()}
    forward = []
    for p in inspect.signature(model.forward).parameters.values():
        default = None if p.default is inspect.Parameter.empty else p.default
        forward.append([p.name, int(p.kind), p.default is not inspect.Parameter.empty,
                        default if _plain(default) else None])
    return {"modules": [path for path, _ in model.named_modules() if path],
            "parameters": params, "buffers": [name for name, _ in model.named_buffers()],
            "running_stats": sorted(running_stats), "forward": forward}


def _optimizer_meta(optimizer, model: torch.nn.Module) -> dict | None:
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    unsupported = set()
    for group in optimizer.param_groups:
        values, dtypes = {}, {}
        for key, value in group.items():
            if key == "params":
                continue
            if isinstance(value, torch.dtype):
                dtypes[key] = str(value).removeprefix("torch.")
            elif _plain(value):
                values[key] = value
            else:
                unsupported.add(key)
        groups.append({"params": [names.get(id(p), "") for p in group["params"]],
                       "values": values, "dtypes": dtypes})
    return {"class": type(optimizer).__name__, "module": type(optimizer).__module__,
            "groups": groups, "unsupported": sorted(unsupported)}


class ExportedModule(torch.nn.Module):
    """A module rebuilt by ``load`` from an executable file: the saved module tree with its
    parameters and buffers, no code. Its ``forward`` runs only through the wrapper."""

    def forward(self, *args, **kwargs):
        raise Error("this module was rebuilt from an executable file and has no code of its "
                    "own; call the wrapper that poptorch_lite.load returned.")


def _rebuild_model(tree: dict, tensors: dict[str, np.ndarray]) -> ExportedModule:
    root = ExportedModule()
    for path in tree["modules"]:
        parent, _, name = path.rpartition(".")
        root.get_submodule(parent).add_module(name, ExportedModule())
    for fqn, requires_grad in tree["parameters"].items():
        parent, _, name = fqn.rpartition(".")
        value = torch.from_numpy(tensors[f"state/{fqn}"].copy())
        root.get_submodule(parent).register_parameter(
            name, torch.nn.Parameter(value, requires_grad=bool(requires_grad)))
    for fqn in tree["buffers"]:
        parent, _, name = fqn.rpartition(".")
        root.get_submodule(parent).register_buffer(
            name, torch.from_numpy(tensors[f"state/{fqn}"].copy()))
    parameters = [inspect.Parameter(name, inspect._ParameterKind(kind),
                                    default=default if has_default else inspect.Parameter.empty)
                  for name, kind, has_default, default in tree["forward"]]
    forward = root.forward

    def bound_forward(*args, **kwargs):
        return forward(*args, **kwargs)

    bound_forward.__signature__ = inspect.Signature(parameters)
    object.__setattr__(root, "forward", bound_forward)
    return root


def _rebuild_optimizer(meta: dict, model: torch.nn.Module):
    # Only this package's optimizers, by name: nothing in the file chooses code to run.
    cls = getattr(optim, str(meta.get("class")), None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
            and cls.__module__ == optim.__name__ == meta.get("module")):
        raise Error(f"load(): the file's optimizer {meta.get('module')}.{meta.get('class')} is "
                    f"not one of poptorch_lite.optim's; build the wrapper with your optimizer "
                    f"and call loadExecutable instead.")
    if meta.get("unsupported"):
        raise Error(f"load(): the optimizer's settings {meta['unsupported']} could not be "
                    f"saved; build the wrapper with your optimizer and call loadExecutable.")
    params = dict(model.named_parameters())
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    groups = [{"params": [params[n] for n in g["params"]],
               **{k: v for k, v in g["values"].items() if k in accepted},
               **{k: _dtype(v) for k, v in g.get("dtypes", {}).items() if k in accepted}}
              for g in meta["groups"]]
    return cls(groups, **{k: v for k, v in groups[0].items() if k != "params"})


def prepare_load(filename, edit_opts_fn=None):
    """``load``'s first half: the validated file, its rebuilt model, options and optimizer
    (None for inference)."""
    contents = _read(filename, _EXE_KIND)
    meta = contents.meta
    tree = meta.get("model")
    if not isinstance(tree, dict):
        raise Error(f"load('{filename}'): the file was saved with export_model=False, so it "
                    f"holds no model; build the wrapper from your model and call "
                    f"wrapper.loadExecutable('{filename}').")
    if meta.get("training") and tree.get("running_stats"):
        raise Error(f"load('{filename}'): the model updates BatchNorm running statistics, which "
                    f"a rebuilt module cannot; build the wrapper from your model and call "
                    f"loadExecutable.")
    try:
        model = _rebuild_model(tree, contents.tensors)
        saved = {k: v for k, v in meta["options"].items() if k != "executableCachePath"}
        options = Options().from_json(json.dumps(saved))
        optimizer = (_rebuild_optimizer(meta.get("optimizer") or {}, model)
                     if meta.get("training") else None)
    except Error:
        raise
    except Exception as exc:  # a crafted file: any malformed field, reported as one error
        raise Error(f"load('{filename}'): the saved model, options or optimizer are malformed "
                    f"({type(exc).__name__}: {exc}); export it again.") from exc
    if edit_opts_fn is not None:
        before = options.toDict()
        edit_opts_fn(options)
        changed = sorted(k for k, v in options.toDict().items()
                         if v != before.get(k) and k not in _RUNTIME_OPTIONS)
        if changed:
            raise Error(f"load('{filename}'): edit_opts_fn changed {changed}, which the "
                        f"executable was compiled with; only run-time options "
                        f"({sorted(_RUNTIME_OPTIONS)}) may change.")
    model.train(bool(meta.get("training")))
    return contents, model, options, optimizer
