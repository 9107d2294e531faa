"""The ai.graphcore Builder methods whose arguments nest (F17): ``multiconv`` takes a list of
per-conv input lists and per-conv attribute lists, ``packedDataBlock`` a callback subgraph.

ONNX attributes cannot nest lists, so these methods flatten their arguments into the node layout
their ops document (ops/multiconv.py, ops/packed_data_block.py). ``opsets.opset_class``
adds them to the ai.graphcore opset class next to the generated methods.
"""

from __future__ import annotations

from typing import Any

from onnx import AttributeProto

from ..errors import popart_exception
from ..ir.signature import FLOAT, FLOATS, INT, INTS, STRING
from ..ops.multiconv import PER_CONV_LISTS, check_hints
from .base import AI_GRAPHCORE, Opset, make_attribute


def _id_list(where: str, what: str, ids) -> list[str]:
    if isinstance(ids, str) or not isinstance(ids, (list, tuple)) or not all(
        isinstance(i, str) for i in ids
    ):
        raise popart_exception(f"{where}: {what} must be a list of tensor ids, got {ids!r}.")
    return list(ids)


def _per_conv_lists(where: str, num_convs: int, lists: dict[str, Any]) -> list[AttributeProto]:
    """The flattened per-convolution list attributes of a MultiConv node.

    Each value is [] (defaults for every conv) or one list per conv, where [] again means that
    conv's defaults. The number of spatial dims comes from the lists that are given."""
    spatial: set[int] = set()
    for name, outer in lists.items():
        if isinstance(outer, (str, bytes)) or not isinstance(outer, (list, tuple)):
            raise popart_exception(f"{where}: {name} must be a list of lists, got {outer!r}.")
        if outer and len(outer) != num_convs:
            raise popart_exception(
                f"{where}: {name}={list(outer)} needs one list per convolution ({num_convs}) "
                f"or none."
            )
        per_dim = PER_CONV_LISTS[name][0]
        for inner in outer:
            if isinstance(inner, (str, bytes)) or not isinstance(inner, (list, tuple)):
                raise popart_exception(
                    f"{where}: {name}={list(outer)}: each entry must be a list (one per "
                    f"convolution), got {inner!r}."
                )
            if inner:
                if len(inner) % per_dim:
                    raise popart_exception(
                        f"{where}: {name} entry {list(inner)} needs {per_dim} values per "
                        f"spatial dim."
                    )
                spatial.add(len(inner) // per_dim)
    if len(spatial) > 1:
        raise popart_exception(
            f"{where}: the per-conv lists imply different numbers of spatial dims "
            f"{sorted(spatial)}; one MultiConv takes convolutions of the same rank."
        )
    attributes = []
    for name, outer in lists.items():
        if not outer or not spatial:
            continue
        per_dim, default = PER_CONV_LISTS[name]
        n = next(iter(spatial))
        flat = [v for inner in outer for v in (list(inner) or [default] * (per_dim * n))]
        attributes.append(make_attribute(name, flat, INTS, where))
    return attributes


def multiconv(self: Opset, args, dilations=(), inDilations=(), pads=(),
              outPads=(), strides=(), availableMemoryProportions=(),
              partialsTypes=(), planType=None, perConvReservedTiles=None,
              cycleBackOff=None, enableConvDithering=(), debugContext=""):
    """Add an ai.graphcore MultiConv node: independent convolutions planned together.

    ``args`` holds one [data, weights] or [data, weights, bias] list per convolution; the
    dilations, inDilations, strides (n values), pads and outPads (2n, begins then ends) lists
    hold one list per convolution ([] for defaults). The remaining options are planning hints
    of the IPU (checked and recorded, no numeric effect). Returns one output id per conv."""
    where = f"{self.name}.multiconv"
    if isinstance(args, str) or not isinstance(args, (list, tuple)) or not args:
        raise popart_exception(
            f"{where}: args must be a non-empty list of [data, weights(, bias)] lists, got "
            f"{args!r}."
        )
    inputs: list[str] = []
    for k, conv in enumerate(args):
        ids = _id_list(where, f"args[{k}]", conv)
        if len(ids) not in (2, 3):
            raise popart_exception(
                f"{where}: args[{k}]={ids} must be [data, weights] or [data, weights, bias]."
            )
        inputs += ids + [""] * (3 - len(ids))
    num = len(args)
    proportions = list(availableMemoryProportions)
    partials = [str(p).lower() for p in partialsTypes]
    dithering = [int(d) for d in enableConvDithering]
    check_hints(where, num, proportions, partials, planType, perConvReservedTiles, cycleBackOff,
                dithering)
    attributes = _per_conv_lists(where, num, {
        "strides": strides, "pads": pads, "dilations": dilations, "inDilations": inDilations,
        "outPads": outPads,
    })
    hints = [("availableMemoryProportions", proportions, FLOATS),
             ("partialsTypes", partials, AttributeProto.STRINGS),
             ("planType", planType, STRING), ("perConvReservedTiles", perConvReservedTiles, INT),
             ("cycleBackOff", cycleBackOff, FLOAT), ("enableConvDithering", dithering, INTS)]
    for name, value, attr_type in hints:
        if value is not None and not (isinstance(value, list) and not value):
            attributes.append(make_attribute(name, value, attr_type, where))
    builder = self.builder
    builder._check_known(inputs, where)
    builder._fix_opset(AI_GRAPHCORE, 1)
    return builder._add_node("MultiConv", AI_GRAPHCORE, inputs, num, attributes, debugContext)


def packed_data_block(self: Opset, args, maxSequenceLengths, resultSize,
                      callbackBatchSize, callback, debugContext=""):
    """Add an ai.graphcore PackedDataBlock node; returns its output id.

    ``args`` is [data_0, offsets_0, lengths_0, data_1, ...]: packed sequences and where each
    starts and how long it is. The op unpacks them into zero-padded batches of
    ``callbackBatchSize`` sequences (``maxSequenceLengths[i]`` long), runs ``callback`` (a
    subgraph builder) on each batch and packs its results at the first input's offsets and
    lengths into an output of ``resultSize`` rows."""
    where = f"{self.name}.packedDataBlock"
    inputs = _id_list(where, "args", args)
    if not inputs or len(inputs) % 3:
        raise popart_exception(
            f"{where}: args must hold (data, offsets, lengths) triples, got {len(inputs)} ids "
            f"{inputs}."
        )
    attributes = [
        make_attribute("maxSequenceLengths", maxSequenceLengths, INTS, where),
        make_attribute("resultSize", resultSize, INT, where),
        make_attribute("callbackBatchSize", callbackBatchSize, INT, where),
        make_attribute("callback", callback, AttributeProto.GRAPH, where),
    ]
    if len(attributes[0].ints) != len(inputs) // 3:
        raise popart_exception(
            f"{where}: maxSequenceLengths={list(attributes[0].ints)} needs one length per data "
            f"input ({len(inputs) // 3})."
        )
    builder = self.builder
    builder._check_known(inputs, where)
    builder._fix_opset(AI_GRAPHCORE, 1)
    return builder._add_node("PackedDataBlock", AI_GRAPHCORE, inputs, 1, attributes,
                             debugContext)[0]


GRAPHCORE_METHODS = {"multiconv": multiconv, "packedDataBlock": packed_data_block}
