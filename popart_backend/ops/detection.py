"""Region and detection ops: RoiAlign, MaxRoiPool and NonMaxSuppression.

RoiAlign and MaxRoiPool read the ROI coordinates at run time: their per-ROI sampling plans
(bilinear taps, bin masks) are built with a few vectorised torch ops per call, and their
gradients route each bin's gradient back to the pixels it read (all of them, weighted, for
averages; the winner for maxima).

NonMaxSuppression returns one row per kept box, a count that depends on every input value.
Shapes on the simulated IPU are fixed at compile time, so its inputs must be constants and the
selection runs at compile time (the op folds).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import check_dtypes
from .image import _static_value
from .registry import AI_GRAPHCORE, register_op


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype RoiAlign computes ``t``'s data in: half types widen to float32."""
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _bilinear_axis(pos: torch.Tensor, size: int):
    """Per-axis bilinear taps of RoiAlign's sampler: (low index, high index, low weight, high
    weight), with both weights 0 where ``pos`` lies more than a pixel outside [0, size)."""
    inside = (pos >= -1.0) & (pos <= size)
    pos = pos.clamp(min=0)
    low = pos.floor().long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, size - 1, low + 1)
    frac = torch.where(at_edge, torch.zeros_like(pos), pos - low.to(pos.dtype))
    zero = torch.zeros_like(pos)
    return (low, high, torch.where(inside, 1 - frac, zero), torch.where(inside, frac, zero))


