"""Tree ensembles of the ai.onnx.ml domain: TreeEnsemble (5) and
TreeEnsembleRegressor (1, 3), sharing one torch evaluator.

Each op turns its attributes into a ``Forest``: flat node tables (feature, split, comparison,
children) and a dense leaf table ``[leaves, targets]``. A child index below the node count is
a node; ``nodes + i`` is leaf i. All (sample, tree) pairs then descend one level per step, as
many steps as the deepest tree has levels, each step a few gathers and comparisons.

Both ops are piecewise constant in their features: zero gradient, so nothing flows back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .ml import POST_TRANSFORMS, apply_post_transform, post_transform_name
from .registry import AI_ONNX_ML, register_op

# Comparison codes, as TreeEnsemble-5 numbers its nodes_modes.
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_MODE_NAMES = {"BRANCH_LEQ": _LEQ, "BRANCH_LT": _LT, "BRANCH_GTE": _GTE, "BRANCH_GT": _GT,
               "BRANCH_EQ": _EQ, "BRANCH_NEQ": _NEQ}
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")


class Forest:
    """Node and leaf tensors of a tree ensemble, and the descent that evaluates it."""

    def __init__(self, op: Op, x: TensorInfo, *, features, splits, modes, true_child,
                 false_child, missing_true, members, roots, leaf_values, leaf_has,
                 aggregate: str, transform: str, base_values=None, compute=torch.float32):
        nodes = len(features)
        if x.rank != 2:
            raise ShapeError(f"{op.debug_name}: input {x} must be [N, features].")
        if nodes and (max(features) >= x.shape[1] or min(features) < 0):
            raise ShapeError(
                f"{op.debug_name}: the trees read feature {max(features)}, the input {x} has "
                f"{x.shape[1]}.")
        children = np.concatenate([true_child, false_child, roots]).astype(np.int64)
        if len(children) and (children.min() < 0 or children.max() >= nodes + len(leaf_values)):
            raise popart_exception(f"{op.debug_name}: a node points past the node or leaf lists.")
        self.nodes = nodes
        self.depth = _depth(op, roots, true_child, false_child, nodes)
        self.roots = torch.tensor(roots, dtype=torch.int64)
        self.feature = torch.tensor(features, dtype=torch.int64)
        self.split = torch.tensor(np.asarray(splits, np.float64)).to(compute)
        self.mode = torch.tensor(modes, dtype=torch.int64)
        self.missing_true = torch.tensor(missing_true, dtype=torch.bool)
        self.children = (torch.tensor(true_child, dtype=torch.int64),
                         torch.tensor(false_child, dtype=torch.int64))
        self.members = torch.from_numpy(members).to(compute)
        self.leaf_values = torch.from_numpy(np.asarray(leaf_values, np.float64)).to(compute)
        self.leaf_has = torch.from_numpy(np.asarray(leaf_has, bool))
        self.aggregate = aggregate
        self.transform = transform
        self.base = (None if base_values is None else
                     torch.tensor(np.asarray(base_values, np.float64)).to(compute))
        self.compute = compute

    def leaves(self, values: torch.Tensor) -> torch.Tensor:
        """[N, trees] leaf index each sample reaches in each tree."""
        samples = values.shape[0]
        current = self.roots.expand(samples, -1).clone()
        true_child, false_child = self.children
        for _ in range(self.depth):
            at_node = current < self.nodes
            node = current.clamp(max=self.nodes - 1)
            feature = values.gather(1, self.feature[node].reshape(samples, -1))
            split = self.split[node]
            conditions = torch.stack([
                feature <= split, feature < split, feature >= split, feature > split,
                feature == split, feature != split,
                (feature[..., None] == self.members[node]).any(-1),
            ])
            go_true = conditions.gather(0, self.mode[node][None]).squeeze(0)
            go_true |= self.missing_true[node] & torch.isnan(feature)
            step = torch.where(go_true, true_child[node], false_child[node])
            current = torch.where(at_node, step, current)
        return current - self.nodes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[N, targets] aggregated, offset and post-transformed scores, in the compute dtype."""
        leaf = self.leaves(x.to(self.compute))
        values, has = self.leaf_values[leaf], self.leaf_has[leaf]  # [N, trees, targets]
        if self.aggregate in ("SUM", "AVERAGE"):
            out = values.sum(1)
            if self.aggregate == "AVERAGE":
                out = out / leaf.shape[1]
        else:
            # Only leaves that name a target count; a target no tree reached stays 0.
            fill = torch.inf if self.aggregate == "MIN" else -torch.inf
            masked = torch.where(has, values, fill)
            out = masked.amin(1) if self.aggregate == "MIN" else masked.amax(1)
            out = torch.where(has.any(1), out, 0.0)
        if self.base is not None:
            out = out + self.base
        return apply_post_transform(self.transform, out)


