"""ai.graphcore LSTM (``builder.aiGraphcore.lstm``) and its gradient, PopartLSTMGrad.

PopART's own LSTM keeps its weights in Poplar's layout rather than ONNX's:

- X [S, N, I]: sequence first.
- weights [4, I + H, H]: per gate, the input weights (rows 0..I-1) stacked over the recurrence
  weights (rows I..I+H-1), so gate_g = X_t·weights[g][:I] + H_{t-1}·weights[g][I:] + bias[g].
- bias [4, H]: one bias per gate (ONNX has two, one for W and one for R).
- initial state (optional) [2, N, H]: index 0 the initial output H_0, index 1 the initial cell
  state C_0; zeros when absent.
- sequence lengths (optional) [N] int32: rows past their length keep their state and give
  zeros in the full output, as in the ONNX LSTM.

Gates along dim 0 are in Poplar's order: forget, input, candidate (cell), output. The cell is
the standard one: f, i, o = sigmoid(.), c~ = tanh(.), C_t = f ⊙ C_{t-1} + i ⊙ c~,
H_t = o ⊙ tanh(C_t).

Outputs: output [S, N, H] (every H_t) when ``outputFullSequence`` is 1, else [N, H] (the last
valid H_t of each row); cell state [N, H] (the final C_t).

The computation is the ai.onnx LSTM's (``rnn.py``): the operands are re-laid out into ONNX's
W/R/B (gate order i, o, f, c) and its forward and back-propagation-through-time run unchanged,
with this op's partials type: lstmOptions["partialsType"] = "half" marks a float16 LSTM (and
its PopartLSTMGrad) ``half_partials``, and its cell products then sum in float16 (``rnn.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.signature import INT, AttrSpec, BuilderMethod
from ..ir.tensor import TensorInfo
from .registry import AI_GRAPHCORE, register_op
from .rnn import LSTM as OnnxLSTM

# ONNX gate k (i, o, f, c) is Poplar gate _ONNX_FROM_POPLAR[k] (f=0, i=1, c=2, o=3).
_ONNX_FROM_POPLAR = (1, 3, 0, 2)
# Poplar gate g is ONNX gate _POPLAR_FROM_ONNX[g].
_POPLAR_FROM_ONNX = tuple(_ONNX_FROM_POPLAR.index(g) for g in range(4))


class _PopartLSTMBase(Op):
    """Operand checks and the layout conversions shared by LSTM and PopartLSTMGrad."""

    @dataclass(frozen=True)
    class Attrs:
        outputFullSequence: int = 1

    def _check(self, x, w, b, state, lens) -> tuple[int, int, int, int]:
        """(S, N, I, H) after checking the operands against the layout of the module docstring."""
        if x is None or w is None or b is None:
            raise ShapeError(f"{self.debug_name}: X, weights and bias are required.")
        if not x.dtype.is_float or x.rank != 3:
            raise ShapeError(
                f"{self.debug_name}: X {x} must be a rank-3 float tensor [seq_len, batch, "
                f"input_size]."
            )
        seq, batch, inp = x.shape
        if w.rank != 3 or w.shape[0] != 4 or w.shape[1] <= inp:
            raise ShapeError(
                f"{self.debug_name}: weights {w} must be [4, input_size + hidden_size, "
                f"hidden_size] with input_size {inp} (X {x})."
            )
        hidden = w.shape[2]
        expect = {
            "weights": (w, (4, inp + hidden, hidden)),
            "bias": (b, (4, hidden)),
            "initial state": (state, (2, batch, hidden)),
            "sequence lengths": (lens, (batch,)),
        }
        for name, (info, shape) in expect.items():
            if info is not None and info.shape != shape:
                raise ShapeError(
                    f"{self.debug_name}: {name} is {info}, expected shape {list(shape)} "
                    f"(X {x}, hidden_size {hidden})."
                )
            if info is not None and name != "sequence lengths" and info.dtype != x.dtype:
                raise ShapeError(f"{self.debug_name}: {name} is {info}, X is {x}; types must match.")
        if lens is not None and lens.dtype not in (DataType.INT32, DataType.INT64):
            raise ShapeError(f"{self.debug_name}: sequence lengths must be int32, got {lens}.")
        if self.attrs.outputFullSequence not in (0, 1):
            raise ShapeError(
                f"{self.debug_name}: outputFullSequence={self.attrs.outputFullSequence} must be "
                f"0 or 1."
            )
        self._sizes = (seq, batch, inp, hidden)
        # The ai.onnx LSTM (default attributes: one forward direction, sigmoid/tanh/tanh) does
        # the arithmetic on the re-laid-out operands.
        version = OnnxLSTM.versions[-1]
        self._onnx = OnnxLSTM(OnnxLSTM.attrs_type(version)(), self.settings, version)
        self._onnx._setup(
            x, x.with_shape((1, 4 * hidden, inp)), x.with_shape((1, 4 * hidden, hidden)),
            x.with_shape((1, 8 * hidden)), lens, None, None, None,
        )
        return seq, batch, inp, hidden

    def _output_infos(self, x: TensorInfo) -> list[TensorInfo]:
        seq, batch, _, hidden = self._sizes
        out = (seq, batch, hidden) if self.attrs.outputFullSequence else (batch, hidden)
        return [x.with_shape(out), x.with_shape((batch, hidden))]

    def _onnx_operands(self, w, b, state):
        """ONNX W [1, 4H, I], R [1, 4H, H], B [1, 8H], initial_h, initial_c from PopART's."""
        _, _, inp, hidden = self._sizes
        per_gate = w[list(_ONNX_FROM_POPLAR)].transpose(1, 2)  # [4, H, I + H]
        onnx_w = per_gate[:, :, :inp].reshape(1, 4 * hidden, inp)
        onnx_r = per_gate[:, :, inp:].reshape(1, 4 * hidden, hidden)
        onnx_b = torch.cat([b[list(_ONNX_FROM_POPLAR)].reshape(-1), b.new_zeros(4 * hidden)])
        h0 = state[0:1] if state is not None else None
        c0 = state[1:2] if state is not None else None
        return onnx_w, onnx_r, onnx_b.unsqueeze(0), h0, c0