@register_op("RoiAlign", versions=(10, 16, 22))
class RoiAlign(Op):
    """Average (or max) of bilinear samples on a regular grid inside each bin of each region of
    interest: Y[r, c, i, j] from X[batch_indices[r], c] over rois[r] = (x1, y1, x2, y2).

    Version 10 samples as ``output_half_pixel`` (no half-pixel shift, regions at least 1
    pixel); from 16 ``coordinate_transformation_mode`` picks that or ``half_pixel``. Max mode
    takes, per sample, the largest of the four weighted corner values, then the largest over
    the samples, as onnxruntime defines it.
    """

    @dataclass(frozen=True)
    class Attrs10:
        mode: str = "avg"
        output_height: int = 1
        output_width: int = 1
        sampling_ratio: int = 0
        spatial_scale: float = 1.0

    @dataclass(frozen=True)
    class Attrs(Attrs10):
        coordinate_transformation_mode: str = "half_pixel"

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs10 if version < 16 else cls.Attrs

    def infer(self, x, rois, batch_indices):
        check_dtypes(self, x, rois, batch_indices)
        return self.setup(x, rois, batch_indices)

    def setup(self, x: TensorInfo, rois: TensorInfo, batch_indices: TensorInfo) -> TensorInfo:
        """Y's info after checking the operands and attributes."""
        at = self.attrs
        transform = getattr(at, "coordinate_transformation_mode", "output_half_pixel")
        if at.mode not in ("avg", "max") or transform not in ("half_pixel", "output_half_pixel"):
            raise ShapeError(
                f"{self.debug_name}: mode '{at.mode}' must be avg or max and "
                f"coordinate_transformation_mode '{transform}' half_pixel or output_half_pixel."
            )
        if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 4 or batch_indices.shape != (
                rois.shape[0],):
            raise ShapeError(
                f"{self.debug_name}: X {x} must be [N, C, H, W], rois {rois} [R, 4] and "
                f"batch_indices {batch_indices} [R]."
            )
        if at.output_height < 1 or at.output_width < 1 or at.sampling_ratio < 0:
            raise ShapeError(f"{self.debug_name}: output sizes must be >= 1 and sampling_ratio "
                             f">= 0 ({at}).")
        self._half_pixel = transform == "half_pixel"
        self._hw = x.shape[2:]
        return x.with_shape((rois.shape[0], x.shape[1], at.output_height, at.output_width))

    def plan(self, rois: torch.Tensor):
        """Per-axis sampling taps of every ROI, bin and sample, and the sample count per ROI.

        Returns ((y low, y high, y weights...), (x ...), valid y samples, valid x samples,
        count): the taps are [R, bins, samples]; ROIs sample adaptively (sampling_ratio 0)
        on different grids, padded to the largest with invalid samples.
        """
        at = self.attrs
        dtype = _work_dtype(rois)
        rois = rois.to(dtype)
        shift = 0.5 if self._half_pixel else 0.0
        start = rois[:, :2] * at.spatial_scale - shift  # (x1, y1)
        extent = rois[:, 2:] * at.spatial_scale - shift - start
        if not self._half_pixel:
            extent = extent.clamp(min=1.0)
        bins = torch.tensor([at.output_width, at.output_height], dtype=dtype)
        bin_size = extent / bins
        if at.sampling_ratio > 0:
            grid = torch.full_like(extent, at.sampling_ratio, dtype=torch.long)
        else:
            grid = torch.ceil(extent / bins).long()
        count = (grid[:, 0] * grid[:, 1]).clamp(min=1).to(dtype)
        axes = []
        for axis, (size, nbins) in enumerate(((self._hw[1], at.output_width),
                                              (self._hw[0], at.output_height))):
            most = max(int(grid[:, axis].max()) if grid.numel() else 1, 1)
            samples = torch.arange(most, dtype=dtype)
            per_roi = grid[:, axis].clamp(min=1).to(dtype)
            step = bin_size[:, axis]
            pos = (start[:, axis, None, None]
                   + torch.arange(nbins, dtype=dtype)[None, :, None] * step[:, None, None]
                   + (samples[None, None, :] + 0.5) * (step / per_roi)[:, None, None])
            valid = samples[None, None, :] < grid[:, axis, None, None]
            axes.append((_bilinear_axis(pos, size), valid.expand(pos.shape)))
        (x_taps, x_valid), (y_taps, y_valid) = axes
        return y_taps, x_taps, y_valid, x_valid, count

    @staticmethod
    def interpolation_matrix(taps, valid, size: int) -> torch.Tensor:
        """[R, bins, size]: the summed bilinear weights each bin puts on each pixel of an axis."""
        low, high, w_low, w_high = taps
        w_low, w_high = w_low * valid, w_high * valid
        r, bins, _ = low.shape
        out = w_low.new_zeros((r, bins, size))
        out.scatter_add_(2, low, w_low)
        return out.scatter_add_(2, high, w_high)

    def weighted_corners(self, x, batch_indices, y_taps, x_taps):
        """[R, C, oh, sy, 2, ow, sx, 2]: every sample's four corner values times their weights,
        and the matching flat pixel indices [R, oh, sy, 2, ow, sx, 2]."""
        width, dtype = self._hw[1], _work_dtype(x)
        ys = torch.stack(y_taps[:2], -1)  # [R, oh, sy, 2]
        xs = torch.stack(x_taps[:2], -1)  # [R, ow, sx, 2]
        wy = torch.stack(y_taps[2:], -1)
        wx = torch.stack(x_taps[2:], -1)
        r = ys.shape[0]
        flat = (ys.reshape(r, -1, 1) * width + xs.reshape(r, 1, -1))  # [R, oh·sy·2, ow·sx·2]
        images = x.to(dtype)[batch_indices.long()].flatten(2)  # [R, C, H·W]
        values = images.gather(2, flat.reshape(r, 1, -1).expand(-1, images.shape[1], -1))
        weights = wy.reshape(r, -1, 1) * wx.reshape(r, 1, -1)
        values = values.reshape((r, -1) + flat.shape[1:]) * weights.unsqueeze(1)
        shape = (r, -1) + ys.shape[1:] + xs.shape[1:]
        return values.reshape(shape), flat.reshape(shape[:1] + shape[2:])

    def kernel(self, x, rois, batch_indices):
        dtype = _work_dtype(x)
        y_taps, x_taps, y_valid, x_valid, count = self.plan(rois)
        if self.attrs.mode == "avg":
            ay = self.interpolation_matrix(y_taps, y_valid, self._hw[0])
            ax = self.interpolation_matrix(x_taps, x_valid, self._hw[1])
            images = x.to(dtype)[batch_indices.long()]
            y = torch.einsum("rph,rchw,rqw->rcpq", ay, images, ax) / count[:, None, None, None]
            return y.to(x.dtype)
        values, _ = self.weighted_corners(x, batch_indices, y_taps, x_taps)
        best = self.max_of_samples(values, y_valid, x_valid)[0]
        return torch.where(torch.isinf(best), torch.zeros_like(best), best).to(x.dtype)

    @staticmethod
    def max_of_samples(values, y_valid, x_valid):
        """Max (and its flat position) over each bin's valid samples and corners."""
        valid = y_valid[:, None, :, :, None, None, None, None] & \
            x_valid[:, None, None, None, None, :, :, None]
        values = values.masked_fill(~valid, float("-inf"))
        r, c, oh = values.shape[:3]
        ow = values.shape[5]
        per_bin = values.permute(0, 1, 2, 5, 3, 4, 6, 7).reshape(r, c, oh, ow, -1)
        return per_bin.max(-1)

    def grad(self, g):
        attrs = dataclasses.asdict(self.attrs)
        attrs["coordinate_transformation_mode"] = (
            "half_pixel" if self._half_pixel else "output_half_pixel")
        g.set_input_grad(0, g.op("RoiAlignGrad", g.output_grad(0), g.input(0), g.input(1),
                                 g.input(2), domain=AI_GRAPHCORE, **attrs))