def _depth(op: Op, roots, true_child, false_child, nodes: int) -> int:
    """Levels of the deepest tree (0 when every root is a leaf); raises on a cycle."""
    deepest = 0
    for root in roots:
        level, frontier = 0, ({int(root)} if root < nodes else set())
        while frontier:
            level += 1
            if level > nodes:
                raise popart_exception(f"{op.debug_name}: the tree at root {root} has a cycle.")
            frontier = {int(c) for n in frontier for c in (true_child[n], false_child[n])
                        if c < nodes}
        deepest = max(deepest, level)
    return deepest


def _membership_table(op: Op, modes: np.ndarray, membership_values) -> np.ndarray:
    """[nodes, K] set members (NaN padded) of the BRANCH_MEMBER nodes, in node order: their
    sets follow one another in ``membership_values``, separated by NaN."""
    member_nodes = np.flatnonzero(modes == _MEMBER)
    if not len(member_nodes):
        return np.full((len(modes), 1), np.nan)
    values = np.asarray(membership_values if membership_values is not None else [],
                        np.float64).reshape(-1)
    groups = [g[~np.isnan(g)] for g in np.split(values, np.flatnonzero(np.isnan(values)))]
    groups = groups[: len(member_nodes)]
    if len(groups) != len(member_nodes):
        raise popart_exception(
            f"{op.debug_name}: {len(member_nodes)} BRANCH_MEMBER nodes, {len(groups)} "
            f"NaN-separated sets in membership_values.")
    table = np.full((len(modes), max(max(len(g) for g in groups), 1)), np.nan)
    for node, group in zip(member_nodes, groups):
        table[node, : len(group)] = group
    return table


@register_op("TreeEnsemble", versions=5, domain=AI_ONNX_ML)
class TreeEnsemble(Op):
    """Sum / average / min / max over trees of the leaf weight each sample reaches, per target.

    Node i compares feature ``nodes_featureids[i]`` with ``nodes_splits[i]`` by
    ``nodes_modes[i]`` (<=, <, >=, >, ==, !=, set membership); a NaN feature takes the true
    branch where ``nodes_missing_value_tracks_true`` says so. Hit rates are ignored.
    ``post_transform`` codes follow the ONNX spec (1 SOFTMAX, 2 LOGISTIC); onnxruntime swaps
    these two.
    """

    @dataclass(frozen=True)
    class Attrs:
        leaf_targetids: tuple[int, ...]
        leaf_weights: np.ndarray
        nodes_falseleafs: tuple[int, ...]
        nodes_falsenodeids: tuple[int, ...]
        nodes_featureids: tuple[int, ...]
        nodes_modes: np.ndarray
        nodes_splits: np.ndarray
        nodes_trueleafs: tuple[int, ...]
        nodes_truenodeids: tuple[int, ...]
        tree_roots: tuple[int, ...]
        aggregate_function: int = 1
        membership_values: np.ndarray | None = None
        n_targets: int | None = None
        nodes_hitrates: np.ndarray | None = None
        nodes_missing_value_tracks_true: tuple[int, ...] | None = None
        post_transform: int = 0

    def infer(self, x):
        if x.dtype not in (DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16):
            raise ShapeError(f"{self.debug_name}: input {x} must be float, double or float16.")
        a = self.attrs
        if not 0 <= a.aggregate_function < 4 or not 0 <= a.post_transform < 5:
            raise popart_exception(
                f"{self.debug_name}: aggregate_function {a.aggregate_function} (0-3) or "
                f"post_transform {a.post_transform} (0-4) out of range.")
        nodes = len(a.nodes_featureids)
        modes = np.asarray(a.nodes_modes).reshape(-1).astype(np.int64)
        splits = np.asarray(a.nodes_splits).reshape(-1)
        lists = (a.nodes_falseleafs, a.nodes_falsenodeids, a.nodes_trueleafs,
                 a.nodes_truenodeids, modes, splits)
        weights = np.asarray(a.leaf_weights).reshape(-1)
        if any(len(v) != nodes for v in lists) or len(a.leaf_targetids) != len(weights):
            raise popart_exception(
                f"{self.debug_name}: the nodes_* attributes differ in length, or "
                f"leaf_targetids ({len(a.leaf_targetids)}) and leaf_weights ({len(weights)}) do.")
        targets = a.n_targets if a.n_targets is not None else max(a.leaf_targetids) + 1
        if max(a.leaf_targetids) >= targets or min(a.leaf_targetids) < 0:
            raise popart_exception(
                f"{self.debug_name}: leaf_targetids reach {max(a.leaf_targetids)}, n_targets is "
                f"{targets}.")
        leaf_values = np.zeros((len(weights), targets))
        leaf_has = np.zeros((len(weights), targets), bool)
        rows = np.arange(len(weights))
        leaf_values[rows, a.leaf_targetids] = weights
        leaf_has[rows, a.leaf_targetids] = True

        def child(ids, is_leaf):
            return [i + nodes if leaf else i for i, leaf in zip(ids, is_leaf)]

        self._forest = Forest(
            self, x, features=list(a.nodes_featureids), splits=splits, modes=modes,
            true_child=child(a.nodes_truenodeids, a.nodes_trueleafs),
            false_child=child(a.nodes_falsenodeids, a.nodes_falseleafs),
            missing_true=list(a.nodes_missing_value_tracks_true or (0,) * nodes),
            members=_membership_table(self, modes, a.membership_values),
            roots=list(a.tree_roots), leaf_values=leaf_values, leaf_has=leaf_has,
            aggregate=_AGGREGATES[a.aggregate_function],
            transform=POST_TRANSFORMS[a.post_transform],
            compute=torch.float64 if x.dtype is DataType.DOUBLE else torch.float32)
        return TensorInfo(x.dtype, (x.shape[0], targets))

    def kernel(self, x):
        return self._forest(x).to(x.dtype)

    def grad(self, g):
        """Piecewise constant in the features: zero gradient, so nothing flows back."""


