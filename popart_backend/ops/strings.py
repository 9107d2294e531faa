"""String ops: StringNormalizer, StringSplit, StringConcat, RegexFullMatch and
TfIdfVectorizer.

STRING values are numpy object arrays of ``str`` (``ops/string_tensors.py``), so these kernels
work on numpy where they touch strings (torch has no string type) and on torch for numbers.
None has a gradient: their inputs are strings or integers, which carry none.

Static shapes: StringNormalizer with stopwords and StringSplit have outputs whose shape depends
on the string values (how many words are removed, how many pieces a split gives). They run only
on constant inputs, where they fold at compile time; on a computed input they raise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError, popart_exception
from ..ir.op import NoAttrs, Op
from ..ir.tensor import TensorInfo
from .base import broadcast_shapes
from .registry import register_op
from .string_tensors import string_array

STRING = DataType.STRING


def _check_string(op: Op, index: int, info: TensorInfo) -> None:
    if info.dtype is not STRING:
        raise ShapeError(
            f"{op.debug_name}: input {index} '{op.inputs[index].id}' is {info}, but "
            f"{op.op_type} takes a STRING tensor."
        )


def _constant_strings(op: Op, index: int, why: str) -> np.ndarray:
    """The value of constant input ``index``; UnsupportedOpError when it is computed."""
    tensor = op.inputs[index]
    if not tensor.is_const:
        raise UnsupportedOpError(
            f"{op.debug_name}: the output shape depends on the values of input '{tensor.id}' "
            f"({tensor.info}, {tensor.kind.value}): {why}. Tensor shapes on the simulated IPU "
            f"are fixed at compile time, so the op runs only on a constant input (it then "
            f"folds)."
        )
    return string_array(tensor.data)


@register_op("StringNormalizer", versions=10)
class StringNormalizer(Op):
    """Drops stopwords from a [C] or [1, C] string tensor, then changes case.

    ``locale`` is accepted but case mapping is Python's locale-independent Unicode mapping. All
    words removed leaves one "" (shape [1] or [1, 1]), as the ONNX runtimes do.
    """

    takes_strings = True

    @dataclass(frozen=True)
    class Attrs:
        case_change_action: str = "NONE"
        is_case_sensitive: int = 0
        locale: str = ""
        stopwords: tuple[str, ...] = ()

    def infer(self, x):
        _check_string(self, 0, x)
        if x.rank not in (1, 2) or (x.rank == 2 and x.shape[0] != 1):
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' is {x}; StringNormalizer takes "
                f"shape [C] or [1, C]."
            )
        action = self.attrs.case_change_action
        if action not in ("NONE", "LOWER", "UPPER"):
            raise popart_exception(
                f"{self.debug_name}: case_change_action '{action}' is not one of NONE, LOWER, "
                f"UPPER."
            )
        self._case = {"NONE": None, "LOWER": str.lower, "UPPER": str.upper}[action]
        sensitive = bool(self.attrs.is_case_sensitive)
        self._fold = str if sensitive else str.lower
        self._stopwords = frozenset(self._fold(w) for w in self.attrs.stopwords)
        self._folded = None
        if not self._stopwords:
            return x
        self._folded = self._normalize(_constant_strings(
            self, 0, "stopwords remove a data-dependent number of words"))
        return TensorInfo(STRING, self._folded.shape)

    def _normalize(self, x: np.ndarray) -> np.ndarray:
        words = [w for w in x.reshape(-1) if self._fold(w) not in self._stopwords]
        if self._case is not None:
            words = [self._case(w) for w in words]
        if not words:
            words = [""]
        shape = (len(words),) if x.ndim == 1 else (1, len(words))
        return string_array(words, shape)

    def fold_from_infos(self):
        return None if self._folded is None else [self._folded]

    def kernel(self, x):
        return self._normalize(x)


@register_op("StringSplit", versions=20)
class StringSplit(Op):
    """Splits each string at ``delimiter`` (runs of whitespace when empty or absent), at most
    ``maxsplit`` times: Y holds the pieces, padded with "" to the longest split, Z the counts.
    The longest split sets Y's shape, so the input must be constant (``const_inputs``)."""

    takes_strings = True
    const_inputs = (0,)

    @dataclass(frozen=True)
    class Attrs:
        delimiter: str = ""
        maxsplit: int | None = None

    def infer(self, x):
        _check_string(self, 0, x)
        if self.attrs.maxsplit is not None and self.attrs.maxsplit < 0:
            raise popart_exception(
                f"{self.debug_name}: maxsplit {self.attrs.maxsplit} must be >= 0 (or absent for "
                f"no limit)."
            )
        self._values = self._split(_constant_strings(
            self, 0, "the longest split sets the last dimension of output Y"))
        return [TensorInfo(STRING, v.shape) if i == 0 else TensorInfo(DataType.INT64, v.shape)
                for i, v in enumerate(self._values)]

    def _split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        limit = -1 if self.attrs.maxsplit is None else self.attrs.maxsplit
        delimiter = self.attrs.delimiter or None
        # Python's split, as the ONNX reference: "" split at a delimiter is one empty piece
        # (onnxruntime returns none).
        pieces = [s.split(delimiter, limit) for s in x.reshape(-1)]
        width = max((len(p) for p in pieces), default=0)
        y = np.full((len(pieces), width), "", dtype=object)
        for row, parts in zip(y, pieces):
            row[: len(parts)] = parts
        counts = np.array([len(p) for p in pieces], dtype=np.int64).reshape(x.shape)
        return y.reshape(*x.shape, width), counts

    def fold_from_infos(self):
        return list(self._values)

    def kernel(self, x):
        y, counts = self._split(x)
        return y, torch.from_numpy(counts)


