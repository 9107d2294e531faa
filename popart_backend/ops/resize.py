"""Resampling ops: Resize (10, 11, 13, 18, 19) and Upsample (1, 7, 9, 10).

Resize is separable: each resized axis maps output positions to source coordinates (the
coordinate transformation), then reads a few neighbouring inputs (1 for nearest, 2 for linear,
4 for cubic, more for antialiased downsampling) with weights. ``infer()`` turns the constant
scales/sizes/roi into, per axis, one int64 index tensor and one weight tensor, so the kernel is an
``index_select`` and a weighted sum per axis. The coordinates are computed in float32 with
onnxruntime's operation order, so rounding in nearest mode lands on the same pixels.

When the request maps exactly onto ``torch.nn.functional.interpolate`` (linear with half_pixel
or align_corners, cubic with a = -0.75, nearest when its pixel choice is verified equal), the
kernel is that single fused call instead.

The gradient is the adjoint of that linear map (ResizeGrad, ai.graphcore domain): it rebuilds
the same per-axis taps from the forward op's normalised request and, axis by axis in reverse,
multiplies dy by the weights and adds it into zeros at the tap indices. It always uses the taps,
also where the forward pass took the F.interpolate path, which computes the same map.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..dtypes import DataType
from ..errors import ModelError, ShapeError, UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import normalize_axis
from .registry import AI_GRAPHCORE, register_op

_F32 = np.float32
_FLOAT_DTYPES = (DataType.FLOAT, DataType.FLOAT16, DataType.DOUBLE, DataType.BFLOAT16)

# Coordinate transformation modes each Resize version accepts.
_TRANSFORMS = {
    11: {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
         "tf_crop_and_resize"},
    13: {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"},
    19: {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
         "asymmetric", "tf_crop_and_resize"},
}
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class ResizeRequest:
    """Everything that decides a resize, normalised over the versions of Resize and Upsample."""

    mode: str  # nearest | linear | cubic
    transform: str  # coordinate_transformation_mode
    # round_prefer_floor | round_prefer_ceil | floor | ceil, or "legacy": Resize-10 and Upsample
    # truncate when upsampling and take the ceiling when downsampling (onnxruntime's rule).
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False


# --- per-axis coordinates and taps -------------------------------------------------------------


def _source_coordinates(
    req: ResizeRequest, out_len: int, in_len: int, scale, roi, ft=_F32, from_scale=False
) -> np.ndarray:
    """Source coordinate of each output position along one axis, in float32 like onnxruntime
    (``ft`` float64 for double inputs, like the ONNX reference).

    ``from_scale``: the output length came from a scale (not from sizes). ONNX defines
    ``scale = length_resized / length_original``, so align_corners then divides by the
    unrounded ``scale * length_original - 1`` (the ONNX reference and the backend test data do;
    onnxruntime divides by the floored output length instead, which differs when
    ``scale * length_original`` is fractional).
    """
    x = np.arange(out_len, dtype=ft)
    scale = ft(scale)
    length_in, length_out = ft(in_len), ft(out_len)
    if from_scale and req.transform == "align_corners":
        length_out = scale * length_in
    half = ft(0.5)
    t = req.transform
    if t == "half_pixel":
        return (x + half) / scale - half
    if t == "half_pixel_symmetric":
        adjustment = length_out / (scale * length_in)
        offset = length_in / ft(2) * (ft(1) - adjustment)
        return offset + (x + half) / scale - half
    if t == "pytorch_half_pixel":
        return (x + half) / scale - half if out_len > 1 else np.zeros(out_len, ft)
    if t == "align_corners":
        if out_len == 1 or length_out == 1:
            return np.zeros(out_len, ft)
        return x * (length_in - 1) / (length_out - 1)
    if t == "asymmetric":
        return x / scale
    if t == "tf_half_pixel_for_nn":
        return (x + half) / scale
    if t == "tf_crop_and_resize":
        start, end = ft(roi[0]), ft(roi[1])
        if out_len > 1:
            return start * (length_in - 1) + x * (end - start) * (length_in - 1) / (length_out - 1)
        return np.full(out_len, half * (start + end) * (length_in - 1), ft)
    raise ModelError(f"unknown coordinate_transformation_mode '{t}'")


def _nearest_index(req: ResizeRequest, coords: np.ndarray, scale) -> np.ndarray:
    floor = np.floor(coords)
    if req.nearest_mode == "legacy":
        index = np.ceil(coords) if scale < 1 else np.trunc(coords)
    elif req.nearest_mode == "floor":
        index = floor
    elif req.nearest_mode == "ceil":
        index = np.ceil(coords)
    else:
        halfway = coords == floor + _F32(0.5)
        rounded = np.where(coords >= 0, np.floor(coords + 0.5), np.ceil(coords - 0.5))
        tie = floor if req.nearest_mode == "round_prefer_floor" else floor + 1
        index = np.where(halfway, tie, rounded)
    return index.astype(np.int64)


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
    """The cubic convolution kernel with coefficient ``a`` (Keys), zero beyond |x| >= 2."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _taps(
    req: ResizeRequest, coords: np.ndarray, in_len: int, scale
) -> tuple[np.ndarray, np.ndarray | None]:
    """(index [out, taps], weight [out, taps] or None for nearest) along one axis."""
    if req.mode == "nearest":
        index = np.clip(_nearest_index(req, coords, scale), 0, in_len - 1)
        return index[:, None], None
    if req.antialias:
        return _antialias_taps(req, coords, in_len, scale)
    if req.mode == "linear":
        clamped = np.clip(coords, 0, in_len - 1)
        low = np.floor(clamped).astype(np.int64)
        frac = (clamped - low).astype(np.float64)
        index = np.stack([low, np.minimum(low + 1, in_len - 1)], 1)
        return index, np.stack([1 - frac, frac], 1)
    low = np.floor(coords).astype(np.int64)
    frac = (coords - low).astype(np.float64)
    index = low[:, None] + np.arange(-1, 3)
    weight = _cubic(frac[:, None] - np.arange(-1, 3), req.cubic_coeff_a)
    return _edge_weights(req, index, weight, in_len)


