"""ai.graphcore PackedDataBlock (``builder.aiGraphcore.packedDataBlock``) and its
gradient: run a callback subgraph over packed variable-length sequences.

Inputs are triples (data_i, offsets_i, lengths_i), then the tensors the callback reads from the
enclosing graph (captured, see ``control_flow.SubgraphOp``):

- data_i [total_i, ...]: sequences of variable length laid end to end;
- offsets_i, lengths_i [num_sequences] int32: sequence s of input i is
  ``data_i[offsets_i[s] : offsets_i[s] + lengths_i[s]]``. Every input has the same number of
  sequences, a multiple of ``callbackBatchSize``.

Attributes: ``maxSequenceLengths`` (one padded length per input), ``resultSize``,
``callbackBatchSize`` and ``callback``, a graph taking one tensor per data input shaped
[callbackBatchSize, maxSequenceLengths[i], ...] and returning one tensor
[callbackBatchSize, maxSequenceLengths[0], ...].

The op unpacks every input into zero-padded [num_sequences, maxSequenceLengths[i], ...],
runs the callback on consecutive batches of ``callbackBatchSize`` sequences, and packs each
result sequence s back, its first ``lengths_0[s]`` rows at ``offsets_0[s]``, into a zero
output [resultSize, ...]. Sequences longer than their padded length, or reaching past their
data or the result, are errors (raised when the op runs: offsets and lengths are data).

Gradient: PackedDataBlockGrad runs the callback's gradient graph (``control_flow.grad_body``,
the forward recomputed inside) on the same batches, seeded with the output gradient unpacked at
the first input's offsets; the padded input gradients are scattered back (added, should
sequences overlap) into the packed layout, and the gradients of captured tensors are summed over
the batches. Offsets and lengths are integers and get no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError, popart_runtime_error
from ..ir.tensor import TensorInfo
from .control_flow import Body, SubgraphOp, grad_body, wanted_inputs
from .registry import AI_GRAPHCORE, register_op

_INDEX_DTYPES = (DataType.INT32, DataType.INT64)


class _Packed(SubgraphOp):
    """Shape checks and the unpack / pack arithmetic shared by the op and its gradient."""

    body_attrs = ("callback",)

    def check_operands(self, operands: list[TensorInfo | None]) -> int:
        """The number of sequences, after checking the (data, offsets, lengths) triples."""
        at = self.attrs
        if not operands or len(operands) % 3:
            raise ShapeError(
                f"{self.debug_name}: takes (data, offsets, lengths) triples, got "
                f"{len(operands)} operands."
            )
        count = len(operands) // 3
        if len(at.maxSequenceLengths) != count or any(m < 1 for m in at.maxSequenceLengths):
            raise ShapeError(
                f"{self.debug_name}: maxSequenceLengths={list(at.maxSequenceLengths)} needs one "
                f"length >= 1 per data input ({count})."
            )
        if at.callbackBatchSize < 1 or at.resultSize < 0:
            raise ShapeError(
                f"{self.debug_name}: callbackBatchSize={at.callbackBatchSize} must be >= 1 and "
                f"resultSize={at.resultSize} >= 0."
            )
        sequences = set()
        for i in range(count):
            data, offsets, lengths = operands[3 * i: 3 * i + 3]
            if data is None or data.rank < 1:
                raise ShapeError(f"{self.debug_name}: data {i} {data} must be [total, ...].")
            for name, info in (("offsets", offsets), ("lengths", lengths)):
                if info is None or info.rank != 1 or info.dtype not in _INDEX_DTYPES:
                    raise ShapeError(
                        f"{self.debug_name}: {name} {i} {info} must be int32 [num_sequences]."
                    )
                sequences.add(info.shape[0])
        if len(sequences) != 1:
            raise ShapeError(
                f"{self.debug_name}: the offsets and lengths give different numbers of "
                f"sequences {sorted(sequences)}; every input must have the same."
            )
        num = sequences.pop()
        if num % at.callbackBatchSize:
            raise ShapeError(
                f"{self.debug_name}: {num} sequences are not a multiple of callbackBatchSize="
                f"{at.callbackBatchSize}; the callback runs on whole batches."
            )
        self._num_inputs = count
        self._num_batches = num // at.callbackBatchSize
        return num

    def padded_infos(self, operands) -> list[TensorInfo]:
        """The callback's formal input infos: one batch of each padded data input."""
        at = self.attrs
        return [
            TensorInfo(data.dtype, (at.callbackBatchSize, length, *data.shape[1:]))
            for data, length in zip(operands[0::3], at.maxSequenceLengths)
        ]

    def _positions(self, offsets, lengths, max_length: int, total: int, what: str):
        """(row index [S, max_length], valid mask [S, max_length]) of packed sequences."""
        offsets = offsets.to(torch.int64)
        lengths = lengths.to(torch.int64)
        steps = torch.arange(max_length)
        ends = offsets + lengths
        if bool((lengths < 0).any() | (lengths > max_length).any() | (offsets < 0).any()
                | (ends > total).any()):
            raise popart_runtime_error(
                f"{self.debug_name}: {what}: offsets {offsets.tolist()} and lengths "
                f"{lengths.tolist()} must give sequences of at most {max_length} rows inside "
                f"its {total} rows."
            )
        index = offsets.unsqueeze(1) + steps
        mask = steps < lengths.unsqueeze(1)
        return index.clamp_(max=max(total - 1, 0)), mask

    @staticmethod
    def _unpack(data, index, mask):
        """[S, max_length, ...] with sequence s's rows, zeros past its length."""
        rows = data[index]
        return rows * mask.view(mask.shape + (1,) * (rows.dim() - 2)).to(rows.dtype)

    def unpack_all(self, operands):
        """Padded data inputs and their (index, mask), one per triple."""
        padded, positions = [], []
        for i in range(self._num_inputs):
            data, offsets, lengths = operands[3 * i: 3 * i + 3]
            index, mask = self._positions(offsets, lengths, self.attrs.maxSequenceLengths[i],
                                          data.shape[0], f"input {i}")
            padded.append(self._unpack(data, index, mask))
            positions.append((index, mask))
        return padded, positions

    def batches(self, tensors):
        size = self.attrs.callbackBatchSize
        for b in range(self._num_batches):
            yield [t[b * size:(b + 1) * size] for t in tensors]

    def cost(self):
        flops, moved = self.body_flops(self.attrs.callback)
        return flops * self._num_batches, moved * self._num_batches