@register_op("StringConcat", versions=20)
class StringConcat(Op):
    """Elementwise X + Y with numpy broadcasting."""

    takes_strings = True
    Attrs = NoAttrs

    def infer(self, x, y):
        _check_string(self, 0, x)
        _check_string(self, 1, y)
        self._shape = broadcast_shapes(self, x.shape, y.shape)
        return TensorInfo(STRING, self._shape)

    def kernel(self, x, y):
        # Object arrays add elementwise with str.__add__; a 0-d result comes back as a str.
        return string_array(np.add(x, y), self._shape)


@register_op("RegexFullMatch", versions=20)
class RegexFullMatch(Op):
    """True where the whole string matches ``pattern``.

    ONNX specifies RE2 syntax; this uses Python's ``re``, which agrees on the common syntax.
    Differences: Python also accepts backreferences and lookaround (RE2 rejects them), and
    rejects RE2's Unicode classes ``\\pL`` / ``\\p{Greek}`` and ``\\C``.
    """

    takes_strings = True

    @dataclass(frozen=True)
    class Attrs:
        pattern: str = ""

    def infer(self, x):
        _check_string(self, 0, x)
        try:
            self._regex = re.compile(self.attrs.pattern)
        except re.error as exc:
            raise popart_exception(
                f"{self.debug_name}: pattern {self.attrs.pattern!r} is not a valid regular "
                f"expression ({exc}); patterns use Python re syntax, close to RE2's."
            ) from None
        return TensorInfo(DataType.BOOL, x.shape)

    def kernel(self, x):
        match = self._regex.fullmatch
        flags = [match(s) is not None for s in x.reshape(-1)]
        return torch.tensor(flags, dtype=torch.bool).reshape(x.shape)


