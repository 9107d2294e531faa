"""Image ops: GridSample, AffineGrid, DeformConv and ImageDecoder.

GridSample runs torch's grid sampler (the kernel of ``F.grid_sample``) and differentiates X and
the grid with its backward kernel. DeformConv samples X at the offset kernel taps with the same
grid sampler (bilinear, zeros outside: exactly deformable convolution's interpolation) and
contracts the samples with the weights, so its gradients (X, W, offsets, mask, bias) reuse the
sampler's backward. AffineGrid is a matrix product with a fixed base grid.

ImageDecoder's output shape is the decoded image's size. Shapes on the simulated IPU are fixed
at compile time, so the encoded bytes must be a constant and the image is decoded (with
Pillow) at compile time: the op folds.
"""

from __future__ import annotations

import dataclasses
import io
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..dtypes import DataType
from ..errors import ShapeError, UnsupportedOpError
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .base import check_dtypes
from .conv import spatial_list
from .gather_scatter import _static_only
from .multi_grad import add_multi_grad_op, pick_grads, wanted_grads
from .registry import AI_GRAPHCORE, register_op
from .shape import const_ints

# ONNX mode names of each GridSample version -> torch's grid sampler codes.
_SAMPLE_MODES = {16: {"bilinear": 0, "nearest": 1, "bicubic": 2},
                 20: {"linear": 0, "nearest": 1, "cubic": 2}}
_PADDING_MODES = {"zeros": 0, "border": 1, "reflection": 2}


def _grid_backward(spatial: int):
    return (torch.ops.aten.grid_sampler_2d_backward if spatial == 2
            else torch.ops.aten.grid_sampler_3d_backward)


@register_op("GridSample", versions=(16, 20, 22))
class GridSample(Op):
    """Y[n, c, p] = X[n, c] interpolated at the normalised position grid[n, p] (in [-1, 1])."""

    @dataclass(frozen=True)
    class Attrs:
        align_corners: int = 0
        mode: str = "linear"
        padding_mode: str = "zeros"

    @dataclass(frozen=True)
    class Attrs16(Attrs):
        mode: str = "bilinear"

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs16 if version < 20 else cls.Attrs

    def infer(self, x, grid):
        check_dtypes(self, x, grid)
        return self.setup(x, grid, self.version)

    def setup(self, x: TensorInfo, grid: TensorInfo, version: int) -> TensorInfo:
        """Y's info after checking the operands and attributes against GridSample-``version``."""
        modes = _SAMPLE_MODES[16 if version < 20 else 20]
        at = self.attrs
        if at.mode not in modes or at.padding_mode not in _PADDING_MODES:
            raise ShapeError(
                f"{self.debug_name}: mode '{at.mode}' / padding_mode '{at.padding_mode}' must be "
                f"one of {list(modes)} / {list(_PADDING_MODES)} (GridSample-{version})."
            )
        spatial = x.rank - 2
        if version < 20 and spatial != 2:
            raise ShapeError(f"{self.debug_name}: GridSample-{version} takes 4-D X, got {x}.")
        if spatial not in (2, 3):
            raise UnsupportedOpError(
                f"{self.debug_name}: X {x} has {spatial} spatial dims; the simulated IPU's grid "
                f"sampler handles 2 or 3."
            )
        if grid.rank != x.rank or grid.shape[0] != x.shape[0] or grid.shape[-1] != spatial:
            raise ShapeError(
                f"{self.debug_name}: grid {grid} must be [N, out spatial dims..., {spatial}] "
                f"with N = {x.shape[0]} (X {x})."
            )
        if not x.dtype.is_float:
            raise UnsupportedOpError(
                f"{self.debug_name}: X {x} is not floating point; the simulated IPU's grid "
                f"sampler interpolates float data only. Cast X to float first."
            )
        self._mode, self._padding = modes[at.mode], _PADDING_MODES[at.padding_mode]
        if spatial == 3 and self._mode == 2:
            raise UnsupportedOpError(
                f"{self.debug_name}: cubic interpolation of 5-D X {x} is not implemented (torch's "
                f"grid sampler, our kernel, has bicubic only for 4-D). Use mode 'linear'."
            )
        self._spatial = spatial
        return x.with_shape(x.shape[:2] + grid.shape[1:-1])

    def kernel(self, x, grid):
        return torch.grid_sampler(x, grid.to(x.dtype), self._mode, self._padding,
                                  bool(self.attrs.align_corners))

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1))
        if wrt:
            add_multi_grad_op(g, "GridSampleGrad", g.output_grad(0), g.input(0), g.input(1),
                              wrt=wrt, version_of=self.version, **dataclasses.asdict(self.attrs))


