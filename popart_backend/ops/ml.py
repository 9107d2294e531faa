"""The ai.onnx.ml domain: the classical-ML ops sklearn exporters emit.

LabelEncoder (1, 2, 4), Binarizer, ArrayFeatureExtractor, Scaler, Imputer, OneHotEncoder and
LinearRegressor (all 1); the tree ensembles live in ``ml_trees.py``. Versions are the
ai.onnx.ml since-versions; a model imports the domain with its own opset
(``opset_import { domain: "ai.onnx.ml" }``).

Gradients: Scaler, Imputer and LinearRegressor (without post transform) are differentiable in
their float input and have grads; Binarizer is a step function (zero gradient); LabelEncoder,
ArrayFeatureExtractor on strings and OneHotEncoder read integers or strings, which carry none.

STRING tensors are numpy object arrays (``ops/string_tensors.py``): kernels that may see them
declare ``takes_strings`` and map strings to integer codes with a dict once per run, then work
in torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError, popart_exception
from ..ir.op import NoAttrs, Op
from ..ir.tensor import TensorInfo
from .registry import AI_ONNX_ML, register_op
from .string_tensors import string_array

STRING = DataType.STRING
_NUMERIC = (DataType.FLOAT, DataType.DOUBLE, DataType.INT64, DataType.INT32)


def _check_dtype(op: Op, index: int, info: TensorInfo, allowed) -> None:
    if info.dtype not in allowed:
        names = ", ".join(d.name.lower() for d in allowed)
        raise ShapeError(
            f"{op.debug_name}: input {index} '{op.inputs[index].id}' is {info}; "
            f"{op.op_type} accepts {names}."
        )


def _per_feature(op: Op, name: str, values, features: int, dtype=np.float32) -> torch.Tensor:
    """An attribute holding one value or one per feature (the last input dimension)."""
    if len(values) not in (1, features):
        raise ShapeError(
            f"{op.debug_name}: {name} has {len(values)} values; give 1 or one per feature "
            f"({features})."
        )
    return torch.from_numpy(np.asarray(values, dtype=dtype))


# --- post transforms (shared by the tree and linear models) ---------------------------------------

POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def post_transform_name(op: Op, name: str) -> str:
    if name not in POST_TRANSFORMS:
        raise popart_exception(
            f"{op.debug_name}: post_transform '{name}' is not one of {', '.join(POST_TRANSFORMS)}.")
    return name


def apply_post_transform(name: str, scores: torch.Tensor) -> torch.Tensor:
    """``scores`` [N, targets] after the named transform."""
    if name == "SOFTMAX":
        return torch.softmax(scores, dim=-1)
    if name == "LOGISTIC":
        return torch.sigmoid(scores)
    if name == "SOFTMAX_ZERO":
        # Softmax over the non-zero scores only; zero scores stay zero.
        exp = torch.where(scores != 0, torch.exp(scores - scores.amax(-1, keepdim=True)), 0.0)
        total = exp.sum(-1, keepdim=True)
        return torch.where(total > 0, exp / total, exp)
    if name == "PROBIT":
        return math.sqrt(2.0) * torch.erfinv(2 * scores - 1)
    return scores


# --- LabelEncoder --------------------------------------------------------------------------------


@register_op("LabelEncoder", versions=(1, 2, 4), domain=AI_ONNX_ML)
class LabelEncoder(Op):
    """Maps each element through a key -> value table; keys not in it get the default.

    Version 1 maps between strings and their position in ``classes_strings``; version 2 takes
    ``keys_*`` / ``values_*`` lists; version 4 adds ``keys_tensor`` / ``values_tensor`` /
    ``default_tensor`` of any of its types. A NaN key matches NaN elements; of repeated keys
    the last wins.
    """

    takes_strings = True

    @dataclass(frozen=True)
    class Attrs1:
        classes_strings: tuple[str, ...] = ()
        default_int64: int = -1
        default_string: str = "_Unused"

    @dataclass(frozen=True)
    class Attrs2:
        default_float: float = -0.0
        default_int64: int = -1
        default_string: str = "_Unused"
        keys_floats: tuple[float, ...] | None = None
        keys_int64s: tuple[int, ...] | None = None
        keys_strings: tuple[str, ...] | None = None
        values_floats: tuple[float, ...] | None = None
        values_int64s: tuple[int, ...] | None = None
        values_strings: tuple[str, ...] | None = None

    @dataclass(frozen=True)
    class Attrs(Attrs2):
        default_tensor: np.ndarray | None = None
        keys_tensor: np.ndarray | None = None
        values_tensor: np.ndarray | None = None

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return {1: cls.Attrs1, 2: cls.Attrs2}.get(version, cls.Attrs)

    def infer(self, x):
        allowed = (STRING, DataType.INT64) if self.version < 2 else (
            (STRING, DataType.INT64, DataType.FLOAT) if self.version < 4 else
            (STRING, DataType.INT64, DataType.FLOAT, DataType.INT32, DataType.INT16,
             DataType.DOUBLE))
        _check_dtype(self, 0, x, allowed)
        keys, values, default = self._table(x)
        if (keys.dtype.kind in "OU") != (x.dtype is STRING):
            raise ShapeError(
                f"{self.debug_name}: input {x} and keys of numpy dtype {keys.dtype} differ in "
                f"kind; string inputs need string keys and numeric inputs numeric keys.")
        if len(keys) != len(values):
            raise popart_exception(
                f"{self.debug_name}: {len(keys)} keys but {len(values)} values.")
        out_dtype = STRING if values.dtype.kind in "OU" else DataType.from_numpy(values.dtype)
        self._string_in = x.dtype is STRING
        self._string_out = out_dtype is STRING
        # Output i of the table is values[i]; index len(keys) is the default.
        table = np.concatenate([values, np.asarray([default], dtype=values.dtype)])
        if self._string_out:
            self._table_out = string_array(table)
        else:
            self._table_out = torch.from_numpy(table.astype(out_dtype.numpy))
        self._missing = len(keys)
        if self._string_in:
            self._index_of = {k: i for i, k in enumerate(string_array(keys))}
        else:
            # Compared in float64 / int64 (torch.searchsorted lacks int16); the keys are first
            # rounded to the input dtype, so equality is the input dtype's.
            wide = np.float64 if x.dtype.is_float else np.int64
            self._wide = torch.float64 if x.dtype.is_float else torch.int64
            keys = keys.astype(x.dtype.numpy).astype(wide)
            nan = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(len(keys), bool)
            self._nan_index = int(np.flatnonzero(nan)[-1]) if nan.any() else None
            # Sorted distinct keys and, for each, the position of its last occurrence.
            positions = np.flatnonzero(~nan)[::-1]
            distinct, first = np.unique(keys[positions], return_index=True)
            self._sorted_keys = torch.from_numpy(distinct)
            self._key_order = torch.from_numpy(positions[first].astype(np.int64))
        return TensorInfo(out_dtype, x.shape)

    def _table(self, x: TensorInfo) -> tuple[np.ndarray, np.ndarray, object]:
        """(keys, values, default) as numpy arrays and a scalar, for this version."""
        a = self.attrs
        if self.version < 2:
            classes = string_array(list(a.classes_strings))
            positions = np.arange(len(classes), dtype=np.int64)
            if x.dtype is STRING:
                return classes, positions, a.default_int64
            return positions, classes, a.default_string
        key_lists = [(a.keys_strings, object), (a.keys_int64s, np.int64),
                     (a.keys_floats, np.float32)]
        value_lists = [(a.values_strings, object, a.default_string),
                       (a.values_int64s, np.int64, a.default_int64),
                       (a.values_floats, np.float32, a.default_float)]
        keys = [np.asarray(list(k), dtype=t) for k, t in key_lists if k is not None]
        values = [(np.asarray(list(v), dtype=t), d) for v, t, d in value_lists if v is not None]
        if self.version >= 4:
            if a.keys_tensor is not None:
                keys.append(np.asarray(a.keys_tensor).reshape(-1))
            if a.values_tensor is not None:
                tensor = np.asarray(a.values_tensor).reshape(-1)
                default = {"O": "_Unused", "U": "_Unused", "f": -0.0}.get(tensor.dtype.kind, -1)
                values.append((tensor, default))
        if len(keys) != 1 or len(values) != 1:
            raise popart_exception(
                f"{self.debug_name}: exactly one keys_* and one values_* attribute must be set "
                f"(got {len(keys)} and {len(values)}).")
        (values, default), = values
        if self.version >= 4 and a.default_tensor is not None:
            default = np.asarray(a.default_tensor).reshape(-1)[0]
        return keys[0], values, default

    def _indices(self, x) -> torch.Tensor:
        if self._string_in:
            get, missing = self._index_of.get, self._missing
            return torch.tensor([get(s, missing) for s in x.reshape(-1)],
                                dtype=torch.int64).reshape(x.shape)
        keys = self._sorted_keys
        x = x.to(self._wide)
        if len(keys) == 0:
            return torch.full(x.shape, self._missing, dtype=torch.int64)
        position = torch.searchsorted(keys, x.contiguous()).clamp(max=len(keys) - 1)
        found = keys[position] == x
        index = torch.where(found, self._key_order[position], self._missing)
        if self._nan_index is not None:
            index = torch.where(torch.isnan(x), self._nan_index, index)
        return index

    def kernel(self, x):
        index = self._indices(x)
        if self._string_out:
            return self._table_out[index.reshape(-1).numpy()].reshape(tuple(index.shape))
        return self._table_out[index]


# --- small transforms --------------------------------------------------------------------------


@register_op("Binarizer", versions=1, domain=AI_ONNX_ML)
class Binarizer(Op):
    """1 where x > threshold, else 0, in the input's dtype."""

    @dataclass(frozen=True)
    class Attrs:
        threshold: float = 0.0

    def infer(self, x):
        _check_dtype(self, 0, x, _NUMERIC)
        return x

    def kernel(self, x):
        return (x > self.attrs.threshold).to(x.dtype)

    def grad(self, g):
        """A step function: zero gradient, so nothing flows back."""