def _antialias_taps(req: ResizeRequest, coords: np.ndarray, in_len: int, scale):
    """Filter stretched by 1/scale when downsampling, so every input pixel contributes.

    Follows onnxruntime's window: centre = coordinate + 0.5, taps from floor(centre - support +
    0.5) up to (excluding) floor(centre + support + 0.5), weights normalised to sum 1.
    """
    stretch = max(1.0 / float(scale), 1.0)
    support = (2.0 if req.mode == "cubic" else 1.0) * stretch
    centre = coords.astype(np.float64) + 0.5
    if float(scale) == 1.0:
        centre = np.arange(len(coords), dtype=np.float64) + 0.5
    first = np.floor(centre - support + 0.5).astype(np.int64)
    last = np.floor(centre + support + 0.5).astype(np.int64)
    width = int((last - first).max())
    index = first[:, None] + np.arange(width)
    distance = (index - centre[:, None] + 0.5) / stretch
    if req.mode == "cubic":
        weight = _cubic(distance, req.cubic_coeff_a)
    else:
        weight = np.clip(1 - np.abs(distance), 0, None)
    weight = np.where(index < last[:, None], weight, 0.0)
    return _edge_weights(req, index, weight, in_len, normalise=True)


def _edge_weights(req, index, weight, in_len, normalise=False):
    """Taps outside the input repeat the edge pixel, or are dropped with exclude_outside."""
    outside = (index < 0) | (index >= in_len)
    if req.exclude_outside:
        weight = np.where(outside, 0.0, weight)
        normalise = True
    if normalise:
        total = weight.sum(1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, in_len - 1), weight


# --- the op ----------------------------------------------------------------------------------