@register_op("LSTM", versions=1, domain=AI_GRAPHCORE)
class LSTM(_PopartLSTMBase):
    """PopART's LSTM: inputs X, weights, bias, [initial state], [sequence lengths]; outputs the
    output (sequence or last) and the final cell state. Layout in the module docstring."""

    builder_method = BuilderMethod("lstm", (3, 5), 2, (AttrSpec("outputFullSequence", INT, 1),))
    # lstmOptions["partialsType"] = "half" may make a float16 LSTM accumulate in float16.
    supports_lstm_half_partials = True

    def infer(self, x, w, b, state=None, lens=None):
        self._check(x, w, b, state, lens)
        return self._output_infos(x)

    def kernel(self, x, w, b, state=None, lens=None):
        onnx_w, onnx_r, onnx_b, h0, c0 = self._onnx_operands(w, b, state)
        y, yh, yc = self._onnx.run_forward(x, onnx_w, onnx_r, onnx_b, lens, h0, c0,
                                           half=self.settings.half_partials)
        out = y[:, 0] if self.attrs.outputFullSequence else yh[0]
        return out.contiguous(), yc[0].contiguous()

    def cost(self):
        seq, batch, inp, hidden = self._sizes
        # The gate products, plus ~10 elementwise operations per gate element and step.
        flops = 2 * seq * batch * 4 * hidden * (inp + hidden) + 40 * seq * batch * hidden
        return flops, super().cost()[1]

    def grad(self, g):
        ins = [g.input(i) if g.has_input(i) else None for i in range(5)]
        outs = [g.output_grad(k) for k in range(2)]
        grads = g.op("PopartLSTMGrad", *ins, *outs, domain=AI_GRAPHCORE, num_outputs=4,
                     outputFullSequence=self.attrs.outputFullSequence)
        for index in range(4):
            if g.has_input(index):
                g.set_input_grad(index, grads[index])


@register_op("PopartLSTMGrad", versions=1, domain=AI_GRAPHCORE)
class PopartLSTMGrad(_PopartLSTMBase):
    """d X, d weights, d bias, d initial state of the ai.graphcore LSTM, from its operands and
    the gradients of (output, cell state), by back-propagation through time (``rnn.py``)."""

    supports_lstm_half_partials = True  # inherits its LSTM's mark

    def infer(self, x, w, b, state, lens, d_out, d_cell):
        self._check(x, w, b, state, lens)
        expected = self._output_infos(x)
        for name, got, want in (("output", d_out, expected[0]), ("cell state", d_cell, expected[1])):
            if got.shape != want.shape:
                raise ShapeError(
                    f"{self.debug_name}: the gradient of the {name} is {got}, expected {want}."
                )
        _, batch, _, hidden = self._sizes
        return [x, w, b, x.with_shape((2, batch, hidden))]

    def kernel(self, x, w, b, state, lens, d_out, d_cell):
        _, _, inp, hidden = self._sizes
        onnx_w, onnx_r, onnx_b, h0, c0 = self._onnx_operands(w, b, state)
        if self.attrs.outputFullSequence:
            dy, dyh = d_out.unsqueeze(1), None
        else:
            dy, dyh = None, d_out.unsqueeze(0)
        dx, dw, dr, db, dh0, dc0, _ = self._onnx.run_backward(
            x, onnx_w, onnx_r, onnx_b, lens, h0, c0, None, dy, dyh, d_cell.unsqueeze(0),
            half=self.settings.half_partials,
        )
        # Back to PopART's layout: [4 gates (ONNX order), H, I + H] -> [4 (Poplar order), I+H, H].
        onnx_gates = torch.cat([dw[0].reshape(4, hidden, inp), dr[0].reshape(4, hidden, hidden)],
                               dim=2)
        d_weights = onnx_gates[list(_POPLAR_FROM_ONNX)].transpose(1, 2).contiguous()
        # The bias feeds the W half of ONNX's B only (the R half is a constant zero).
        d_bias = db[0, : 4 * hidden].reshape(4, hidden)[list(_POPLAR_FROM_ONNX)].contiguous()
        d_state = torch.stack([dh0[0], dc0[0]])
        return dx, d_weights, d_bias, d_state