@register_op("TreeEnsembleRegressor", versions=(1, 3), domain=AI_ONNX_ML)
class TreeEnsembleRegressor(Op):
    """The pre-5 regressor: nodes named by (tree id, node id), leaves are ``LEAF`` nodes with
    any number of (target, weight) pairs, ``base_values`` added before the post transform.
    Version 3 also takes the ``*_as_tensor`` (double) forms of the float attributes. Output
    float32 [N, n_targets]; hit rates are ignored. A target no reached leaf feeds scores 0
    plus its base value (onnxruntime gives 0, onnx's evaluator ±FLT_MAX for MIN / MAX)."""

    @dataclass(frozen=True)
    class Attrs1:
        aggregate_function: str = "SUM"
        base_values: tuple[float, ...] | None = None
        n_targets: int | None = None
        nodes_falsenodeids: tuple[int, ...] = ()
        nodes_featureids: tuple[int, ...] = ()
        nodes_hitrates: tuple[float, ...] | None = None
        nodes_missing_value_tracks_true: tuple[int, ...] | None = None
        nodes_modes: tuple[str, ...] = ()
        nodes_nodeids: tuple[int, ...] = ()
        nodes_treeids: tuple[int, ...] = ()
        nodes_truenodeids: tuple[int, ...] = ()
        nodes_values: tuple[float, ...] | None = None
        post_transform: str = "NONE"
        target_ids: tuple[int, ...] = ()
        target_nodeids: tuple[int, ...] = ()
        target_treeids: tuple[int, ...] = ()
        target_weights: tuple[float, ...] | None = None

    @dataclass(frozen=True)
    class Attrs(Attrs1):
        base_values_as_tensor: np.ndarray | None = None
        nodes_hitrates_as_tensor: np.ndarray | None = None
        nodes_values_as_tensor: np.ndarray | None = None
        target_weights_as_tensor: np.ndarray | None = None

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs1 if version < 3 else cls.Attrs

    def _pick(self, name: str):
        """A float attribute, or its version-3 ``_as_tensor`` form (at most one may be set)."""
        plain = getattr(self.attrs, name)
        tensor = getattr(self.attrs, name + "_as_tensor", None)
        if plain is not None and tensor is not None:
            raise popart_exception(f"{self.debug_name}: set {name} or {name}_as_tensor, not both.")
        return np.asarray(tensor if tensor is not None else (plain or ()), np.float64).reshape(-1)

    def infer(self, x):
        if x.dtype not in (DataType.FLOAT, DataType.DOUBLE, DataType.INT64, DataType.INT32):
            raise ShapeError(f"{self.debug_name}: input {x} must be float, double, int64 or int32.")
        a = self.attrs
        if a.aggregate_function not in _AGGREGATES:
            raise popart_exception(
                f"{self.debug_name}: aggregate_function '{a.aggregate_function}' is not one of "
                f"{', '.join(_AGGREGATES)}.")
        keys = list(zip(a.nodes_treeids, a.nodes_nodeids))
        columns = (a.nodes_falsenodeids, a.nodes_featureids, a.nodes_modes,
                   a.nodes_truenodeids, a.nodes_treeids)
        splits = self._pick("nodes_values")
        if any(len(c) != len(keys) for c in columns) or len(splits) not in (0, len(keys)):
            raise popart_exception(f"{self.debug_name}: the nodes_* attributes differ in length.")
        unknown = sorted(set(a.nodes_modes) - set(_MODE_NAMES) - {"LEAF"})
        if unknown:
            raise popart_exception(f"{self.debug_name}: unknown nodes_modes {unknown}.")
        branch = [i for i, m in enumerate(a.nodes_modes) if m != "LEAF"]
        leaf = [i for i, m in enumerate(a.nodes_modes) if m == "LEAF"]
        code = {keys[i]: n for n, i in enumerate(branch)}
        code.update({keys[i]: len(branch) + n for n, i in enumerate(leaf)})

        def child(i, ids):
            target = (a.nodes_treeids[i], ids[i])
            if target not in code:
                raise popart_exception(
                    f"{self.debug_name}: node {keys[i]} points to missing node {target}.")
            return code[target]

        weights = self._pick("target_weights")
        targets = a.n_targets if a.n_targets is not None else max(a.target_ids, default=0) + 1
        if len(weights) != len(a.target_ids) or (a.target_ids and max(a.target_ids) >= targets):
            raise popart_exception(
                f"{self.debug_name}: {len(a.target_ids)} target_ids (largest "
                f"{max(a.target_ids, default=0)}) for {len(weights)} weights and {targets} "
                f"targets.")
        leaf_values = np.zeros((len(leaf), targets))
        leaf_has = np.zeros((len(leaf), targets), bool)
        for tree, node, target, weight in zip(a.target_treeids, a.target_nodeids, a.target_ids,
                                              weights):
            index = code.get((tree, node), -1) - len(branch)
            if index < 0:
                raise popart_exception(
                    f"{self.debug_name}: target weight for ({tree}, {node}), not a LEAF node.")
            leaf_values[index, target] += weight
            leaf_has[index, target] = True
        children = {c for i in branch for c in (child(i, a.nodes_truenodeids),
                                                child(i, a.nodes_falsenodeids))}
        roots = sorted({code[k] for k in keys} - children,
                       key=lambda c: keys[(branch + leaf)[c]])
        missing = a.nodes_missing_value_tracks_true or (0,) * len(keys)
        base = self._pick("base_values")
        if len(base) not in (0, targets):
            raise popart_exception(
                f"{self.debug_name}: {len(base)} base_values for {targets} targets.")
        # Double thresholds (version 3) compare in double, as the input would.
        double = (x.dtype is DataType.DOUBLE
                  or getattr(a, "nodes_values_as_tensor", None) is not None)
        self._forest = Forest(
            self, x, features=[a.nodes_featureids[i] for i in branch],
            splits=splits[branch] if len(splits) else np.zeros(len(branch)),
            modes=[_MODE_NAMES[a.nodes_modes[i]] for i in branch],
            true_child=[child(i, a.nodes_truenodeids) for i in branch],
            false_child=[child(i, a.nodes_falsenodeids) for i in branch],
            missing_true=[missing[i] for i in branch],
            members=np.full((len(branch), 1), np.nan), roots=roots,
            leaf_values=leaf_values, leaf_has=leaf_has, aggregate=a.aggregate_function,
            transform=post_transform_name(self, a.post_transform),
            base_values=base if len(base) else None,
            compute=torch.float64 if double else torch.float32)
        return TensorInfo(DataType.FLOAT, (x.shape[0], targets))

    def kernel(self, x):
        return self._forest(x).to(torch.float32)

    def grad(self, g):
        """Piecewise constant in the features: zero gradient, so nothing flows back."""