class ResizeBase(Op):
    """Shared planning and kernel of Resize and Upsample; subclasses provide ``request()``."""

    aliases_inputs = True  # a resize to the input's own shape returns the input

    def plan(self, x: TensorInfo, scales, sizes, roi, req: ResizeRequest) -> TensorInfo:
        """Precompute per-axis taps. ``scales``/``sizes``/``roi`` cover every axis of ``x``;
        given one of scales and sizes, the other follows (sizes = floor(scale * input size),
        scales = sizes / input sizes); keep_aspect_ratio_policy gives both."""
        # Kept for the gradient, which rebuilds this plan (see add_grad).
        self.plan_args = (scales, sizes, roi, req)
        if x.dtype not in _FLOAT_DTYPES and req.mode != "nearest":
            raise UnsupportedOpError(
                f"{self.debug_name}: mode '{req.mode}' on {x} is not supported; only nearest "
                f"resizes non-float tensors. Cast to float first."
            )
        if req.antialias and req.mode == "nearest":
            req = dataclasses.replace(req, antialias=False)  # antialias is for linear/cubic only
        source = x
        from_scale = sizes is None
        if scales is None:
            out_shape = tuple(int(s) for s in sizes)
            scales = [_F32(o) / _F32(i) if i else _F32(1) for o, i in zip(out_shape, x.shape)]
        else:
            if any(not s > 0 for s in scales):
                raise ShapeError(f"{self.debug_name}: scales {list(scales)} must be positive.")
            out_shape = tuple(int(np.floor(_F32(s) * _F32(n))) for s, n in zip(scales, x.shape))
            if sizes is not None:
                out_shape = tuple(int(s) for s in sizes)
        self.out_shape = out_shape
        if out_shape == x.shape and req.transform != "tf_crop_and_resize":
            # onnxruntime (and F.interpolate given the size) copy when the shape does not
            # change, even if a scale like 1.2 on an axis of 3 would shift the samples.
            scales = [_F32(1)] * x.rank
        self.compute_dtype = {DataType.DOUBLE: torch.float64}.get(x.dtype, torch.float32)
        self.steps = []
        masks = []
        for axis, (n_in, n_out, scale) in enumerate(zip(x.shape, out_shape, scales)):
            crop = req.transform == "tf_crop_and_resize"
            if n_out == n_in and float(scale) == 1.0 and not crop:
                continue
            if n_in == 0 or n_out == 0:
                raise ShapeError(
                    f"{self.debug_name}: cannot resize axis {axis} from {n_in} to {n_out}."
                )
            ft = np.float64 if x.dtype == DataType.DOUBLE else _F32
            axis_roi = (roi[axis], roi[axis + x.rank])
            coords = _source_coordinates(req, n_out, n_in, scale, axis_roi, ft, from_scale)
            index, weight = _taps(req, coords, n_in, scale)
            taps = index.shape[1]
            view = x.shape[:axis] + (n_out, taps) + x.shape[axis + 1 :]
            if weight is not None:
                trailing = (1,) * (x.rank - axis - 1)
                weight = torch.from_numpy(weight.reshape((n_out, taps) + trailing))
                weight = weight.to(self.compute_dtype)
            self.steps.append((axis, torch.from_numpy(index.reshape(-1).copy()), weight, view))
            if crop:
                outside = (coords < 0) | (coords > n_in - 1)
                if outside.any():
                    shape = [1] * x.rank
                    shape[axis] = n_out
                    masks.append(torch.from_numpy(outside.reshape(shape)))
            x = x.with_shape(x.shape[:axis] + (n_out,) + x.shape[axis + 1 :])
        self.mask = None
        if masks:
            self.mask = masks[0]
            for m in masks[1:]:
                self.mask = self.mask | m
            self.fill = torch.tensor(req.extrapolation_value, dtype=self.compute_dtype)
        self.fast = self._fast_path(source, scales, req)
        return x

    def _fast_path(self, x: TensorInfo, scales, req: ResizeRequest):
        """A single F.interpolate call equal to the tap plan, or None."""
        rank = x.rank
        if not 3 <= rank <= 5 or x.shape[:2] != self.out_shape[:2] or self.mask is not None:
            return None
        if req.antialias or x.dtype != DataType.FLOAT:  # torch samples doubles in float32
            return None
        if any(axis < 2 for axis, *_ in self.steps):
            return None
        spatial = list(range(2, rank))
        if any(x.shape[a] == 0 for a in spatial):
            return None
        size = self.out_shape[2:]
        # Up to float32 rounding of the scale (sizes give scale = out / in in float32).
        exact = [abs(float(s) * x.shape[a] - size[a - 2]) <= 1e-6 * size[a - 2]
                 for a, s in zip(spatial, scales[2:])]
        linear = {3: "linear", 4: "bilinear", 5: "trilinear"}[rank]
        t = req.transform
        if req.mode == "linear" or (req.mode == "cubic" and rank == 4 and req.cubic_coeff_a == -0.75
                                     and not req.exclude_outside):
            mode = linear if req.mode == "linear" else "bicubic"
            if t == "align_corners" and all(exact):
                # torch divides by (size - 1); ONNX by (scale * input - 1): equal when whole.
                return dict(size=size, mode=mode, align_corners=True)
            if t == "align_corners":
                return None
            # torch samples with in/out when given a size; ONNX uses the scale, which equals
            # in/out only when the scaled size is a whole number.
            half_pixel = t == "half_pixel" or (t == "pytorch_half_pixel" and min(size) > 1)
            if half_pixel and all(exact):
                return dict(size=size, mode=mode, align_corners=False)
            return None
        if req.mode == "nearest" and t == "asymmetric" and req.nearest_mode in ("floor", "legacy"):
            # torch picks floor(out_index * float(in / out)); use it only where that is verified
            # to select the same pixels as the plan.
            for axis, index, _, _ in self.steps:
                n_in, n_out = x.shape[axis], self.out_shape[axis]
                if axis < 2 or n_out != n_in * round(n_out / n_in) or n_out < n_in:
                    return None
                step = _F32(n_in) / _F32(n_out)
                theirs = np.minimum(np.floor(np.arange(n_out, dtype=_F32) * step), n_in - 1)
                if not np.array_equal(theirs.astype(np.int64), index.numpy()):
                    return None
            return dict(size=size, mode="nearest")
        return None

    def resize(self, x):
        if self.fast is not None:
            return F.interpolate(x, **self.fast)
        out_dtype = x.dtype
        if self.steps and self.steps[0][2] is not None and x.dtype != self.compute_dtype:
            x = x.to(self.compute_dtype)
        for axis, index, weight, view in self.steps:
            x = x.index_select(axis, index)
            if weight is not None:
                x = (x.reshape(view) * weight).sum(axis + 1)
        if self.mask is not None:
            x = torch.where(self.mask, self.fill.to(x.dtype), x)
        return x.to(out_dtype) if x.dtype != out_dtype else x

    def add_grad(self, g) -> None:
        """The input gradient through ResizeGrad, which replans from this op's request."""
        scales, sizes, roi, req = self.plan_args
        g.set_input_grad(0, g.op(
            "ResizeGrad", g.output_grad(0), domain=AI_GRAPHCORE, shape=g.input_info(0).shape,
            scales=None if scales is None else tuple(float(s) for s in scales),
            sizes=None if sizes is None else tuple(int(s) for s in sizes),
            roi=tuple(float(r) for r in roi), **dataclasses.asdict(req)))

    def check_count(self, x: TensorInfo, values, what: str) -> None:
        if len(values) != x.rank:
            raise ShapeError(
                f"{self.debug_name}: {what} has {len(values)} values, {x} has rank {x.rank}."
            )