@register_op("PackedDataBlock", versions=1, domain=AI_GRAPHCORE)
class PackedDataBlock(_Packed):
    """result[offsets_0[s] + t] = callback(unpacked batch)[s, t] for t < lengths_0[s]; see the
    module docstring."""

    @dataclass(frozen=True)
    class Attrs:
        maxSequenceLengths: tuple[int, ...]
        resultSize: int
        callbackBatchSize: int
        callback: Body

    def body_input_infos(self, attr, operands):
        self.check_operands(operands)
        return self.padded_infos(operands)

    def infer(self, *infos):
        operands, _ = self.split_inputs(infos)
        self.check_operands(operands)
        callback = self.attrs.callback
        formal = [callback.graph.tensors[t].info for t in callback.formal]
        expected = self.padded_infos(operands)
        if formal != expected:
            raise ShapeError(
                f"{self.debug_name}: the callback '{callback.graph.id}' takes "
                f"{[str(i) for i in formal]}, the op passes {[str(i) for i in expected]}."
            )
        outs = callback.output_infos()
        size, length = self.attrs.callbackBatchSize, self.attrs.maxSequenceLengths[0]
        if len(outs) != 1 or outs[0].rank < 2 or outs[0].shape[:2] != (size, length):
            raise ShapeError(
                f"{self.debug_name}: the callback must return one tensor [callbackBatchSize "
                f"{size}, maxSequenceLengths[0] {length}, ...], got {[str(i) for i in outs]}."
            )
        return TensorInfo(outs[0].dtype, (self.attrs.resultSize, *outs[0].shape[2:]))

    def kernel(self, *xs):
        count = 3 * self._num_inputs
        operands, captured = list(xs[:count]), list(xs[count:])
        padded, _ = self.unpack_all(operands)
        results = [self.run_body(self.attrs.callback, batch, captured)[0]
                   for batch in self.batches(padded)]
        out = torch.cat(results)
        offsets, lengths = operands[1], operands[2]
        index, mask = self._positions(offsets, lengths, self.attrs.maxSequenceLengths[0],
                                      self.attrs.resultSize, "the result")
        result = out.new_zeros((self.attrs.resultSize, *out.shape[2:]))
        result[index[mask]] = out[mask]
        return result

    def grad(self, g):
        count = 3 * self._num_inputs
        callback = self.attrs.callback
        data = [3 * i for i in range(self._num_inputs)]
        wanted = wanted_inputs(g, self, [*data, *range(count, len(self.inputs))])
        if not wanted or not self.outputs[0].info.dtype.is_float:
            return
        captured = [i for i in wanted if i >= count]
        # The body's gradient wrt every padded input (zeros where none), then the captured.
        local = list(callback.formal) + [self.inputs[i].id for i in captured]
        infos = (self.padded_infos([t.info for t in self.inputs[:count]])
                 + [self.inputs[i].info for i in captured])
        seed = callback.graph.unique_id(f"{callback.outputs[0]}/packed_grad")
        body = grad_body(g, self, callback, [seed], local, infos, "callback_grad",
                         keep_formal=True)
        # The seed is computed by the grad op from the output gradient (one batch at a time),
        # so it becomes the body's last formal input instead of a captured tensor.
        inputs = body.graph.inputs
        inputs.remove(seed)
        inputs.insert(body.num_formal, seed)
        body = Body(body.graph, body.num_formal + 1)
        operands = [g.input(i) for i in range(count)]
        outs = g.op("PackedDataBlockGrad", g.output_grad(0), *operands, *body.captured,
                    domain=AI_GRAPHCORE, num_outputs=self._num_inputs + len(captured),
                    maxSequenceLengths=self.attrs.maxSequenceLengths,
                    resultSize=self.attrs.resultSize,
                    callbackBatchSize=self.attrs.callbackBatchSize, callback=body)
        outs = [outs] if isinstance(outs, str) else outs
        for index, grad_id in zip([*data, *captured], outs):
            g.set_input_grad(index, grad_id)


