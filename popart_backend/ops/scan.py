"""Scan (ai.onnx versions 8 to 21): iterate a body over the sequence axis of its scan
inputs, carrying states from one step to the next and stacking the per-step scan outputs.

Version 8 has a leading batch axis on every operand and an optional sequence_lens first
operand; versions 9+ scan along ``scan_input_axes`` in ``scan_input_directions`` and stack
along ``scan_output_axes``. Bodies, captured inputs and body execution come from
``control_flow.SubgraphOp``. Versions 9+ are differentiable (unrolled, like Loop).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ShapeError, popart_exception
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .control_flow import (
    Body,
    SubgraphOp,
    call,
    check_body_outputs,
    check_unroll,
    grad_body,
    sum_grads,
    wanted_inputs,
)
from .registry import register_op


@register_op("Scan", versions=(8, 9, 11, 16, 19, 21, 23, 24, 25))
class Scan(SubgraphOp):
    """(states, scan outputs) = iterate body(states, slices) over the scan inputs' sequence axis.

    Version 8 has a leading batch axis on every operand (scan inputs are [batch, seq, ...]) and
    an optional first operand sequence_lens; versions 9+ scan along ``scan_input_axes``.
    """

    # Set by ``infer`` from the operands (version 8 has the batch axis); the cost reads them.
    _seq_len = 1
    _batch = 1

    @dataclass(frozen=True)
    class Attrs:
        body: Body
        num_scan_inputs: int
        scan_input_axes: tuple[int, ...] = ()
        scan_input_directions: tuple[int, ...] = ()
        scan_output_axes: tuple[int, ...] = ()
        scan_output_directions: tuple[int, ...] = ()

    @dataclass(frozen=True)
    class Attrs8:
        body: Body
        num_scan_inputs: int
        directions: tuple[int, ...] = ()

    body_attrs = ("body",)
    fwd_outputs_blocker = ("its gradient unrolls the steps, and the values a step computes "
                           "are not outputs of the Scan")

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs8 if version < 9 else cls.Attrs

    def _groups(self, operands):
        """(sequence_lens, states, scan inputs) infos."""
        seq_lens = None
        if self.version < 9:
            if not operands:
                raise ShapeError(f"{self.debug_name}: Scan-8 takes sequence_lens first.")
            seq_lens, operands = operands[0], operands[1:]
        m = self.attrs.num_scan_inputs
        if not 0 < m <= len(operands):
            raise ShapeError(
                f"{self.debug_name}: num_scan_inputs={m}, but it has {len(operands)} states and "
                f"scan inputs."
            )
        return seq_lens, list(operands[: len(operands) - m]), list(operands[len(operands) - m:])

    def _input_axes(self, scans) -> list[int]:
        if self.version < 9:
            return [1] * len(scans)
        axes = self.attrs.scan_input_axes or (0,) * len(scans)
        return [normalize_axis(self, a, s.rank) for a, s in zip(axes, scans)]

    def body_input_infos(self, attr, operands):
        _, states, scans = self._groups(operands)
        if self.version < 9:
            states = [s.with_shape(s.shape[1:]) for s in states]
            return [*states, *(s.with_shape(s.shape[2:]) for s in scans)]
        axes = self._input_axes(scans)
        slices = [s.with_shape(s.shape[:a] + s.shape[a + 1:]) for s, a in zip(scans, axes)]
        return [*states, *slices]

    def infer(self, *infos):
        operands, _ = self.split_inputs(infos)
        seq_lens, states, scans = self._groups(operands)
        body = self.attrs.body
        expected = self.body_input_infos("body", operands)
        formal = [body.graph.tensors[t].info for t in body.formal]
        if formal != expected:
            raise ShapeError(
                f"{self.debug_name}: the body takes {[str(i) for i in formal]}, the operands "
                f"give {[str(i) for i in expected]}."
            )
        axes = self._input_axes(scans)
        lengths = {s.shape[a] for s, a in zip(scans, axes)}
        if len(lengths) != 1:
            raise ShapeError(
                f"{self.debug_name}: scan inputs have different sequence lengths {sorted(lengths)}."
            )
        self._seq_len = lengths.pop()
        n = len(states)
        outs = check_body_outputs(self, body, n, "the states")
        for k, (before, after) in enumerate(zip(expected[:n], outs[:n])):
            if before != after:
                raise ShapeError(
                    f"{self.debug_name}: state {k} is {before} before an iteration and {after} "
                    f"after it; a state must keep its shape and type."
                )
        self._num_states = n
        self._input_axes_ = axes
        if self.version < 9:
            batch = {x.shape[0] for x in (*states, *scans)}
            if len(batch) != 1:
                raise ShapeError(f"{self.debug_name}: operands have batch sizes {sorted(batch)}.")
            self._batch = batch.pop()
            if seq_lens is not None and seq_lens.shape != (self._batch,):
                raise ShapeError(
                    f"{self.debug_name}: sequence_lens is {seq_lens}, expected i64[{self._batch}]."
                )
            return [*states, *(TensorInfo(o.dtype, (self._batch, self._seq_len, *o.shape))
                               for o in outs[n:])]
        out_axes = self.attrs.scan_output_axes or (0,) * len(outs[n:])
        self._output_axes = [
            normalize_axis(self, a, o.rank + 1) for a, o in zip(out_axes, outs[n:])
        ]
        results = list(states)
        for o, a in zip(outs[n:], self._output_axes):
            results.append(TensorInfo(o.dtype, (*o.shape[:a], self._seq_len, *o.shape[a:])))
        return results

    def kernel(self, *xs):
        captured_count = len(self.captured_ids())
        split = len(xs) - captured_count
        operands, captured = list(xs[:split]), list(xs[split:])
        if self.version < 9:
            return self.result(self._run_batched(operands, captured))
        n = self._num_states
        states, scans = operands[:n], operands[n:]
        directions = self.attrs.scan_input_directions or (0,) * len(scans)
        sequences = []
        for x, axis, reverse in zip(scans, self._input_axes_, directions):
            x = x.movedim(axis, 0)
            sequences.append(x.flip(0) if reverse else x)
        states, collected = self._iterate(states, sequences, range(self._seq_len), captured)
        out_dirs = self.attrs.scan_output_directions or (0,) * len(collected)
        results = list(states)
        for k, (values, axis) in enumerate(zip(collected, self._output_axes)):
            stacked = torch.stack(values) if values else torch.zeros(
                self.outputs[n + k].info.shape, dtype=self.outputs[n + k].info.dtype.torch)
            if values and out_dirs[k]:
                stacked = stacked.flip(0)
            results.append(stacked.movedim(0, axis) if values else stacked)
        return results[0] if len(self.outputs) == 1 else tuple(results[: len(self.outputs)])

    def _iterate(self, states, sequences, steps, captured):
        body = self.attrs.body
        n = len(states)
        collected: list[list[torch.Tensor]] = []
        for t in steps:
            outs = self.run_body(body, [*states, *(x[t] for x in sequences)], captured)
            states = outs[:n]
            if not collected:
                collected = [[] for _ in outs[n:]]
            for acc, value in zip(collected, outs[n:]):
                acc.append(value)
        return states, collected

    def _run_batched(self, operands, captured):
        n = self._num_states
        seq_lens, states, scans = operands[0], operands[1 : 1 + n], operands[1 + n :]
        directions = self.attrs.directions or (0,) * len(scans)
        final_states = [[] for _ in range(n)]
        scan_results = [
            torch.zeros(info.shape, dtype=info.dtype.torch) for info in self._scan_infos()
        ]
        for b in range(self._batch):
            length = int(seq_lens[b]) if seq_lens is not None else self._seq_len
            if not 0 <= length <= self._seq_len:
                raise popart_exception(
                    f"{self.debug_name}: sequence_lens[{b}] = {length} is outside [0, "
                    f"{self._seq_len}]."
                )
            sequences = []
            for x, reverse in zip(scans, directions):
                x = x[b, :length]
                sequences.append(x.flip(0) if reverse else x)
            s, collected = self._iterate([st[b] for st in states], sequences, range(length),
                                         captured)
            for k in range(n):
                final_states[k].append(s[k])
            for k, values in enumerate(collected):
                if values:
                    scan_results[k][b, :length] = torch.stack(values)
        return [*(torch.stack(v) for v in final_states), *scan_results]

    def _scan_infos(self) -> list[TensorInfo]:
        outs = self.attrs.body.output_infos()[self._num_states:]
        return [TensorInfo(o.dtype, (self._batch, self._seq_len, *o.shape)) for o in outs]

    def cost(self):
        flops, moved = self.body_flops(self.attrs.body)
        reps = self._seq_len * self._batch
        return flops * reps, moved * reps

    def grad(self, g):
        """Unrolled like Loop's gradient (``control_flow``): forward recompute step by step,
        then each step's backward as a Call of the body's gradient graph, last step first."""
        if self.version < 9:
            raise popart_exception(
                f"{self.debug_name}: Scan-8 (batched, with sequence_lens) is not differentiable. "
                f"Import the model at opset 9 or later, where Scan has no batch axis.")
        body, n = self.attrs.body, self._num_states
        num_operands = len(self.inputs) - len(self.captured_ids())
        scans = list(range(n, num_operands))
        floats = [i for i in range(num_operands) if self.inputs[i].info.dtype.is_float]
        captured = wanted_inputs(g, self, range(num_operands, len(self.inputs)))
        if not captured and not any(g.needs_input_grad(i) for i in floats):
            return
        steps = self._seq_len
        check_unroll(self, steps)
        in_dirs = self.attrs.scan_input_directions or (0,) * len(scans)
        out_dirs = self.attrs.scan_output_directions or (0,) * (len(body.outputs) - n)
        position = {t: g.const(np.array(t, np.int64), f"step{t}") for t in range(steps)}

        def at(step: int, reverse: int) -> str:
            return position[steps - 1 - step if reverse else step]

        slices = [[g.op("Gather", g.input(i), at(t, rev), axis=axis)
                   for i, axis, rev in zip(scans, self._input_axes_, in_dirs)]
                  for t in range(steps)]
        states = [[g.input(k) for k in range(n)]]
        for t in range(steps):
            states.append(call(g, body, [*states[-1], *slices[t]], len(body.outputs))[:n])
        state_grads = {k: g.output_grad(k) for k in range(n) if k in floats}
        out_seeds = {k: g.output_grad(n + k) for k, t in enumerate(self.outputs[n:])
                     if t is not None and t.info.dtype.is_float}
        local = [body.formal[i] for i in floats] + [self.inputs[i].id for i in captured]
        infos = [body.graph.tensors[body.formal[i]].info for i in floats] + [
            self.inputs[i].info for i in captured]
        slice_grads: dict[int, dict[int, str]] = {i: {} for i in floats if i >= n}
        captured_grads: list[list[str]] = [[] for _ in captured]
        for t in reversed(range(steps)):
            seeds = [state_grads.get(k) for k in range(n)]
            for k, axis in enumerate(self._output_axes):
                seeds.append(g.op("Gather", out_seeds[k], at(t, out_dirs[k]), axis=axis)
                             if k in out_seeds else None)
            gbody = grad_body(g, self, body, seeds, local, infos, f"step{t}_grad",
                              keep_formal=True)
            outs = call(g, gbody, [*states[t], *slices[t]], len(local))
            state_grads = {i: outs[j] for j, i in enumerate(floats) if i < n}
            for j, i in enumerate(floats):
                if i >= n:
                    k = i - n
                    pos = steps - 1 - t if in_dirs[k] else t
                    slice_grads[i][pos] = outs[j]
            for acc, grad_id in zip(captured_grads, outs[len(floats):]):
                acc.append(grad_id)
        for k in range(n):
            if k in state_grads:
                g.set_input_grad(k, state_grads[k])
        for i, parts in slice_grads.items():
            axis = self._input_axes_[i - n]
            pieces = [g.op("Unsqueeze", parts[p], g.const(np.array([axis], np.int64), "axis"))
                      for p in range(steps)]
            g.set_input_grad(i, pieces[0] if steps == 1 else g.op("Concat", *pieces, axis=axis))
        sum_grads(g, self, captured, captured_grads)