@register_op("Resize", versions=(10, 11, 13, 18, 19))
class Resize(ResizeBase):
    """Resize with constant scales or sizes (and roi for tf_crop_and_resize)."""

    const_inputs = (1, 2, 3)

    @dataclass(frozen=True)
    class Attrs10:
        mode: str = "nearest"

    @dataclass(frozen=True)
    class Attrs11(Attrs10):
        coordinate_transformation_mode: str = "half_pixel"
        nearest_mode: str = "round_prefer_floor"
        cubic_coeff_a: float = -0.75
        exclude_outside: int = 0
        extrapolation_value: float = 0.0

    @dataclass(frozen=True)
    class Attrs(Attrs11):
        """Versions 18 and 19."""

        antialias: int = 0
        axes: tuple[int, ...] | None = None
        keep_aspect_ratio_policy: str = "stretch"

    @classmethod
    def attrs_type(cls, version):
        return cls.Attrs10 if version < 11 else cls.Attrs11 if version < 18 else cls.Attrs

    def request(self) -> ResizeRequest:
        a = self.attrs
        modes = ("nearest", "linear") if self.version < 11 else ("nearest", "linear", "cubic")
        if a.mode not in modes:
            raise ModelError(
                f"{self.debug_name}: mode '{a.mode}' is not one of {modes} (Resize-{self.version})."
            )
        if self.version < 11:
            return ResizeRequest(a.mode, "asymmetric", "legacy")
        allowed = _TRANSFORMS[max(v for v in _TRANSFORMS if v <= self.version)]
        if a.coordinate_transformation_mode not in allowed:
            raise ModelError(
                f"{self.debug_name}: coordinate_transformation_mode "
                f"'{a.coordinate_transformation_mode}' is not defined for Resize-{self.version}; "
                f"it accepts {sorted(allowed)}."
            )
        if a.nearest_mode not in _NEAREST_MODES + ("pytorch",):
            raise ModelError(
                f"{self.debug_name}: nearest_mode '{a.nearest_mode}' is not one of "
                f"{_NEAREST_MODES + ('pytorch',)}."
            )
        transform, nearest = a.coordinate_transformation_mode, a.nearest_mode
        if nearest == "pytorch" and a.mode == "nearest":
            # PopART's extra mode, torch's nearest interpolation: output index i reads input
            # floor(i / scale), whatever coordinate_transformation_mode says.
            transform, nearest = "asymmetric", "floor"
        return ResizeRequest(
            a.mode, transform, nearest, float(a.cubic_coeff_a),
            bool(a.exclude_outside), float(a.extrapolation_value), bool(getattr(a, "antialias", 0)),
        )

    def infer(self, x, roi=None, scales=None, sizes=None):
        req = self.request()
        if self.version < 11:
            return self.plan(x, self._values(1, float, x), None, self._full_roi(x), req)
        # roi only matters to tf_crop_and_resize; elsewhere it may even be computed.
        crop = req.transform == "tf_crop_and_resize"
        roi_v = self._values(1, float, None) if crop else None
        scales_v = self._values(2, float, None)
        sizes_v = self._values(3, int, None)
        if (scales_v is None) == (sizes_v is None):
            raise ModelError(
                f"{self.debug_name}: exactly one of scales and sizes must be given (non-empty); "
                f"got scales={scales_v}, sizes={sizes_v}."
            )
        axes = list(range(x.rank))
        if getattr(self.attrs, "axes", None) is not None:
            axes = [normalize_axis(self, a, x.rank) for a in self.attrs.axes]
            if len(set(axes)) != len(axes):
                raise ShapeError(f"{self.debug_name}: axes {self.attrs.axes} repeat an axis.")
        given = scales_v if scales_v is not None else sizes_v
        if len(given) != len(axes):
            raise ShapeError(
                f"{self.debug_name}: {'scales' if scales_v is not None else 'sizes'} has "
                f"{len(given)} values for {len(axes)} axes of {x}."
            )
        full_roi = self._full_roi(x)
        if crop:
            if roi_v is None or len(roi_v) != 2 * len(axes):
                raise ShapeError(
                    f"{self.debug_name}: tf_crop_and_resize needs roi with {2 * len(axes)} values "
                    f"(starts then ends of axes {axes}), got {roi_v}."
                )
            for i, a in enumerate(axes):
                full_roi[a], full_roi[a + x.rank] = roi_v[i], roi_v[i + len(axes)]
        if scales_v is not None:
            full = [1.0] * x.rank
            for a, s in zip(axes, scales_v):
                full[a] = s
            return self.plan(x, full, None, full_roi, req)
        out = list(x.shape)
        policy = getattr(self.attrs, "keep_aspect_ratio_policy", "stretch")
        if policy not in _ASPECT_POLICIES:
            raise ModelError(
                f"{self.debug_name}: keep_aspect_ratio_policy '{policy}' is not one of "
                f"{_ASPECT_POLICIES}."
            )
        if policy == "stretch":
            for a, s in zip(axes, sizes_v):
                out[a] = s
            return self.plan(x, None, out, full_roi, req)
        ratios = [_F32(s) / _F32(x.shape[a]) for a, s in zip(axes, sizes_v)]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        full = [_F32(1)] * x.rank
        for a in axes:
            full[a] = scale
            out[a] = int(np.floor(scale * _F32(x.shape[a]) + _F32(0.5)))
        # Sizes were adjusted: sample with the common scale, keep the rounded sizes.
        return self.plan(x, full, out, full_roi, req)

    def _values(self, index, kind, x):
        """A constant 1-D input as a list; None when absent or empty."""
        value = self.const_input(index)
        if value is None or np.asarray(value).size == 0:
            if x is not None:
                raise ShapeError(f"{self.debug_name}: input {index} (scales) is required.")
            return None
        values = np.asarray(value).reshape(-1)
        if x is not None:
            self.check_count(x, values, "scales")
        return [_F32(v) for v in values] if kind is float else [int(v) for v in values]

    @staticmethod
    def _full_roi(x):
        return [0.0] * x.rank + [1.0] * x.rank

    def kernel(self, x, roi=None, scales=None, sizes=None):
        return self.resize(x)

    def grad(self, g):
        self.add_grad(g)


