"""ai.graphcore MultiConv (``builder.aiGraphcore.multiconv``): several independent
convolutions in one op, and MultiConvGrad, the gradient of one of them when it dilates its input
or pads its output.

On the IPU the convolutions of a MultiConv are planned together; here each one is an ai.onnx
Conv (``conv.py``), whose ``infer``/``kernel`` the op calls, so the arithmetic lives in one place.
The planning options (availableMemoryProportions, partialsTypes, planType,
perConvReservedTiles, cycleBackOff, enableConvDithering) are hardware hints: they are checked
and kept on the node, with no effect on the values.

Node layout (ONNX attributes cannot nest lists):

- inputs: three per convolution, ``data_i, weights_i, bias_i``; an absent bias is ``""``.
- ``strides``, ``dilations``, ``inDilations``: n values per convolution (n spatial dims),
  concatenated over the convolutions; ``pads``, ``outPads``: 2n per convolution (begins then
  ends), concatenated. An empty list means the defaults (1 for the steps, 0 for the pads) for
  every convolution. All convolutions of one MultiConv have the same number of spatial dims.
- outputs: one per convolution.

``inDilations`` (PopART's input dilation) inserts ``d - 1`` zeros between neighbouring input
elements along each spatial dim before the convolution, so a size L becomes (L - 1)·d + 1.
``outPads`` adds zeros around the convolution's output (after the bias).

Gradients: a plain convolution's gradient is a ConvGrad; one with input dilation or output
padding gets a MultiConvGrad, which crops dY, dilates X, runs ConvGrad's kernel and keeps every
d-th element of dX (the adjoint of inserting zeros).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .multi_grad import pick_grads
from .registry import AI_GRAPHCORE, AI_ONNX, create_op, register_op

PARTIALS_TYPES = ("float", "half")
PLAN_TYPES = ("parallel", "serial")

# Per-convolution list attributes: name -> (values per spatial dim, default value).
PER_CONV_LISTS = {
    "strides": (1, 1),
    "pads": (2, 0),
    "dilations": (1, 1),
    "inDilations": (1, 1),
    "outPads": (2, 0),
}


def check_hints(where: str, num_convs: int, proportions, partials, plan_type, reserved_tiles,
                cycle_back_off, dithering) -> None:
    """Check the planning options of a MultiConv of ``num_convs`` convolutions; raises
    popart_exception naming ``where`` and the bad value."""

    def per_conv(name, values):
        if values and len(values) != num_convs:
            raise popart_exception(
                f"{where}: {name}={list(values)} needs one value per convolution ({num_convs}) "
                f"or none."
            )

    per_conv("availableMemoryProportions", proportions)
    per_conv("partialsTypes", partials)
    per_conv("enableConvDithering", dithering)
    bad = [p for p in proportions if not 0.0 < p <= 1.0]
    if bad:
        raise popart_exception(
            f"{where}: availableMemoryProportions {list(proportions)} must be in (0, 1]; "
            f"{bad} are not."
        )
    wrong = [p for p in partials if str(p).lower() not in PARTIALS_TYPES]
    if wrong:
        raise popart_exception(
            f"{where}: partialsTypes {list(partials)}: {wrong} are not one of "
            f"{list(PARTIALS_TYPES)}."
        )
    if plan_type and plan_type not in PLAN_TYPES:
        raise popart_exception(
            f"{where}: planType '{plan_type}' is not one of {list(PLAN_TYPES)}."
        )
    if reserved_tiles is not None and reserved_tiles < 0:
        raise popart_exception(f"{where}: perConvReservedTiles={reserved_tiles} must be >= 0.")
    if cycle_back_off is not None and not 0.0 <= cycle_back_off < 1.0:
        raise popart_exception(f"{where}: cycleBackOff={cycle_back_off} must be in [0, 1).")
    if any(d not in (0, 1) for d in dithering):
        raise popart_exception(
            f"{where}: enableConvDithering {list(dithering)} must hold 0 or 1 per convolution."
        )


def _dilate(x: torch.Tensor, factors: tuple[int, ...]) -> torch.Tensor:
    """``x`` with ``f - 1`` zeros between neighbours along each spatial dim."""
    if all(f == 1 for f in factors):
        return x
    sizes = tuple((s - 1) * f + 1 for s, f in zip(x.shape[2:], factors))
    out = x.new_zeros(x.shape[:2] + sizes)
    out[(..., *(slice(None, None, f) for f in factors))] = x
    return out


def _undilate(dx: torch.Tensor, factors: tuple[int, ...]) -> torch.Tensor:
    if all(f == 1 for f in factors):
        return dx
    return dx[(..., *(slice(None, None, f) for f in factors))].contiguous()


def _torch_pads(pads: tuple[int, ...]) -> tuple[int, ...]:
    """[begins..., ends...] in F.pad's order (last dim first)."""
    n = len(pads) // 2
    out: list[int] = []
    for b, e in zip(reversed(pads[:n]), reversed(pads[n:])):
        out += [b, e]
    return tuple(out)


