"""Flattened input signatures of a wrapper call: ``forward``'s arguments bound by
name, flattened into tensor and constant leaves with their paths, and the combined-batch check.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .errors import Error

__all__ = [
    "InputSignature",
    "LeafSpec",
    "bind_inputs",
    "check_combined_batch",
    "flatten_inputs",
]



@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """One flattened input leaf: a tensor (dtype, full host shape) or a constant value."""

    path: str
    is_tensor: bool
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] = ()
    value: Any = None

    def describe(self) -> str:
        if self.is_tensor:
            return f"{str(self.dtype).replace('torch.', '')}{list(self.shape)}"
        return repr(self.value)


@dataclasses.dataclass(frozen=True)
class InputSignature:
    """The flattened ``(args, kwargs)`` of one call, named by ``forward``'s signature."""

    treedef: Any
    leaves: tuple[LeafSpec, ...]

    def key(self):
        return (str(self.treedef), tuple(
            (leaf.path, leaf.is_tensor, leaf.dtype, leaf.shape,
             None if leaf.is_tensor else repr(leaf.value)) for leaf in self.leaves))


def bind_inputs(forward, args: tuple, kwargs: dict) -> dict:
    """``forward``'s arguments by name with defaults filled; raises Error on a bad call."""
    signature = inspect.signature(forward)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise Error(f"The call does not match forward{signature}: {exc}.") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def flatten_inputs(named: dict) -> tuple[list, InputSignature]:
    """Leaves (tensors and constants) and the signature describing them."""
    leaves_with_paths, treedef = pytree.tree_flatten_with_path(named)
    specs, leaves = [], []
    for path, leaf in leaves_with_paths:
        name = _path_name(path)
        if isinstance(leaf, torch.Tensor):
            specs.append(LeafSpec(name, True, leaf.dtype, tuple(leaf.shape)))
        else:
            specs.append(LeafSpec(name, False, value=leaf))
        leaves.append(leaf)
    return leaves, InputSignature(treedef, tuple(specs))


def _path_name(path) -> str:
    text = ""
    for i, entry in enumerate(path):
        part = pytree.keystr((entry,))
        if i == 0 and part.startswith("['") and part.endswith("']"):
            text += part[2:-2]
        else:
            text += part
    return text


def check_combined_batch(signature: InputSignature, options) -> int:
    """Each batched tensor's dim 0 must be a multiple of N·R·G; returns that product."""
    n = options.device_iterations
    r = options.replication_factor
    group = options.input_replica_grouping[0]
    g = options.Training.gradient_accumulation
    factor = n * options.input_replicas * g
    for leaf in signature.leaves:
        if not leaf.is_tensor or not leaf.shape:
            continue
        if leaf.shape[0] % factor:
            raise Error(
                f"input {leaf.path}: batch dimension {leaf.shape[0]} is not a multiple of "
                f"deviceIterations({n}) × replicationFactor({r})/input_group_size({group}) × "
                f"gradientAccumulation({g}) = {factor}. Each call takes micro-batch × "
                f"deviceIterations × replicas × gradientAccumulation samples in dim 0: "
                f"pass {factor}·B rows, e.g. with poptorch_lite.DataLoader(options, ...).")
    return factor