@register_op("Upsample", versions=(1, 7, 9, 10))
class Upsample(ResizeBase):
    """Upsample: nearest or (bi)linear, asymmetric coordinates. Scales are an attribute in
    versions 1 (height_scale/width_scale of a 4-D input) and 7, a constant input from 9."""

    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        mode: str = "nearest"

    @dataclass(frozen=True)
    class Attrs7:
        scales: tuple[float, ...]
        mode: str = "nearest"

    @dataclass(frozen=True)
    class Attrs1:
        height_scale: float
        width_scale: float
        mode: str = "nearest"

    @classmethod
    def attrs_type(cls, version):
        return {1: cls.Attrs1, 7: cls.Attrs7}.get(version, cls.Attrs)

    def infer(self, x, scales=None):
        mode = {"bilinear": "linear"}.get(self.attrs.mode, self.attrs.mode) if self.version == 1 \
            else self.attrs.mode
        if mode not in ("nearest", "linear"):
            raise ModelError(f"{self.debug_name}: unknown mode '{self.attrs.mode}'.")
        if self.version == 1:
            if x.rank != 4:
                raise ShapeError(f"{self.debug_name}: Upsample-1 takes a 4-D input, got {x}.")
            values = [1.0, 1.0, self.attrs.height_scale, self.attrs.width_scale]
        elif self.version == 7:
            values = list(self.attrs.scales)
        else:
            value = self.const_input(1)
            if value is None:
                raise ShapeError(f"{self.debug_name}: input 1 (scales) is required.")
            values = np.asarray(value).reshape(-1).tolist()
        self.check_count(x, values, "scales")
        if any(v < 1 for v in values):
            raise ShapeError(f"{self.debug_name}: Upsample scales {values} must be >= 1.")
        req = ResizeRequest(mode, "asymmetric", "legacy")
        return self.plan(x, [_F32(v) for v in values], None, [0.0] * x.rank + [1.0] * x.rank, req)

    def kernel(self, x, scales=None):
        return self.resize(x)

    def grad(self, g):
        self.add_grad(g)