@register_op("GridSampleGrad", versions=1, domain=AI_GRAPHCORE)
class GridSampleGrad(GridSample):
    """dX and d grid of GridSample (those in ``wrt``) from dY, X and grid."""

    @dataclass(frozen=True)
    class Attrs:
        align_corners: int = 0
        mode: str = "linear"
        padding_mode: str = "zeros"
        version_of: int = 20
        wrt: tuple[int, ...] = (0, 1)

    @classmethod
    def attrs_type(cls, version: int) -> type:
        return cls.Attrs

    def infer(self, dy, x, grid):
        self.setup(x, grid, self.attrs.version_of)
        infos = (x, grid)
        return [infos[i] for i in self.attrs.wrt]

    def kernel(self, dy, x, grid):
        mask = [i in self.attrs.wrt for i in (0, 1)]
        dx, dgrid = _grid_backward(self._spatial)(
            dy, x, grid.to(x.dtype), self._mode, self._padding, bool(self.attrs.align_corners),
            mask)
        return pick_grads((dx, None if dgrid is None else dgrid.to(grid.dtype)), self.attrs.wrt)

    grad = Op.grad


def _base_coords(size: int, align_corners: bool, dtype: torch.dtype) -> torch.Tensor:
    """Normalised pixel positions along one axis: ends at ±1 or pixel centres.

    A single aligned pixel sits at -1 as in the ONNX reference (onnxruntime puts it at +1,
    torch at 0: the formula 2/(size - 1) has no answer there).
    """
    if align_corners:
        return torch.linspace(-1, 1, size, dtype=dtype)
    return (torch.arange(size, dtype=dtype) * 2 + 1) / size - 1


@register_op("AffineGrid", versions=20)
class AffineGrid(Op):
    """grid[n, ..., :] = theta[n] @ (x, y[, z], 1): the sampling grid of an affine transform,
    [N, H, W, 2] (theta [N, 2, 3]) or [N, D, H, W, 3] (theta [N, 3, 4])."""

    const_inputs = (1,)

    @dataclass(frozen=True)
    class Attrs:
        align_corners: int = 0

    def infer(self, theta, size):
        check_dtypes(self, theta, size)
        return self.setup(theta, const_ints(self, 1, "size"))

    def setup(self, theta: TensorInfo, dims: tuple[int, ...]) -> TensorInfo:
        """The grid's info; precomputes the base grid of output size ``dims``."""
        if len(dims) not in (4, 5):
            raise ShapeError(f"{self.debug_name}: size {list(dims)} must be [N, C, H, W] or "
                             f"[N, C, D, H, W].")
        spatial = len(dims) - 2
        if theta.shape != (dims[0], spatial, spatial + 1):
            raise ShapeError(
                f"{self.debug_name}: theta {theta} must be [{dims[0]}, {spatial}, {spatial + 1}] "
                f"for size {list(dims)}."
            )
        compute = torch.float32 if theta.dtype in (DataType.FLOAT16, DataType.BFLOAT16) \
            else theta.dtype.torch
        # (x, y[, z], 1) per output point, x running fastest: [points, spatial + 1].
        axes = [_base_coords(d, bool(self.attrs.align_corners), compute) for d in dims[2:]]
        mesh = torch.meshgrid(*axes, indexing="ij")
        columns = [m.reshape(-1) for m in reversed(mesh)]
        self._base = torch.stack(columns + [torch.ones_like(columns[0])], 1)
        self._out = (dims[0],) + tuple(dims[2:]) + (spatial,)
        return theta.with_shape(self._out)

    def kernel(self, theta, size):
        grid = torch.matmul(self._base, theta.to(self._base.dtype).transpose(1, 2))
        return grid.reshape(self._out).to(theta.dtype)

    def grad(self, g):
        g.set_input_grad(0, g.op("AffineGridGrad", g.output_grad(0), g.input(0), g.input(1),
                                 domain=AI_GRAPHCORE, align_corners=self.attrs.align_corners))