@register_op("PackedDataBlockGrad", versions=1, domain=AI_GRAPHCORE)
class PackedDataBlockGrad(_Packed):
    """Gradients of every data input, then of the captured tensors the gradient body outputs,
    from dResult and the forward's triples (module docstring)."""

    @dataclass(frozen=True)
    class Attrs:
        maxSequenceLengths: tuple[int, ...]
        resultSize: int
        callbackBatchSize: int
        callback: Body  # the callback's gradient graph: padded inputs, seed -> gradients

    def infer(self, *infos):
        operands, _ = self.split_inputs(infos)
        d_result, operands = operands[0], operands[1:]
        self.check_operands(operands)
        if d_result.shape[0] != self.attrs.resultSize:
            raise ShapeError(
                f"{self.debug_name}: dResult {d_result} must have {self.attrs.resultSize} rows."
            )
        outs = self.attrs.callback.output_infos()
        return [t for t in operands[0::3]] + outs[self._num_inputs:]

    def kernel(self, d_result, *xs):
        count = 3 * self._num_inputs
        operands, captured = list(xs[:count]), list(xs[count:])
        padded, positions = self.unpack_all(operands)
        index, mask = self._positions(operands[1], operands[2], self.attrs.maxSequenceLengths[0],
                                      self.attrs.resultSize, "the result")
        seeds = self._unpack(d_result, index, mask)
        d_padded = [[] for _ in range(self._num_inputs)]
        d_captured = None
        for batch in self.batches([*padded, seeds]):
            outs = self.run_body(self.attrs.callback, batch, captured)
            for i in range(self._num_inputs):
                d_padded[i].append(outs[i])
            rest = outs[self._num_inputs:]
            d_captured = rest if d_captured is None else [a + b for a, b in zip(d_captured, rest)]
        grads = []
        for i, (data_index, data_mask) in enumerate(positions):
            data = operands[3 * i]
            dx = data.new_zeros(data.shape)
            dx.index_put_((data_index[data_mask],), torch.cat(d_padded[i])[data_mask],
                          accumulate=True)
            grads.append(dx)
        return self.result(grads + list(d_captured or []))