@register_op("RoiAlignGrad", versions=1, domain=AI_GRAPHCORE)
class RoiAlignGrad(RoiAlign):
    """dX of RoiAlign from dY, X, rois and batch_indices: each bin's gradient flows back to the
    pixels it sampled (all, weighted, for avg; the winning corner for max)."""

    Attrs = RoiAlign.Attrs

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs

    def infer(self, dy, x, rois, batch_indices):
        self.setup(x, rois, batch_indices)
        return x

    def kernel(self, dy, x, rois, batch_indices):
        dtype = _work_dtype(x)
        y_taps, x_taps, y_valid, x_valid, count = self.plan(rois)
        n, c, h, w = x.shape
        index = batch_indices.long()
        if self.attrs.mode == "avg":
            ay = self.interpolation_matrix(y_taps, y_valid, h)
            ax = self.interpolation_matrix(x_taps, x_valid, w)
            per_roi = torch.einsum("rph,rcpq,rqw->rchw", ay, dy.to(dtype), ax) \
                / count[:, None, None, None]
            dx = per_roi.new_zeros((n, c, h, w)).index_add_(0, index, per_roi)
            return dx.to(x.dtype)
        values, flat = self.weighted_corners(x, batch_indices, y_taps, x_taps)
        best, where = self.max_of_samples(values, y_valid, x_valid)
        r = flat.shape[0]
        weights = self.corner_weights(y_taps, x_taps)
        flat_bins = flat.permute(0, 1, 4, 2, 3, 5, 6).reshape(r, 1, flat.shape[1],
                                                               flat.shape[4], -1)
        w_bins = weights.permute(0, 1, 4, 2, 3, 5, 6).reshape(flat_bins.shape)
        pixel = flat_bins.expand(-1, c, -1, -1, -1).gather(4, where.unsqueeze(-1)).squeeze(-1)
        weight = w_bins.expand(-1, c, -1, -1, -1).gather(4, where.unsqueeze(-1)).squeeze(-1)
        # A bin without samples (max -inf) reported 0 and passes nothing back.
        contribution = torch.where(torch.isinf(best), 0.0, dy.to(dtype) * weight)
        target = (index[:, None, None, None] * c + torch.arange(c)[None, :, None, None]) * (h * w) \
            + pixel
        dx = contribution.new_zeros(n * c * h * w).index_add_(0, target.reshape(-1),
                                                             contribution.reshape(-1))
        return dx.reshape(x.shape).to(x.dtype)

    @staticmethod
    def corner_weights(y_taps, x_taps):
        wy = torch.stack(y_taps[2:], -1)
        wx = torch.stack(x_taps[2:], -1)
        r = wy.shape[0]
        return wy.reshape((r,) + wy.shape[1:] + (1, 1, 1)) * wx.reshape((r, 1, 1, 1) + wx.shape[1:])

    grad = Op.grad


