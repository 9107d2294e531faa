"""IPU ops usable inside ``forward``, one module per family:

- ``core``: ``identity_loss``, ``nop``, ``set_available_memory``, ``ipu_print_tensor``,
  ``custom_op``;
- ``control_flow``: ``for_loop`` (ONNX Loop) and ``cond`` (ONNX If);
- ``ipu``: ``dynamic_slice``/``dynamic_update``, ``serializedMatMul``,
  ``recomputationCheckpoint``, ``set_overlap_for_input/output``, ``ctc_beam_search_decoder``;
- ``cluster``: ``fps``/``nearest`` (torch_cluster-style, as host callbacks on the IPU);
- ``scopes``: ``MultiConv``, ``NameScope``, ``Attribute``; ``cpu``: ``CPU`` host callbacks.

Each traced op is a ``torch.library`` custom op (or a torch higher-order op) whose ONNX
translation ``translation_table()`` hands to the exporter.
"""

from __future__ import annotations

from . import cluster, control_flow, core, cpu, ipu, scopes
from .cluster import *
from .control_flow import *
from .core import *
from .cpu import *
from .ipu import *
from .scopes import *

__all__ = [*core.__all__, *control_flow.__all__, *ipu.__all__, *scopes.__all__, *cpu.__all__,
           *cluster.__all__]


def translation_table() -> dict:
    """``custom_translation_table`` entries for ``torch.onnx.export``."""
    table = core.translation_table()
    table.update(ipu.translation_table())
    table.update(cpu.translation_table())
    return table
