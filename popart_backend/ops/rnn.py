"""Recurrent ops: RNN, GRU and LSTM (every ai.onnx version up to 28) and their gradients.

Shapes (layout 0; layout 1, from version 14, puts the batch first in X, Y, the initial and
the final states): X [S, N, I]; W [D, G·H, I]; R [D, G·H, H]; B [D, 2·G·H] (W's bias then
R's); sequence_lens [N] int32; initial_h / initial_c [D, N, H]; P [D, 3·H] (LSTM peepholes
i, o, f). Y [S, D, N, H]; Y_h / Y_c [D, N, H]. D is 2 for ``bidirectional`` (the second
direction runs in reverse), G the number of gates: LSTM 4 (order i, o, f, c), GRU 3
(z, r, h), RNN 1. ONNX gate orders differ from torch's, so the kernels do the cell arithmetic
themselves: one matmul of all time steps with W, then a loop over time with R.

Rows past their ``sequence_lens`` keep their state and give zeros in Y; a reverse direction
starts at the last valid step of each row.

Gradients (RNNGrad, GRUGrad, LSTMGrad) re-run the forward keeping each step's values, then
back-propagate through time by the chain rule written out per cell; no autograd involved.

Half partials (SessionOptions.lstmOptions["partialsType"] = "half", transforms/numerics_options.py
HalfPartialLstms): a float16 LSTM marked ``half_partials`` (and its LSTMGrad, which inherits the
mark) computes every product of its cells, X·Wᵀ and H·Rᵀ forward and their transposes backward,
with a float16 running sum (``half_partials_matmul``, as the float16-partials MatMul does); the
gradient's re-run of the forward therefore gives the forward's values. Unmarked float16 LSTMs
accumulate in float32 and round once. RNN and GRU are never marked: lstmOptions is the LSTMs'.
The cost (``cost``) is the same with either partials type: the recurrent ops have no planner in
the device model, so there are no planner temporaries whose width the partials would change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .matmul import half_partials_matmul
from .registry import AI_GRAPHCORE, register_op

# --- activations -------------------------------------------------------------------------------
# name -> (f(z, alpha, beta), f'(z, alpha, beta), default alpha, default beta). The defaults are
# those of the ONNX ops of the same name (alpha/beta lists are consumed in order by the
# activations that take them).


def _sig(z, a, b):
    return torch.sigmoid(z)


def _dsig(z, a, b):
    s = torch.sigmoid(z)
    return s * (1 - s)


_ACTIVATIONS: dict[str, tuple[Callable, Callable, float | None, float | None]] = {
    "relu": (lambda z, a, b: torch.relu(z), lambda z, a, b: (z > 0).to(z.dtype), None, None),
    "tanh": (lambda z, a, b: torch.tanh(z), lambda z, a, b: 1 - torch.tanh(z) ** 2, None, None),
    "sigmoid": (_sig, _dsig, None, None),
    "affine": (lambda z, a, b: a * z + b, lambda z, a, b: torch.full_like(z, a), 1.0, 0.0),
    "leakyrelu": (
        lambda z, a, b: torch.where(z >= 0, z, a * z),
        lambda z, a, b: torch.where(z >= 0, torch.ones_like(z), torch.full_like(z, a)),
        0.01, None,
    ),
    "thresholdedrelu": (
        lambda z, a, b: torch.where(z > a, z, torch.zeros_like(z)),
        lambda z, a, b: (z > a).to(z.dtype), 1.0, None,
    ),
    "scaledtanh": (
        lambda z, a, b: a * torch.tanh(b * z),
        lambda z, a, b: a * b * (1 - torch.tanh(b * z) ** 2), 1.0, 1.0,
    ),
    "hardsigmoid": (
        lambda z, a, b: (a * z + b).clamp(0, 1),
        lambda z, a, b: a * ((a * z + b > 0) & (a * z + b < 1)).to(z.dtype), 0.2, 0.5,
    ),
    "elu": (
        lambda z, a, b: torch.where(z >= 0, z, a * torch.expm1(z)),
        lambda z, a, b: torch.where(z >= 0, torch.ones_like(z), a * torch.exp(z)), 1.0, None,
    ),
    "softsign": (lambda z, a, b: z / (1 + z.abs()), lambda z, a, b: 1 / (1 + z.abs()) ** 2,
                 None, None),
    "softplus": (lambda z, a, b: torch.nn.functional.softplus(z), _sig, None, None),
}


@dataclass(frozen=True)
class _Activation:
    name: str
    alpha: float
    beta: float

    def __call__(self, z):
        return _ACTIVATIONS[self.name][0](z, self.alpha, self.beta)

    def grad(self, z):
        return _ACTIVATIONS[self.name][1](z, self.alpha, self.beta)


# --- attributes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Attrs:
    activation_alpha: tuple[float, ...] = ()
    activation_beta: tuple[float, ...] = ()
    activations: tuple[str, ...] = ()
    clip: float | None = None
    direction: str = "forward"
    hidden_size: int | None = None


@dataclass(frozen=True)
class _Attrs1(_Attrs):
    output_sequence: int = 0  # only says whether Y is optional; every output is computed


@dataclass(frozen=True)
class _Attrs14(_Attrs):
    layout: int = 0


@dataclass(frozen=True)
class _GruAttrs3(_Attrs1):
    linear_before_reset: int = 0


@dataclass(frozen=True)
class _GruAttrs7(_Attrs):
    linear_before_reset: int = 0


@dataclass(frozen=True)
class _GruAttrs14(_Attrs14):
    linear_before_reset: int = 0


@dataclass(frozen=True)
class _LstmAttrs1(_Attrs1):
    input_forget: int = 0


@dataclass(frozen=True)
class _LstmAttrs7(_Attrs):
    input_forget: int = 0


@dataclass(frozen=True)
class _LstmAttrs14(_Attrs14):
    input_forget: int = 0


# --- cells: one time step forward and backward -------------------------------------------------
# ``xp`` is the input projection X_t·Wᵀ + Wb of the step, ``acc`` holds the gradient sums of
# R (dR), R's bias (dRb) and the peepholes (dP) of the direction being differentiated. ``mm``
# is the matrix product (torch.matmul, or the float16-partials one of a marked LSTM).


def _clip(z, clip):
    if clip is None:
        return z, None
    return z.clamp(-clip, clip), (z.abs() <= clip).to(z.dtype)


def _masked(dz, mask):
    return dz if mask is None else dz * mask


class _RnnCell:
    gates = 1
    num_activations = 1
    default_activations = ("Tanh",)

    def __init__(self, acts, clip, attrs):
        (self.f,) = acts
        self.clip = clip

    def step(self, xp, h, c, r, rb, p, mm):
        z, mask = _clip(xp + mm(h, r.T) + rb, self.clip)
        h_new = self.f(z)
        return h_new, None, (h, z, mask)

    def back(self, dh_new, dc_new, cache, r, p, acc, mm):
        h, z, mask = cache
        dz = _masked(dh_new * self.f.grad(z), mask)
        acc["dR"] += mm(dz.T, h)
        acc["dRb"] += dz.sum(0)
        return dz, mm(dz, r), None


class _GruCell:
    gates = 3
    num_activations = 2
    default_activations = ("Sigmoid", "Tanh")

    def __init__(self, acts, clip, attrs):
        self.f, self.g = acts
        self.clip = clip
        self.linear_before_reset = bool(getattr(attrs, "linear_before_reset", 0))

    def step(self, xp, h, c, r, rb, p, mm):
        # GRUs are never marked half_partials (lstmOptions is the LSTMs'): mm is torch.matmul.
        n = h.shape[1]
        xz, xr, xh = xp.split(n, dim=1)
        rz, rr, rh = r.split(n, dim=0)
        bz, br, bh = rb.split(n)
        zz, mz = _clip(xz + h @ rz.T + bz, self.clip)
        zr, mr = _clip(xr + h @ rr.T + br, self.clip)
        z, rg = self.f(zz), self.f(zr)
        if self.linear_before_reset:
            hh = h @ rh.T + bh
            zh, mh = _clip(xh + rg * hh, self.clip)
        else:
            hh = rg * h
            zh, mh = _clip(xh + hh @ rh.T + bh, self.clip)
        ht = self.g(zh)
        h_new = (1 - z) * ht + z * h
        return h_new, None, (h, zz, mz, zr, mr, z, rg, hh, zh, mh, ht)

    def back(self, dh_new, dc_new, cache, r, p, acc, mm):
        h, zz, mz, zr, mr, z, rg, hh, zh, mh, ht = cache
        n = h.shape[1]
        rz, rr, rh = r.split(n, dim=0)
        dzh = _masked(dh_new * (1 - z) * self.g.grad(zh), mh)
        dz = dh_new * (h - ht)
        dh = dh_new * z
        if self.linear_before_reset:
            dr = dzh * hh
            dhh = dzh * rg
            drh, dbh = dhh.T @ h, dhh.sum(0)
            dh = dh + dhh @ rh
        else:
            d_rh_in = dzh @ rh  # gradient of r ⊙ h
            dr = d_rh_in * h
            dh = dh + d_rh_in * rg
            drh, dbh = dzh.T @ hh, dzh.sum(0)
        dzz = _masked(dz * self.f.grad(zz), mz)
        dzr = _masked(dr * self.f.grad(zr), mr)
        dh = dh + dzz @ rz + dzr @ rr
        acc["dR"] += torch.cat([dzz.T @ h, dzr.T @ h, drh])
        acc["dRb"] += torch.cat([dzz.sum(0), dzr.sum(0), dbh])
        return torch.cat([dzz, dzr, dzh], dim=1), dh, None


class _LstmCell:
    gates = 4
    num_activations = 3
    default_activations = ("Sigmoid", "Tanh", "Tanh")

    def __init__(self, acts, clip, attrs):
        self.f, self.g, self.h = acts
        self.clip = clip
        self.input_forget = bool(attrs.input_forget)

    def step(self, xp, h, c, r, rb, p, mm):
        a = xp + mm(h, r.T) + rb
        ai, ao, af, ac = a.split(h.shape[1], dim=1)
        pi, po, pf = p
        zi, mi = _clip(ai + pi * c, self.clip)
        i = self.f(zi)
        if self.input_forget:
            zf = mf = None
            fg = 1 - i
        else:
            zf, mf = _clip(af + pf * c, self.clip)
            fg = self.f(zf)
        zc, mc = _clip(ac, self.clip)
        cc = self.g(zc)
        c_new = fg * c + i * cc
        zo, mo = _clip(ao + po * c_new, self.clip)
        o = self.f(zo)
        hc = self.h(c_new)
        return o * hc, c_new, (h, c, zi, mi, i, zf, mf, fg, zc, mc, cc, c_new, zo, mo, o, hc)

    def back(self, dh_new, dc_new, cache, r, p, acc, mm):
        h, c, zi, mi, i, zf, mf, fg, zc, mc, cc, c_new, zo, mo, o, hc = cache
        pi, po, pf = p
        dzo = _masked(dh_new * hc * self.f.grad(zo), mo)
        dct = dc_new + dh_new * o * self.h.grad(c_new) + dzo * po
        dfg = dct * c
        dc = dct * fg
        di = dct * cc
        dzc = _masked(dct * i * self.g.grad(zc), mc)
        if self.input_forget:
            di = di - dfg
            dzf = torch.zeros_like(dzo)
        else:
            dzf = _masked(dfg * self.f.grad(zf), mf)
        dzi = _masked(di * self.f.grad(zi), mi)
        dc = dc + dzi * pi + dzf * pf
        da = torch.cat([dzi, dzo, dzf, dzc], dim=1)
        acc["dR"] += mm(da.T, h)
        acc["dRb"] += da.sum(0)
        acc["dP"] += torch.cat([(dzi * c).sum(0), (dzo * c_new).sum(0), (dzf * c).sum(0)])
        return da, mm(da, r), dc


# --- the shared driver --------------------------------------------------------------------------


class _Recurrent(Op):
    """Shape rules and the time loop shared by RNN, GRU, LSTM and their grad ops."""

    cell_type: type = _RnnCell
    Attrs = _Attrs14

    @property
    def _layout(self) -> int:
        return getattr(self.attrs, "layout", 0)

    def _setup(self, x, w, r, b, lens, h0, c0, p):
        """Check the operand infos and fix the sizes; returns (S, N, I, D, H)."""
        cell = self.cell_type
        gates = cell.gates
        if x is None or w is None or r is None:
            raise ShapeError(f"{self.debug_name}: X, W and R are required.")
        if not x.dtype.is_float or x.rank != 3:
            raise ShapeError(f"{self.debug_name}: X must be a rank-3 float tensor, got {x}.")
        direction = self.attrs.direction
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ShapeError(
                f"{self.debug_name}: direction '{direction}' is not forward, reverse or "
                f"bidirectional."
            )
        d = 2 if direction == "bidirectional" else 1
        hidden = self.attrs.hidden_size if self.attrs.hidden_size is not None else r.shape[-1]
        seq, batch, inp = (x.shape[1], x.shape[0], x.shape[2]) if self._layout else x.shape
        expect = {
            "W": (w, (d, gates * hidden, inp)),
            "R": (r, (d, gates * hidden, hidden)),
            "B": (b, (d, 2 * gates * hidden)),
            "sequence_lens": (lens, (batch,)),
            "initial_h": (h0, (batch, d, hidden) if self._layout else (d, batch, hidden)),
            "initial_c": (c0, (batch, d, hidden) if self._layout else (d, batch, hidden)),
            "P": (p, (d, 3 * hidden)),
        }
        for name, (info, shape) in expect.items():
            if info is not None and info.shape != shape:
                raise ShapeError(
                    f"{self.debug_name}: {name} is {info}, expected shape {list(shape)} (direction "
                    f"'{direction}', hidden_size {hidden}, X {x}, layout {self._layout})."
                )
            if info is not None and name != "sequence_lens" and info.dtype != x.dtype:
                raise ShapeError(
                    f"{self.debug_name}: {name} is {info}, X is {x}; types must match."
                )
        if lens is not None and lens.dtype not in (DataType.INT32, DataType.INT64):
            raise ShapeError(f"{self.debug_name}: sequence_lens must be int32, got {lens}.")
        self._sizes = (seq, batch, inp, d, hidden)
        self._cells = [
            self.cell_type(acts, self.attrs.clip, self.attrs) for acts in self._activations(d)
        ]
        return self._sizes

    def _activations(self, d: int) -> list[tuple[_Activation, ...]]:
        k = self.cell_type.num_activations
        names = self.attrs.activations or self.cell_type.default_activations * d
        if len(names) != k * d:
            raise ShapeError(
                f"{self.debug_name}: activations {list(names)} must name {k} function(s) per "
                f"direction, {k * d} in all."
            )
        alphas, betas = list(self.attrs.activation_alpha), list(self.attrs.activation_beta)
        acts = []
        for name in names:
            key = name.lower()
            if key not in _ACTIVATIONS:
                raise UnsupportedOpError(
                    f"{self.debug_name}: activation '{name}' is not one of "
                    f"{sorted(_ACTIVATIONS)}."
                )
            _, _, default_alpha, default_beta = _ACTIVATIONS[key]
            alpha = alphas.pop(0) if default_alpha is not None and alphas else default_alpha
            beta = betas.pop(0) if default_beta is not None and betas else default_beta
            acts.append(_Activation(key, alpha or 0.0, beta or 0.0))
        return [tuple(acts[i * k : (i + 1) * k]) for i in range(d)]

    def _output_infos(self, x: TensorInfo) -> list[TensorInfo]:
        seq, batch, _, d, hidden = self._sizes
        y = (batch, seq, d, hidden) if self._layout else (seq, d, batch, hidden)
        state = (batch, d, hidden) if self._layout else (d, batch, hidden)
        infos = [x.with_shape(y), x.with_shape(state)]
        if self.cell_type is _LstmCell:
            infos.append(x.with_shape(state))
        return infos

    def _reverse(self, index: int) -> bool:
        return self.attrs.direction == "reverse" or index == 1

    def _product(self, half: bool | None, dtype: torch.dtype) -> Callable:
        """The cells' matrix product: float16 running sums for a float16 LSTM marked
        ``half_partials`` (``half`` overrides the op's own mark), else torch.matmul."""
        if half is None:
            half = self.settings.half_partials
        if half and self.supports_lstm_half_partials and dtype == torch.float16:
            return half_partials_matmul
        return torch.matmul

    def _forward(self, x, w, r, b, lens, h0, c0, p, keep: bool, mm: Callable = torch.matmul):
        """Layout-0 operands in; (Y [S,D,N,H], Y_h [D,N,H], Y_c, per-direction step records)."""
        seq, batch, _, d, hidden = self._sizes
        gh = self.cell_type.gates * hidden
        lstm = self.cell_type is _LstmCell
        y = x.new_zeros((seq, d, batch, hidden))
        final_h, final_c, records = [], [], []
        masks = None
        if lens is not None:
            steps = torch.arange(seq).unsqueeze(1)
            masks = (steps < lens.to(torch.int64).unsqueeze(0)).unsqueeze(2)  # [S, N, 1]
        for k in range(d):
            cell = self._cells[k]
            wb = b[k, :gh] if b is not None else x.new_zeros(gh)
            rb = b[k, gh:] if b is not None else x.new_zeros(gh)
            pk = p[k].split(hidden) if p is not None else (x.new_zeros(hidden),) * 3
            xp = mm(x, w[k].T) + wb
            h = h0[k] if h0 is not None else x.new_zeros((batch, hidden))
            c = (c0[k] if c0 is not None else x.new_zeros((batch, hidden))) if lstm else None
            order = range(seq - 1, -1, -1) if self._reverse(k) else range(seq)
            steps_kept = []
            for t in order:
                h_new, c_new, cache = cell.step(xp[t], h, c, r[k], rb, pk, mm)
                if masks is not None:
                    m = masks[t]
                    y[t, k] = torch.where(m, h_new, 0)
                    h = torch.where(m, h_new, h)
                    c = torch.where(m, c_new, c) if lstm else None
                else:
                    y[t, k] = h_new
                    h, c = h_new, c_new
                if keep:
                    steps_kept.append((t, cache))
            final_h.append(h)
            final_c.append(c)
            records.append((xp, rb, pk, steps_kept))
        return y, torch.stack(final_h), torch.stack(final_c) if lstm else None, records, masks

    def _to_layout0(self, x, h0, c0):
        if self._layout:
            x = x.transpose(0, 1)
            h0 = h0.transpose(0, 1) if h0 is not None else None
            c0 = c0.transpose(0, 1) if c0 is not None else None
        return x, h0, c0

    def _from_layout0(self, y, yh, yc):
        if self._layout:
            y = y.permute(2, 0, 1, 3)
            yh = yh.transpose(0, 1)
            yc = yc.transpose(0, 1) if yc is not None else None
        return y.contiguous(), yh.contiguous(), yc.contiguous() if yc is not None else None

    def run_forward(self, x, w, r, b=None, lens=None, h0=None, c0=None, p=None, half=None):
        """``half``: the partials type (True: float16), None for the op's own setting."""
        x0, h00, c00 = self._to_layout0(x, h0, c0)
        y, yh, yc, _, _ = self._forward(x0, w, r, b, lens, h00, c00, p, keep=False,
                                        mm=self._product(half, x.dtype))
        outs = self._from_layout0(y, yh, yc)
        return outs if self.cell_type is _LstmCell else outs[:2]

    def run_backward(self, x, w, r, b, lens, h0, c0, p, dy, dyh, dyc, half=None):
        """Gradients of (X, W, R, B, initial_h, initial_c, P) given those of (Y, Y_h, Y_c);
        ``half`` as in ``run_forward``."""
        mm = self._product(half, x.dtype)
        seq, batch, inp, d, hidden = self._sizes
        gh = self.cell_type.gates * hidden
        lstm = self.cell_type is _LstmCell
        x0, h00, c00 = self._to_layout0(x, h0, c0)
        if self._layout:
            dy = dy.permute(1, 2, 0, 3) if dy is not None else None
            dyh = dyh.transpose(0, 1) if dyh is not None else None
            dyc = dyc.transpose(0, 1) if dyc is not None else None
        _, _, _, records, masks = self._forward(x0, w, r, b, lens, h00, c00, p, keep=True,
                                                mm=mm)
        dx = torch.zeros_like(x0)
        dw, dr = torch.zeros_like(w), torch.zeros_like(r)
        db = x.new_zeros((d, 2 * gh))
        dh0 = x.new_zeros((d, batch, hidden))
        dc0 = x.new_zeros((d, batch, hidden))
        dp = x.new_zeros((d, 3 * hidden))
        zeros = x.new_zeros((batch, hidden))
        for k in range(d):
            cell = self._cells[k]
            xp, rb, pk, steps = records[k]
            acc = {"dR": dr[k], "dRb": db[k, gh:], "dP": dp[k]}
            dxp = torch.zeros_like(xp)
            dh = dyh[k].clone() if dyh is not None else zeros.clone()
            dc = (dyc[k].clone() if dyc is not None else zeros.clone()) if lstm else None
            for t, cache in reversed(steps):
                # Y_t = m·h_t and H_t = m·h_t + (1 - m)·H_{t-1}: a masked row passes the
                # gradient of its state straight to the previous step.
                dh_step = dh + dy[t, k] if dy is not None else dh
                dc_step = dc
                keep_h = keep_c = None
                if masks is not None:
                    m = masks[t].to(x.dtype)
                    keep_h, dh_step = (1 - m) * dh, m * dh_step
                    if lstm:
                        keep_c, dc_step = (1 - m) * dc, m * dc
                dxp[t], dh, dc_prev = cell.back(dh_step, dc_step, cache, r[k], pk, acc, mm)
                if keep_h is not None:
                    dh = dh + keep_h
                if lstm:
                    dc = dc_prev + keep_c if keep_c is not None else dc_prev
            flat = dxp.reshape(-1, gh)
            dw[k] = mm(flat.T, x0.reshape(-1, inp))
            db[k, :gh] = flat.sum(0)
            dx += mm(dxp, w[k])
            dh0[k] = dh
            if lstm:
                dc0[k] = dc
        if self._layout:
            dx, dh0, dc0 = dx.transpose(0, 1), dh0.transpose(0, 1), dc0.transpose(0, 1)
        return [dx.contiguous(), dw, dr, db, dh0.contiguous(), dc0.contiguous(), dp]

    def cost(self):
        seq, batch, inp, d, hidden = self._sizes
        gh = self.cell_type.gates * hidden
        flops = 2 * d * seq * batch * gh * (inp + hidden) + 10 * d * seq * batch * gh
        return flops, super().cost()[1]


def _padded(xs: tuple, count: int) -> list:
    xs = list(xs)
    return xs + [None] * (count - len(xs))


class _RecurrentForward(_Recurrent):
    """A forward ONNX op: X, W, R, [B, sequence_lens, initial_h, (initial_c, P)]."""

    num_operands = 6

    def infer(self, *infos):
        infos = _padded(infos, 8)
        self._setup(*infos[:6], infos[6] if self.num_operands > 6 else None,
                    infos[7] if self.num_operands > 6 else None)
        return self._output_infos(infos[0])

    def kernel(self, *xs):
        xs = _padded(xs, 8)
        outs = self.run_forward(*xs[:6], *xs[6:8])
        return outs[0] if len(self.outputs) == 1 else tuple(outs)

    def grad(self, g):
        n = self.num_operands
        ins = [g.input(i) if g.has_input(i) else None for i in range(n)]
        ins += [None] * (8 - n)
        out_grads = [
            g.output_grad(k) if k < len(self.outputs) and self.outputs[k] is not None else None
            for k in range(len(self._output_infos(self.inputs[0].info)))
        ]
        out_grads += [None] * (3 - len(out_grads))
        fields = {f.name for f in dataclasses.fields(self.grad_attrs)}
        attrs = {k: v for k, v in dataclasses.asdict(self.attrs).items() if k in fields}
        grads = g.op(f"{self.op_type}Grad", *ins, *out_grads, domain=AI_GRAPHCORE,
                     num_outputs=7, **attrs)
        for index, position in enumerate((0, 1, 2, 3, None, 4, 5, 6)):
            if position is not None and index < n and g.has_input(index):
                g.set_input_grad(index, grads[position])


class _RecurrentGrad(_Recurrent):
    """(dX, dW, dR, dB, d initial_h, d initial_c, dP) from the forward operands and the
    gradients of (Y, Y_h, Y_c); absent operands / gradients are zeros."""

    def infer(self, x, w, r, b, lens, h0, c0, p, dy, dyh, dyc):
        self._setup(x, w, r, b, lens, h0, c0, p)
        seq, batch, inp, d, hidden = self._sizes
        gh = self.cell_type.gates * hidden
        state = (batch, d, hidden) if self._layout else (d, batch, hidden)
        return [x, w, r, x.with_shape((d, 2 * gh)), x.with_shape(state), x.with_shape(state),
                x.with_shape((d, 3 * hidden))]

    def kernel(self, x, w, r, b, lens, h0, c0, p, dy, dyh, dyc):
        return tuple(self.run_backward(x, w, r, b, lens, h0, c0, p, dy, dyh, dyc))


# --- the registered ops -------------------------------------------------------------------------


@register_op("RNN", versions=(1, 7, 14, 22))
class RNN(_RecurrentForward):
    """H_t = f(X_t·Wᵀ + H_{t-1}·Rᵀ + Wb + Rb)."""

    cell_type = _RnnCell
    grad_attrs = _Attrs14

    @classmethod
    def attrs_type(cls, version):
        return {1: _Attrs1, 7: _Attrs}.get(version, _Attrs14)


@register_op("RNNGrad", versions=1, domain=AI_GRAPHCORE)
class RNNGrad(_RecurrentGrad):
    cell_type = _RnnCell
    Attrs = _Attrs14


@register_op("GRU", versions=(1, 3, 7, 14, 22))
class GRU(_RecurrentForward):
    """z, r = f(..), h~ = g(X·Whᵀ + (r ⊙ H)·Rhᵀ + ..) (or r ⊙ (H·Rhᵀ + Rbh) with
    linear_before_reset); H_t = (1 - z) ⊙ h~ + z ⊙ H_{t-1}."""

    cell_type = _GruCell
    grad_attrs = _GruAttrs14

    @classmethod
    def attrs_type(cls, version):
        return {1: _Attrs1, 3: _GruAttrs3, 7: _GruAttrs7}.get(version, _GruAttrs14)


@register_op("GRUGrad", versions=1, domain=AI_GRAPHCORE)
class GRUGrad(_RecurrentGrad):
    cell_type = _GruCell
    Attrs = _GruAttrs14


@register_op("LSTM", versions=(1, 7, 14, 22))
class LSTM(_RecurrentForward):
    """Gates i, o, f = f(..) (with peepholes), c~ = g(..), C_t = f ⊙ C_{t-1} + i ⊙ c~,
    H_t = o ⊙ h(C_t); input_forget couples f = 1 - i."""

    cell_type = _LstmCell
    grad_attrs = _LstmAttrs14
    num_operands = 8
    # lstmOptions["partialsType"] = "half" may make a float16 LSTM accumulate in float16.
    supports_lstm_half_partials = True

    @classmethod
    def attrs_type(cls, version):
        return {1: _LstmAttrs1, 7: _LstmAttrs7}.get(version, _LstmAttrs14)


@register_op("LSTMGrad", versions=1, domain=AI_GRAPHCORE)
class LSTMGrad(_RecurrentGrad):
    cell_type = _LstmCell
    Attrs = _LstmAttrs14
    supports_lstm_half_partials = True  # inherits its LSTM's mark