def _round_half_away(t: torch.Tensor) -> torch.Tensor:
    """C's round(): halves go away from zero (torch.round rounds them to even)."""
    return torch.sign(t) * torch.floor(t.abs() + 0.5)


@register_op("MaxRoiPool", versions=(1, 22))
class MaxRoiPool(Op):
    """Max over each bin of each region of interest: rois[r] = (batch, x1, y1, x2, y2) in input
    coordinates, scaled and rounded to pixels, split into pooled_shape bins (empty bins are 0)."""

    @dataclass(frozen=True)
    class Attrs:
        pooled_shape: tuple[int, ...]
        spatial_scale: float = 1.0

    def infer(self, x, rois):
        check_dtypes(self, x, rois)
        return self.setup(x, rois)

    def setup(self, x: TensorInfo, rois: TensorInfo) -> TensorInfo:
        """Y's info after checking the operands and attributes."""
        if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 5:
            raise ShapeError(f"{self.debug_name}: X {x} must be [N, C, H, W] and rois {rois} "
                             f"[R, 5] (batch, x1, y1, x2, y2).")
        if len(self.attrs.pooled_shape) != 2 or min(self.attrs.pooled_shape) < 1:
            raise ShapeError(f"{self.debug_name}: pooled_shape {list(self.attrs.pooled_shape)} "
                             f"must be two sizes >= 1.")
        self._hw = x.shape[2:]
        return x.with_shape((rois.shape[0], x.shape[1]) + tuple(self.attrs.pooled_shape))

    def bin_masks(self, rois: torch.Tensor):
        """Which rows [R, ph, H] and columns [R, pw, W] each bin covers."""
        corners = _round_half_away(rois[:, 1:].double() * self.attrs.spatial_scale).long()
        masks = []
        for axis, (size, bins) in enumerate(zip(self._hw, self.attrs.pooled_shape)):
            first, last = corners[:, 1 - axis], corners[:, 3 - axis]  # y for axis 0, x for 1
            extent = (last - first + 1).clamp(min=1).double()
            k = torch.arange(bins, dtype=torch.float64)
            step = extent[:, None] / bins
            begin = (torch.floor(k * step).long() + first[:, None]).clamp(0, size)
            end = (torch.ceil((k + 1) * step).long() + first[:, None]).clamp(0, size)
            pixels = torch.arange(size)
            masks.append((pixels >= begin[..., None]) & (pixels < end[..., None]))
        return masks

    def region_values(self, x, rois):
        """[R, C, ph, pw, H·W]: X of each ROI's image, -inf outside each bin."""
        rows, cols = self.bin_masks(rois)
        images = x[rois[:, 0].long()]
        inside = rows[:, :, None, :, None] & cols[:, None, :, None, :]  # [R, ph, pw, H, W]
        values = images[:, :, None, None] .masked_fill(~inside[:, None], float("-inf"))
        return values.flatten(4)

    def kernel(self, x, rois):
        best = self.region_values(x, rois).amax(-1)
        return torch.where(torch.isinf(best), torch.zeros_like(best), best)

    def grad(self, g):
        g.set_input_grad(0, g.op("MaxRoiPoolGrad", g.output_grad(0), g.input(0), g.input(1),
                                 domain=AI_GRAPHCORE, **dataclasses.asdict(self.attrs)))


@register_op("MaxRoiPoolGrad", versions=1, domain=AI_GRAPHCORE)
class MaxRoiPoolGrad(MaxRoiPool):
    """dX of MaxRoiPool: each bin's gradient goes to the pixel holding its max."""

    def infer(self, dy, x, rois):
        self.setup(x, rois)
        return x

    def kernel(self, dy, x, rois):
        n, c, h, w = x.shape
        best, where = self.region_values(x, rois).max(-1)
        batch = rois[:, 0].long()
        target = (batch[:, None, None, None] * c + torch.arange(c)[None, :, None, None]) \
            * (h * w) + where
        contribution = torch.where(torch.isinf(best), torch.zeros_like(dy), dy)
        dx = dy.new_zeros(n * c * h * w).index_add_(0, target.reshape(-1),
                                                    contribution.reshape(-1))
        return dx.reshape(x.shape)

    grad = Op.grad