@register_op("ResizeGrad", versions=1, domain=AI_GRAPHCORE)
class ResizeGrad(ResizeBase):
    """dx of Resize/Upsample: the transpose of the forward taps, applied axis by axis."""

    @dataclass(frozen=True)
    class Attrs:
        shape: tuple[int, ...]  # of the forward input
        scales: tuple[float, ...] | None
        sizes: tuple[int, ...] | None
        roi: tuple[float, ...]
        # The fields of ResizeRequest.
        mode: str
        transform: str
        nearest_mode: str
        cubic_coeff_a: float
        exclude_outside: bool
        extrapolation_value: float
        antialias: bool

    def infer(self, dy):
        a = self.attrs
        req = ResizeRequest(a.mode, a.transform, a.nearest_mode, a.cubic_coeff_a,
                            a.exclude_outside, a.extrapolation_value, a.antialias)
        x = dy.with_shape(a.shape)
        scales = None if a.scales is None else [_F32(s) for s in a.scales]
        resized = self.plan(x, scales, a.sizes, list(a.roi), req)
        if resized.shape != dy.shape:
            raise ShapeError(
                f"{self.debug_name}: gradient {dy} does not have the shape {list(resized.shape)} "
                f"the forward resize of {x} produced.")
        # Per step, in reverse: dy with the taps axis merged into the resized axis, and the
        # zeros the taps add into.
        self.adjoint = []
        for axis, index, weight, view in reversed(self.steps):
            merged = view[:axis] + (view[axis] * view[axis + 1],) + view[axis + 2 :]
            zeros = view[:axis] + (a.shape[axis],) + view[axis + 2 :]
            self.adjoint.append((axis, index, weight, merged, zeros))
        return x

    def kernel(self, dy):
        out_dtype = dy.dtype
        if self.mask is not None:
            dy = torch.where(self.mask, dy.new_zeros(()), dy)
        if self.steps and self.steps[0][2] is not None and dy.dtype != self.compute_dtype:
            dy = dy.to(self.compute_dtype)
        for axis, index, weight, merged, zeros in self.adjoint:
            if weight is not None:
                dy = (dy.unsqueeze(axis + 1) * weight).reshape(merged)
            dy = dy.new_zeros(zeros).index_add_(axis, index, dy)
        return dy.to(out_dtype) if dy.dtype != out_dtype else dy


__all__: list[str] = []