@register_op("ArrayFeatureExtractor", versions=1, domain=AI_ONNX_ML)
class ArrayFeatureExtractor(Op):
    """Selects features ``y`` (int64 indices) along the last axis; a 1-D input gives [1, k]."""

    takes_strings = True
    Attrs = NoAttrs

    def infer(self, x, y):
        _check_dtype(self, 0, x, (*_NUMERIC, STRING))
        _check_dtype(self, 1, y, (DataType.INT64,))
        if x.rank == 0:
            raise ShapeError(f"{self.debug_name}: input {x} must have at least one dimension.")
        self._features = x.shape[-1]
        lead = x.shape[:-1] if x.rank > 1 else (1,)
        self._shape = (*lead, y.nelms)
        return TensorInfo(x.dtype, self._shape)

    def kernel(self, x, y):
        index = y.reshape(-1)
        if index.numel() and (index.min() < 0 or index.max() >= self._features):
            raise UnsupportedOpError(
                f"{self.debug_name}: feature index out of range [0, {self._features}): "
                f"{index.tolist()}.")
        if isinstance(x, np.ndarray):
            return np.ascontiguousarray(np.take(x, index.numpy(), axis=-1)).reshape(self._shape)
        return torch.index_select(x, -1, index).reshape(self._shape)


@register_op("Scaler", versions=1, domain=AI_ONNX_ML)
class Scaler(Op):
    """(x - offset) * scale per feature (last axis), as float."""

    @dataclass(frozen=True)
    class Attrs:
        offset: tuple[float, ...] = ()
        scale: tuple[float, ...] = ()

    def infer(self, x):
        _check_dtype(self, 0, x, _NUMERIC)
        features = x.shape[-1] if x.rank else 1
        self._offset = _per_feature(self, "offset", self.attrs.offset or (0.0,), features)
        self._scale = _per_feature(self, "scale", self.attrs.scale or (1.0,), features)
        return TensorInfo(DataType.FLOAT, x.shape)

    def kernel(self, x):
        return (x.to(torch.float32) - self._offset) * self._scale

    def grad(self, g):
        if g.input_info(0).dtype is not DataType.FLOAT:
            return  # only float inputs carry a gradient, and Scaler outputs float32
        scale = g.const(self._scale.numpy(), "scale")
        g.set_input_grad(0, g.op("Mul", g.output_grad(0), scale))