class _DilatedConv:
    """Shape helpers shared by MultiConv and MultiConvGrad for input dilation / output pads."""

    @staticmethod
    def dilated_info(x: TensorInfo, factors: tuple[int, ...]) -> TensorInfo:
        sizes = tuple((s - 1) * f + 1 for s, f in zip(x.shape[2:], factors))
        return x.with_shape(x.shape[:2] + sizes)

    @staticmethod
    def padded_info(y: TensorInfo, pads: tuple[int, ...]) -> TensorInfo:
        n = len(pads) // 2
        sizes = tuple(s + b + e for s, b, e in zip(y.shape[2:], pads[:n], pads[n:]))
        return y.with_shape(y.shape[:2] + sizes)


def _check_steps(op: Op, name: str, values: tuple[int, ...], low: int) -> None:
    if any(v < low for v in values):
        raise ShapeError(f"{op.debug_name}: {name}={list(values)} must be >= {low}.")


@dataclass(frozen=True)
class _Geometry:
    """The flattened per-conv geometry lists MultiConv and its grad op share."""

    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    inDilations: tuple[int, ...] = ()
    outPads: tuple[int, ...] = ()


@register_op("MultiConv", versions=1, domain=AI_GRAPHCORE)
class MultiConv(_DilatedConv, Op):
    """Y_i = outpad(conv(indilate(X_i), W_i) + B_i) for each convolution i; see the module
    docstring for the node layout."""

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs(_Geometry):
        availableMemoryProportions: tuple[float, ...] = ()
        partialsTypes: tuple[str, ...] = ()
        planType: str = ""
        perConvReservedTiles: int | None = None
        cycleBackOff: float | None = None
        enableConvDithering: tuple[int, ...] = ()

    def infer(self, *infos):
        at = self.attrs
        if not infos or len(infos) % 3:
            raise ShapeError(
                f"{self.debug_name}: takes three inputs per convolution (data, weights, bias or "
                f"''), got {len(infos)}."
            )
        num = len(infos) // 3
        check_hints(self.debug_name, num, at.availableMemoryProportions, at.partialsTypes,
                    at.planType, at.perConvReservedTiles, at.cycleBackOff,
                    at.enableConvDithering)
        xs = infos[0::3]
        if any(x is None or w is None for x, w in zip(xs, infos[1::3])):
            raise ShapeError(f"{self.debug_name}: every convolution needs its data and weights.")
        ranks = {x.rank for x in xs}
        if len(ranks) != 1:
            raise ShapeError(
                f"{self.debug_name}: the convolutions have data of ranks {sorted(ranks)}; one "
                f"MultiConv takes convolutions with the same number of spatial dims."
            )
        n = ranks.pop() - 2
        self._convs = []  # (Conv, input dilations, torch output pads or None) per convolution
        outputs = []
        for i in range(num):
            attrs = self.conv_attrs(i, num, n)
            conv = create_op(
                "Conv", {k: attrs[k] for k in ("strides", "pads", "dilations")},
                dataclasses.replace(self.settings, name=f"{self.settings.name or self.id}/conv{i}"),
                domain=AI_ONNX, where=self.debug_name,
            )
            x, w, b = infos[3 * i: 3 * i + 3]
            y = conv.infer(self.dilated_info(x, attrs["inDilations"]), w, b)
            out_pads = attrs["outPads"]
            self._convs.append(
                (conv, attrs["inDilations"], _torch_pads(out_pads) if any(out_pads) else None)
            )
            outputs.append(self.padded_info(y, out_pads))
        return outputs

    def conv_attrs(self, index: int, num: int, n: int) -> dict[str, tuple[int, ...]]:
        """The list attributes of convolution ``index`` of ``num`` (n spatial dims each)."""
        out = {}
        for name, (per_dim, default) in PER_CONV_LISTS.items():
            values = getattr(self.attrs, name)
            size = per_dim * n
            if not values:
                out[name] = (default,) * size
                continue
            if len(values) != size * num:
                raise ShapeError(
                    f"{self.debug_name}: {name}={list(values)} needs {size} values per "
                    f"convolution ({num} convolutions with {n} spatial dims: {size * num})."
                )
            out[name] = tuple(values[index * size: (index + 1) * size])
        _check_steps(self, "inDilations", out["inDilations"], 1)
        _check_steps(self, "outPads", out["outPads"], 0)
        return out

    def kernel(self, *xs):
        outs = []
        for i, (conv, factors, out_pads) in enumerate(self._convs):
            x, w, b = xs[3 * i: 3 * i + 3]
            y = conv.kernel(_dilate(x, factors), w, b)
            outs.append(y if out_pads is None else F.pad(y, out_pads))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def cost(self):
        _, moved = super().cost()
        flops = 0
        for i, (conv, _, _) in enumerate(self._convs):
            w = self.inputs[3 * i + 1].info
            y = self.outputs[i].info if self.outputs[i] is not None else None
            if y is not None:
                flops += 2 * y.nelms * (w.nelms // w.shape[0])
        return flops, moved

    def grad(self, g):
        n = self.inputs[0].info.rank - 2
        num = len(self._convs)
        for i, (conv, factors, out_pads) in enumerate(self._convs):
            wrt = tuple(k for k in range(3) if g.needs_input_grad(3 * i + k))
            if not wrt:
                continue
            conv_attrs = dataclasses.asdict(conv.attrs)
            args = (g.output_grad(i), g.input(3 * i), g.input(3 * i + 1))
            if all(f == 1 for f in factors) and out_pads is None:
                grads = g.op("ConvGrad", *args, domain=AI_GRAPHCORE, num_outputs=len(wrt),
                             wrt=wrt, **conv_attrs)
            else:
                attrs = self.conv_attrs(i, num, n)
                grads = g.op("MultiConvGrad", *args, domain=AI_GRAPHCORE, num_outputs=len(wrt),
                             wrt=wrt, strides=attrs["strides"], pads=attrs["pads"],
                             dilations=attrs["dilations"], inDilations=attrs["inDilations"],
                             outPads=attrs["outPads"])
            grads = [grads] if isinstance(grads, str) else grads
            for k, grad_id in zip(wrt, grads):
                g.set_input_grad(3 * i + k, grad_id)


@register_op("MultiConvGrad", versions=1, domain=AI_GRAPHCORE)
class MultiConvGrad(_DilatedConv, Op):
    """dX, dW, dB (those in ``wrt``) of one MultiConv convolution with input dilation or output
    padding, from dY, X and W: ConvGrad on the dilated X and the cropped dY."""

    @dataclass(frozen=True)
    class Attrs(_Geometry):
        wrt: tuple[int, ...] = (0, 1, 2)

    def infer(self, dy, x, w):
        at = self.attrs
        n = x.rank - 2
        factors = at.inDilations or (1,) * n
        out_pads = at.outPads or (0,) * (2 * n)
        _check_steps(self, "inDilations", factors, 1)
        _check_steps(self, "outPads", out_pads, 0)
        self._inner = create_op(
            "ConvGrad",
            {"strides": at.strides, "pads": at.pads, "dilations": at.dilations, "wrt": at.wrt},
            self.settings, domain=AI_GRAPHCORE, where=self.debug_name,
        )
        self._factors = factors
        # Cropping dY is padding it by minus the output pads.
        self._crop = tuple(-p for p in _torch_pads(out_pads)) if any(out_pads) else None
        cropped = dy.with_shape(dy.shape[:2] + tuple(
            s - b - e for s, b, e in zip(dy.shape[2:], out_pads[:n], out_pads[n:])))
        infos = self._inner.infer(cropped, self.dilated_info(x, factors), w)
        infos = [infos] if isinstance(infos, TensorInfo) else list(infos)
        return [x if k == 0 else info for k, info in zip(at.wrt, infos)]

    def kernel(self, dy, x, w):
        if self._crop is not None:
            dy = F.pad(dy, self._crop)
        grads = self._inner.kernel(dy, _dilate(x, self._factors), w)
        grads = [grads] if isinstance(grads, torch.Tensor) else list(grads)
        full = [None, None, None]
        for k, grad in zip(self.attrs.wrt, grads):
            full[k] = _undilate(grad, self._factors) if k == 0 else grad
        return pick_grads(full, self.attrs.wrt)