@register_op("TfIdfVectorizer", versions=9)
class TfIdfVectorizer(Op):
    """Counts the pool's n-grams in each row of a [C] or [N, C] int32/int64/string tensor.

    An n-gram of length n with skip s takes elements i, i+(s+1), ..., i+(n-1)(s+1) of a row,
    for n in [min_gram_length, max_gram_length] and s in [0, max_skip_count]; unigrams count
    once, not once per skip. ``ngram_counts[k]`` is where the (k+1)-grams start in the pool,
    ``ngram_indexes[j]`` the output column of the pool's j-th n-gram and ``weights[j]`` its
    weight. TF gives the counts, IDF the weight (or 1) where the count is non-zero, TFIDF
    counts times weights.

    The kernel is torch on element codes: strings are mapped to their pool position once per
    run (numpy, as torch has no strings), integers compared directly.
    """

    takes_strings = True

    @dataclass(frozen=True)
    class Attrs:
        max_gram_length: int
        max_skip_count: int
        min_gram_length: int
        mode: str
        ngram_counts: tuple[int, ...]
        ngram_indexes: tuple[int, ...]
        pool_int64s: tuple[int, ...] = ()
        pool_strings: tuple[str, ...] = ()
        weights: tuple[float, ...] = ()

    def infer(self, x):
        a = self.attrs
        if x.dtype not in (STRING, DataType.INT32, DataType.INT64):
            raise ShapeError(
                f"{self.debug_name}: input '{self.inputs[0].id}' is {x}; TfIdfVectorizer takes "
                f"string, int32 or int64."
            )
        if x.rank not in (1, 2):
            raise ShapeError(f"{self.debug_name}: input {x} must be [C] or [N, C].")
        if a.mode not in ("TF", "IDF", "TFIDF"):
            raise popart_exception(f"{self.debug_name}: mode '{a.mode}' is not TF, IDF or TFIDF.")
        if not 1 <= a.min_gram_length <= a.max_gram_length or a.max_skip_count < 0:
            raise popart_exception(
                f"{self.debug_name}: needs 1 <= min_gram_length ({a.min_gram_length}) <= "
                f"max_gram_length ({a.max_gram_length}) and max_skip_count "
                f"({a.max_skip_count}) >= 0."
            )
        strings = bool(a.pool_strings)
        if strings == bool(a.pool_int64s):
            raise popart_exception(
                f"{self.debug_name}: exactly one of pool_strings and pool_int64s must be given.")
        if strings != (x.dtype is STRING):
            raise ShapeError(
                f"{self.debug_name}: input {x} does not match the "
                f"{'pool_strings' if strings else 'pool_int64s'} pool; cast the input.")
        pool = list(a.pool_strings if strings else a.pool_int64s)
        if strings:
            # Elements outside the pool become -1, which matches no pool code.
            self._code_of = {s: i for i, s in reversed(list(enumerate(pool)))}
            codes = [self._code_of[s] for s in pool]
        else:
            codes = pool
        self._grams = self._pool_grams(codes, len(pool))
        self._rows = 1 if x.rank == 1 else x.shape[0]
        width = max(a.ngram_indexes) + 1
        # weights[j] belongs to the pool's j-th n-gram, which counts into column
        # ngram_indexes[j].
        weights = np.ones(width, np.float32)
        if a.weights:
            if len(a.weights) != len(a.ngram_indexes):
                raise popart_exception(
                    f"{self.debug_name}: {len(a.weights)} weights for "
                    f"{len(a.ngram_indexes)} n-grams in the pool.")
            weights[list(a.ngram_indexes)] = a.weights
        self._weights = torch.from_numpy(weights)
        self._width = width
        self._out_shape = (width,) if x.rank == 1 else (x.shape[0], width)
        return TensorInfo(DataType.FLOAT, self._out_shape)

    def _pool_grams(self, codes: list, pool_size: int) -> list[tuple]:
        """Per n-gram length n in range: (n, pool n-grams [P, n] int64, output columns [P])."""
        a = self.attrs
        starts = list(a.ngram_counts) + [pool_size]
        grams, first_index = [], 0
        for k in range(len(a.ngram_counts)):
            n = k + 1
            block = codes[starts[k] : starts[k + 1]]
            if len(block) % n:
                raise popart_exception(
                    f"{self.debug_name}: the pool's {n}-gram block holds {len(block)} "
                    f"elements, not a multiple of {n}; check ngram_counts {list(a.ngram_counts)}.")
            count = len(block) // n
            columns = a.ngram_indexes[first_index : first_index + count]
            if len(columns) != count:
                raise popart_exception(
                    f"{self.debug_name}: ngram_indexes has {len(a.ngram_indexes)} entries, the "
                    f"pool more n-grams.")
            first_index += count
            if count and a.min_gram_length <= n <= a.max_gram_length:
                grams.append((n, torch.tensor(block, dtype=torch.int64).reshape(count, n),
                              torch.tensor(columns, dtype=torch.int64)))
        return grams

    def kernel(self, x):
        if isinstance(x, np.ndarray):
            code_of = self._code_of
            x = torch.tensor([code_of.get(s, -1) for s in x.reshape(-1)],
                             dtype=torch.int64).reshape(x.shape)
        rows = x.reshape(self._rows, -1).to(torch.int64)
        length = rows.shape[1]
        counts = torch.zeros(self._rows, self._width, dtype=torch.float32)
        for n, pool, columns in self._grams:
            for skip in range(self.attrs.max_skip_count + 1 if n > 1 else 1):
                span = (n - 1) * (skip + 1) + 1
                if span > length:
                    break
                starts = torch.arange(length - span + 1)
                windows = rows[:, starts[:, None] + torch.arange(n) * (skip + 1)]  # [N, W, n]
                hits = (windows[:, :, None, :] == pool).all(-1).sum(1)  # [N, P]
                counts.index_add_(1, columns, hits.to(torch.float32))
        mode = self.attrs.mode
        if mode == "IDF":
            counts = (counts > 0).to(torch.float32) * self._weights
        elif mode == "TFIDF":
            counts = counts * self._weights
        return counts.reshape(self._out_shape)