@register_op("Imputer", versions=1, domain=AI_ONNX_ML)
class Imputer(Op):
    """Replaces elements equal to the replaced value (NaN matches NaN) by the per-feature
    imputed value; float inputs use the ``*_float*`` attributes, integer ones ``*_int64*``."""

    @dataclass(frozen=True)
    class Attrs:
        imputed_value_floats: tuple[float, ...] = ()
        imputed_value_int64s: tuple[int, ...] = ()
        replaced_value_float: float = 0.0
        replaced_value_int64: int = 0

    def infer(self, x):
        _check_dtype(self, 0, x, _NUMERIC)
        a = self.attrs
        features = x.shape[-1] if x.rank else 1
        if x.dtype.is_float:
            imputed, self._replaced = a.imputed_value_floats, a.replaced_value_float
        else:
            imputed, self._replaced = a.imputed_value_int64s, a.replaced_value_int64
        if not imputed:
            raise popart_exception(
                f"{self.debug_name}: input {x} needs imputed_value_"
                f"{'floats' if x.dtype.is_float else 'int64s'}.")
        self._imputed = _per_feature(self, "imputed values", imputed, features, x.dtype.numpy)
        return x

    def _replace_mask(self, x):
        if isinstance(self._replaced, float) and math.isnan(self._replaced):
            return torch.isnan(x)
        return x == self._replaced

    def kernel(self, x):
        return torch.where(self._replace_mask(x), self._imputed, x)

    def grad(self, g):
        # Imputed elements are constants: their gradient is zero.
        g.set_input_grad(0, g.op("ImputerGrad", g.output_grad(0), g.input(0),
                                 domain=AI_ONNX_ML, replaced=float(self._replaced)))


