"""STRING tensors on the simulated IPU: which kernel runs an op whose inputs or outputs are strings.

torch has no string dtype, so a STRING value lives in its slot as a C-contiguous numpy object
array of Python ``str``, one per element. Memory and exchange are accounted as 8 bytes per
element (``DataType.STRING.itemsize``): the pointer a device would hold, not the characters.

Two kinds of op accept strings, each declaring it with a class attribute (``ir/op.py``):

- ``takes_strings = True``: the string ops (``ops/strings.py``, ``ops/ml.py``) and Cast. Their
  kernel gets the numpy object arrays (torch tensors for the other inputs) and returns object
  arrays for STRING outputs.
- ``strings_as_codes = True``: ops that only copy, select, reorder or compare elements for
  equality and fill only with zeros (Identity, Reshape, Gather, Concat, Pad, Where, Equal ...;
  all accept tensor(string) in ONNX). They keep their one torch kernel. Their STRING inputs are
  replaced by int64 codes, each string's rank in the sorted vocabulary of all strings the op
  reads, with "" always in it as code 0; the kernel runs on the codes and STRING outputs map
  codes back to strings. Ranks preserve equality and order, and the zeros an op pads with
  (Pad's default, Trilu) decode to "", the string zero of ONNX. An op sets this only when its
  kernel is correct on such codes for every input it may get.

Every other op given a STRING tensor is rejected when the plan is built (``kernel_for``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import UnsupportedOpError
from ..ir.op import Op
from . import registry


def is_string(value) -> bool:
    """True for a STRING slot value (a numpy object array)."""
    return isinstance(value, np.ndarray) and value.dtype == object


def string_array(values, shape=None) -> np.ndarray:
    """A C-contiguous object array of ``str`` (bytes decoded as UTF-8), reshaped to ``shape``."""
    flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v)
            for v in np.asarray(values, dtype=object).reshape(-1)]
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(np.shape(values) if shape is None else shape)


def kernel_for(op: Op) -> Callable:
    """The callable that runs ``op`` on slot values: its kernel, or the code-mapping wrapper.

    Raises UnsupportedOpError when a STRING tensor reaches an op that cannot take one.
    """
    string_in = tuple(i for i, t in enumerate(op.inputs)
                      if t is not None and t.info.dtype is DataType.STRING)
    string_out = tuple(i for i, t in enumerate(op.outputs)
                       if t is not None and t.info.dtype is DataType.STRING)
    if not string_in and not string_out:
        return op.kernel
    if op.takes_strings:
        return op.kernel
    if op.strings_as_codes:
        return _on_codes(op.kernel, string_in, set(string_out), len(op.outputs) == 1)
    names = ", ".join(f"'{op.inputs[i].id}'" for i in string_in) or ", ".join(
        f"'{op.outputs[i].id}'" for i in string_out)
    raise UnsupportedOpError(
        f"{op.debug_name}: STRING tensor(s) {names} reach an op the simulated IPU runs only on "
        f"numbers. String tensors work with the string ops (StringNormalizer, StringSplit, "
        f"StringConcat, RegexFullMatch, TfIdfVectorizer, LabelEncoder ...) and the ops that only "
        f"move or compare elements ({', '.join(string_code_op_types())})."
    )


def string_code_op_types() -> list[str]:
    """Sorted op types of the registered classes that set ``strings_as_codes``."""
    return sorted({op_type for _, op_type, _, cls in registry.all_registered()
                   if cls.strings_as_codes})


def _on_codes(kernel: Callable, string_in: tuple[int, ...], string_out: set[int],
              single: bool) -> Callable:
    """``kernel`` run with its STRING inputs as int64 vocabulary codes (see the module doc)."""

    def run(*xs):
        arrays = [xs[i] for i in string_in]
        vocabulary, codes = np.unique(
            np.concatenate([np.array([""], dtype=object)] + [a.reshape(-1) for a in arrays]),
            return_inverse=True,
        )
        codes = codes.reshape(-1).astype(np.int64)
        args = list(xs)
        start = 1
        for i, array in zip(string_in, arrays):
            args[i] = torch.from_numpy(codes[start : start + array.size].reshape(array.shape))
            start += array.size
        result = kernel(*args)
        if single:
            return _decode(vocabulary, result) if 0 in string_out else result
        return tuple(_decode(vocabulary, r) if k in string_out else r
                     for k, r in enumerate(result))

    return run


def _decode(vocabulary: np.ndarray, codes: torch.Tensor) -> np.ndarray:
    flat = codes.reshape(-1).numpy()
    return np.ascontiguousarray(vocabulary[flat]).reshape(tuple(codes.shape))