@register_op("NonMaxSuppression", versions=(10, 11))
class NonMaxSuppression(Op):
    """Greedy non-max suppression per batch and class: [selected, 3] rows (batch, class, box).

    The number of rows depends on the values of every input, so all must be constants; the
    selection runs once at compile time (the op folds). No gradient (index output).
    """

    const_inputs = (0, 1, 2, 3, 4)

    @dataclass(frozen=True)
    class Attrs:
        center_point_box: int = 0

    def infer(self, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None):
        if boxes.rank != 3 or boxes.shape[2] != 4 or scores.rank != 3 or (
                scores.shape[0], scores.shape[2]) != boxes.shape[:2]:
            raise ShapeError(
                f"{self.debug_name}: boxes {boxes} must be [B, boxes, 4] and scores {scores} "
                f"[B, classes, boxes]."
            )
        if self.attrs.center_point_box not in (0, 1):
            raise ShapeError(f"{self.debug_name}: center_point_box must be 0 or 1.")
        box_values = torch.from_numpy(np.array(_static_value(self, 0, "boxes")))
        score_values = torch.from_numpy(np.array(_static_value(self, 1, "scores")))
        limit = _static_value(self, 2, "max_output_boxes_per_class")
        iou = _static_value(self, 3, "iou_threshold")
        floor = _static_value(self, 4, "score_threshold")
        limit = 0 if limit is None or np.size(limit) == 0 else int(np.asarray(limit).reshape(-1)[0])
        iou = 0.0 if iou is None or np.size(iou) == 0 else float(np.asarray(iou).reshape(-1)[0])
        floor = None if floor is None or np.size(floor) == 0 else float(
            np.asarray(floor).reshape(-1)[0])
        rows = []
        for b in range(boxes.shape[0]):
            corners = self.corners(box_values[b].double())
            for c in range(scores.shape[1]):
                for kept in self.select(corners, score_values[b, c], limit, iou, floor):
                    rows.append((b, c, kept))
        self._value = torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)
        return TensorInfo(DataType.INT64, tuple(self._value.shape))

    def corners(self, boxes: torch.Tensor) -> torch.Tensor:
        """[boxes, 4] as (y min, x min, y max, x max)."""
        if self.attrs.center_point_box:
            centre, size = boxes[:, [1, 0]], boxes[:, [3, 2]]
            return torch.cat([centre - size / 2, centre + size / 2], 1)
        return torch.cat([torch.minimum(boxes[:, :2], boxes[:, 2:]),
                          torch.maximum(boxes[:, :2], boxes[:, 2:])], 1)

    @staticmethod
    def select(corners, scores, limit: int, iou_threshold: float, score_threshold):
        """Indices kept for one class, best score first (ties: lower index first)."""
        if limit <= 0:
            return []
        order = torch.sort(-scores.double(), stable=True).indices.tolist()
        area = (corners[:, 2] - corners[:, 0]) * (corners[:, 3] - corners[:, 1])
        kept: list[int] = []
        for i in order:
            if score_threshold is not None and not float(scores[i]) > score_threshold:
                break
            if kept:
                others = torch.tensor(kept)
                low = torch.maximum(corners[others, :2], corners[i, :2])
                high = torch.minimum(corners[others, 2:], corners[i, 2:])
                inter = (high - low).clamp(min=0).prod(1)
                union = area[others] + area[i] - inter
                overlap = torch.where((area[others] > 0) & (area[i] > 0), inter / union, 0.0)
                if bool((overlap > iou_threshold).any()):
                    continue
            kept.append(i)
            if len(kept) == limit:
                break
        return kept

    def kernel(self, *inputs):
        return self._value.clone()