@register_op("AffineGridGrad", versions=1, domain=AI_GRAPHCORE)
class AffineGridGrad(AffineGrid):
    """d theta = d grid^T @ base grid; inputs (d grid, theta, size)."""

    const_inputs = (2,)

    def infer(self, dgrid, theta, size):
        self.setup(theta, const_ints(self, 2, "size"))
        return theta

    def kernel(self, dgrid, theta, size):
        flat = dgrid.reshape(dgrid.shape[0], -1, dgrid.shape[-1]).to(self._base.dtype)
        return torch.matmul(flat.transpose(1, 2), self._base).to(theta.dtype)

    grad = Op.grad


@register_op("DeformConv", versions=(19, 22))
class DeformConv(Op):
    """Deformable convolution: each kernel tap reads X at its regular position plus a learned
    offset (bilinear, zero outside X), optionally scaled by a mask, then a grouped
    convolution's weights contract the samples. 2 or 3 spatial dims."""

    uses_amp = True

    @dataclass(frozen=True)
    class Attrs:
        dilations: tuple[int, ...] = ()
        group: int = 1
        kernel_shape: tuple[int, ...] = ()
        offset_group: int = 1
        pads: tuple[int, ...] = ()
        strides: tuple[int, ...] = ()

    def infer(self, x, w, offset, b=None, mask=None):
        check_dtypes(self, x, w, offset, b, mask)
        self.setup(x, w, offset, b, mask)
        return x.with_shape((x.shape[0], w.shape[0]) + self._out)

    def setup(self, x, w, offset, b=None, mask=None) -> None:
        """Check the operands; precompute the taps' regular sampling positions."""
        at = self.attrs
        spatial = x.rank - 2
        if spatial not in (2, 3) or w.rank != x.rank:
            raise UnsupportedOpError(
                f"{self.debug_name}: X {x} and W {w} must both have 2 or 3 spatial dims (the "
                f"simulated IPU samples the taps with a 2-D / 3-D grid sampler)."
            )
        kernel = w.shape[2:]
        if at.kernel_shape and tuple(at.kernel_shape) != kernel:
            raise ShapeError(f"{self.debug_name}: kernel_shape {list(at.kernel_shape)} differs "
                             f"from W {w}.")
        strides = spatial_list(self, "strides", at.strides, spatial, 1)
        dilations = spatial_list(self, "dilations", at.dilations, spatial, 1)
        pads = spatial_list(self, "pads", at.pads, 2 * spatial, 0)
        n, c = x.shape[:2]
        groups, offset_groups = at.group, at.offset_group
        if c != w.shape[1] * groups or w.shape[0] % groups or c % offset_groups:
            raise ShapeError(
                f"{self.debug_name}: X {x} has {c} channels; W {w} with group={groups} expects "
                f"{w.shape[1] * groups}, and offset_group={offset_groups} must divide them."
            )
        out = tuple(
            (d + pads[i] + pads[i + spatial] - (k - 1) * dl - 1) // s + 1
            for i, (d, k, s, dl) in enumerate(zip(x.shape[2:], kernel, strides, dilations)))
        if any(o < 1 for o in out):
            raise ShapeError(f"{self.debug_name}: the kernel {list(kernel)} does not fit X {x} "
                             f"with pads {list(pads)}.")
        taps = math.prod(kernel)
        if offset.shape != (n, offset_groups * taps * spatial) + out:
            raise ShapeError(
                f"{self.debug_name}: offset {offset} must be "
                f"{[n, offset_groups * taps * spatial, *out]} (N, offset_group·taps·{spatial}, "
                f"output spatial dims)."
            )
        if mask is not None and mask.shape != (n, offset_groups * taps) + out:
            raise ShapeError(f"{self.debug_name}: mask {mask} must be "
                             f"{[n, offset_groups * taps, *out]}.")
        if b is not None and b.shape != (w.shape[0],):
            raise ShapeError(f"{self.debug_name}: bias {b} must be [{w.shape[0]}].")
        dtype = x.dtype.torch
        # Regular position of tap t at output point o along each axis: o·s - pad + t·d.
        tap_grid = torch.meshgrid(*[torch.arange(k) for k in kernel], indexing="ij")
        out_grid = torch.meshgrid(*[torch.arange(o) for o in out], indexing="ij")
        base = [
            (tap_grid[i].reshape((taps,) + (1,) * spatial) * dilations[i]
             + out_grid[i].unsqueeze(0) * strides[i] - pads[i]).to(dtype)
            for i in range(spatial)]
        # Tap positions are sampled in float64: in float32 the normalise / unnormalise round
        # trip of the grid sampler moves a position like -1 by an ulp, and a point that lies
        # wholly in the zero padding picks up a 1e-7 share of its neighbour.
        self._base = torch.stack(base, 1).double()  # [taps, spatial, *out]
        self._sizes = torch.tensor(x.shape[2:], dtype=torch.float64).reshape(
            (1, spatial) + (1,) * spatial)
        self._out, self._taps, self._spatial = out, taps, spatial

    def sample_grid(self, offset: torch.Tensor) -> torch.Tensor:
        """Grid-sampler grid [N·offset_group, taps·o1, o2, ..., spatial] of the taps' positions."""
        n = offset.shape[0]
        og, sp = self.attrs.offset_group, self._spatial
        pos = self._base + offset.double().reshape((n * og, self._taps, sp) + self._out)
        # align_corners=False: pixel p sits at normalised (2p + 1) / size - 1.
        norm = (2 * pos + 1) / self._sizes - 1
        grid = norm.movedim(2, -1).flip(-1)  # torch wants (x, y[, z]), fastest axis first
        return grid.reshape((n * og, self._taps * self._out[0]) + self._out[1:] + (sp,))

    def samples(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """X at every tap position: [N, C, taps, points] (before the mask)."""
        n, c = x.shape[:2]
        og = self.attrs.offset_group
        xg = x.reshape((n * og, c // og) + tuple(x.shape[2:]))
        values = torch.grid_sampler(xg.double(), grid, 0, 0, False).to(x.dtype)
        return values.reshape(n, c, self._taps, -1)

    def kernel(self, x, w, offset, b=None, mask=None):
        n = x.shape[0]
        groups = self.attrs.group
        cols = self.samples(x, self.sample_grid(offset))
        if mask is not None:
            cols = self.masked(cols, mask)
        cols = cols.reshape(n, groups, -1, cols.shape[-1])
        weights = w.reshape(groups, w.shape[0] // groups, -1)
        y = torch.einsum("gok,ngkl->ngol", weights, cols).reshape((n, w.shape[0]) + self._out)
        if b is not None:
            y = y + b.reshape((1, -1) + (1,) * self._spatial)
        return y

    def masked(self, cols: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, c = cols.shape[:2]
        og = self.attrs.offset_group
        view = mask.reshape(n, og, 1, self._taps, -1)
        return (cols.reshape(n, og, c // og, self._taps, -1) * view).reshape(cols.shape)

    def grad(self, g):
        wrt = wanted_grads(g, (0, 1, 2, 3, 4))
        if wrt:
            mask = g.input(4) if g.has_input(4) else None
            add_multi_grad_op(g, "DeformConvGrad", g.output_grad(0), g.input(0), g.input(1),
                              g.input(2), mask, wrt=wrt, **dataclasses.asdict(self.attrs))

    def cost(self) -> tuple[int, int]:
        _, moved = super().cost()
        w = self.inputs[1].info
        return 2 * self.outputs[0].info.nelms * (w.nelms // w.shape[0]), moved


@register_op("DeformConvGrad", versions=1, domain=AI_GRAPHCORE)
class DeformConvGrad(DeformConv):
    """dX, dW, d offset, dB, d mask of DeformConv (those in ``wrt``) from dY, X, W, offset and
    mask."""

    @dataclass(frozen=True)
    class Attrs(DeformConv.Attrs):
        wrt: tuple[int, ...] = (0, 1, 2, 3, 4)

    def infer(self, dy, x, w, offset, mask=None):
        self.setup(x, w, offset, None, mask)
        infos = {0: x, 1: w, 2: offset, 3: TensorInfo(x.dtype, (w.shape[0],)), 4: mask}
        return [infos[i] for i in self.attrs.wrt]

    def kernel(self, dy, x, w, offset, mask=None):
        wrt = self.attrs.wrt
        n, c = x.shape[:2]
        groups, og = self.attrs.group, self.attrs.offset_group
        grid = self.sample_grid(offset)
        raw = self.samples(x, grid)
        cols = raw if mask is None else self.masked(raw, mask)
        dy_flat = dy.reshape(n, groups, dy.shape[1] // groups, -1)
        weights = w.reshape(groups, w.shape[0] // groups, -1)
        grads = {}
        if 1 in wrt:
            grads[1] = torch.einsum("ngol,ngkl->gok", dy_flat,
                                    cols.reshape(n, groups, -1, cols.shape[-1])).reshape(w.shape)
        if 3 in wrt:
            grads[3] = dy.sum((0,) + tuple(range(2, dy.dim())))
        dcols = torch.einsum("gok,ngol->ngkl", weights, dy_flat).reshape(raw.shape)
        if 4 in wrt:
            per_group = (dcols * raw).reshape(n, og, c // og, self._taps, -1).sum(2)
            grads[4] = per_group.reshape(mask.shape)
        if 0 in wrt or 2 in wrt:
            dsamples = dcols if mask is None else self.masked(dcols, mask)
            xg = x.reshape((n * og, c // og) + tuple(x.shape[2:]))
            dvalues = dsamples.reshape((n * og, c // og, self._taps * self._out[0])
                                       + self._out[1:])
            dx, dgrid = _grid_backward(self._spatial)(
                dvalues.double(), xg.double(), grid, 0, 0, False, [0 in wrt, 2 in wrt])
            if 0 in wrt:
                grads[0] = dx.to(x.dtype).reshape(x.shape)
            if 2 in wrt:
                sp = self._spatial
                dnorm = dgrid.flip(-1).reshape((n * og, self._taps) + self._out + (sp,))
                dpos = dnorm.movedim(-1, 2) * (2 / self._sizes)
                grads[2] = dpos.to(offset.dtype).reshape(offset.shape)
        return pick_grads(grads, wrt)

    grad = Op.grad


def _static_value(op: Op, index: int, what: str) -> np.ndarray | None:
    """Input ``index`` of an op whose output shape depends on it (None if absent)."""
    if index >= len(op.inputs) or op.inputs[index] is None:
        return None
    return _static_only(op, index, what)


# Pillow's conversion mode and channel order of each ImageDecoder pixel_format.
_PIXEL_FORMATS = {"RGB": ("RGB", False), "BGR": ("RGB", True), "Grayscale": ("L", False)}


@register_op("ImageDecoder", versions=20)
class ImageDecoder(Op):
    """Decode an encoded image (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000 ...) into
    [H, W, 3] RGB / BGR or [H, W, 1] grayscale uint8 pixels.

    The image size is only known after decoding, so the encoded bytes must be a constant: the
    image is decoded (with Pillow) at compile time and the op folds.
    """

    const_inputs = (0,)

    @dataclass(frozen=True)
    class Attrs:
        pixel_format: str = "RGB"

    def infer(self, encoded):
        check_dtypes(self, encoded)
        if self.attrs.pixel_format not in _PIXEL_FORMATS:
            raise ShapeError(f"{self.debug_name}: pixel_format '{self.attrs.pixel_format}' is not "
                             f"one of {list(_PIXEL_FORMATS)}.")
        if encoded.rank != 1:
            raise ShapeError(f"{self.debug_name}: encoded_stream {encoded} must be 1-D bytes.")
        # Imported on first use: only this op needs Pillow, and only at compile time.
        from PIL import Image, UnidentifiedImageError

        data = np.asarray(_static_value(self, 0, "encoded_stream"), dtype=np.uint8).tobytes()
        mode, reverse = _PIXEL_FORMATS[self.attrs.pixel_format]
        try:
            with Image.open(io.BytesIO(data)) as image:
                pixels = np.asarray(image.convert(mode), dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as exc:
            raise ShapeError(f"{self.debug_name}: encoded_stream ({len(data)} bytes) is not an "
                             f"image Pillow can decode: {exc}.") from None
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        if reverse:
            pixels = pixels[:, :, ::-1]
        self._value = torch.from_numpy(pixels.copy())
        return TensorInfo(DataType.UINT8, tuple(self._value.shape))

    def kernel(self, encoded):
        return self._value.clone()