@register_op("ImputerGrad", versions=1, domain=AI_ONNX_ML)
class ImputerGrad(Op):
    """dx = dy where x was kept, 0 where Imputer replaced it."""

    public = False

    @dataclass(frozen=True)
    class Attrs:
        replaced: float

    def infer(self, dy, x):
        return dy

    def kernel(self, dy, x):
        replaced = self.attrs.replaced
        mask = torch.isnan(x) if math.isnan(replaced) else x == replaced
        return torch.where(mask, 0.0, dy)


@register_op("OneHotEncoder", versions=1, domain=AI_ONNX_ML)
class OneHotEncoder(Op):
    """Float one-hot over the categories ``cats_int64s`` or ``cats_strings``: shape + [C].

    An element outside the categories gives a zero row when ``zeros`` = 1 and fails otherwise.
    """

    takes_strings = True

    @dataclass(frozen=True)
    class Attrs:
        cats_int64s: tuple[int, ...] = ()
        cats_strings: tuple[str, ...] = ()
        zeros: int = 1

    def infer(self, x):
        _check_dtype(self, 0, x, (STRING, DataType.INT64, DataType.INT32, DataType.FLOAT,
                                  DataType.DOUBLE))
        a = self.attrs
        cats = a.cats_strings if x.dtype is STRING else a.cats_int64s
        if not cats:
            raise popart_exception(
                f"{self.debug_name}: input {x} needs "
                f"{'cats_strings' if x.dtype is STRING else 'cats_int64s'}.")
        self._index_of = {c: i for i, c in reversed(list(enumerate(cats)))}
        self._count = len(cats)
        return TensorInfo(DataType.FLOAT, (*x.shape, len(cats)))

    def kernel(self, x):
        flat = x.reshape(-1)
        if not isinstance(x, np.ndarray):
            flat = flat.tolist()
            # Float inputs match integer categories by value, as the ONNX runtimes do.
            flat = [int(v) if float(v).is_integer() else v for v in flat]
        index = torch.tensor([self._index_of.get(v, -1) for v in flat], dtype=torch.int64)
        if not self.attrs.zeros and bool((index < 0).any()):
            raise UnsupportedOpError(
                f"{self.debug_name}: an input value is not among the categories and zeros=0.")
        out = torch.zeros(index.numel(), self._count + 1, dtype=torch.float32)
        out[torch.arange(index.numel()), torch.where(index < 0, self._count, index)] = 1.0
        return out[:, : self._count].reshape(*tuple(x.shape), self._count)


@register_op("LinearRegressor", versions=1, domain=AI_ONNX_ML)
class LinearRegressor(Op):
    """x [N, C] (or [C]) @ coefficients[targets, C]^T + intercepts -> float [N, targets]."""

    @dataclass(frozen=True)
    class Attrs:
        coefficients: tuple[float, ...] = ()
        intercepts: tuple[float, ...] = ()
        post_transform: str = "NONE"
        targets: int = 1

    def infer(self, x):
        _check_dtype(self, 0, x, _NUMERIC)
        a = self.attrs
        if x.rank not in (1, 2):
            raise ShapeError(f"{self.debug_name}: input {x} must be [C] or [N, C].")
        features = x.shape[-1]
        if len(a.coefficients) != a.targets * features:
            raise ShapeError(
                f"{self.debug_name}: {len(a.coefficients)} coefficients, {a.targets} targets × "
                f"{features} features needed.")
        if a.intercepts and len(a.intercepts) != a.targets:
            raise ShapeError(
                f"{self.debug_name}: {len(a.intercepts)} intercepts for {a.targets} targets.")
        self._transform = post_transform_name(self, a.post_transform)
        self._weights = torch.tensor(a.coefficients, dtype=torch.float32).reshape(
            a.targets, features)
        self._bias = torch.tensor(a.intercepts or (0.0,) * a.targets, dtype=torch.float32)
        self._rows = x.shape[0] if x.rank == 2 else 1
        return TensorInfo(DataType.FLOAT, (self._rows, a.targets))

    def kernel(self, x):
        scores = x.reshape(self._rows, -1).to(torch.float32) @ self._weights.T + self._bias
        return apply_post_transform(self._transform, scores)

    def grad(self, g):
        info = g.input_info(0)
        if info.dtype is not DataType.FLOAT:
            return  # integer features carry no gradient
        if self._transform != "NONE":
            raise UnsupportedOpError(
                f"{self.debug_name}: the gradient is implemented for post_transform NONE only, "
                f"not {self._transform}.")
        dx = g.op("MatMul", g.output_grad(0), g.const(self._weights.numpy(), "coefficients"))
        if info.rank == 1:
            dx = g.op("Reshape", dx, g.const(np.array(info.shape, np.int64), "shape"))
        g.set_input_grad(0, dx)
