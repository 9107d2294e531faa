"""Optimizer update ops (ai.graphcore): one in-place op per weight and optimizer family.

``popart_backend.optimizers`` adds these ops to the IR. Each update op reads

    (weight, gradient, *state, clip factor | absent, *non-const hyper-parameters)

and writes the weight and its state variables in place (``modifies_inputs``); its one output is
the updated weight (``UpdatedVar___<w>``), which aliases the weight's storage.

Hyper-parameters are op attributes when const. A non-const one is a scalar input named in
``attrs.dynamic`` (in input order), read each run, so ``updateOptimizerFromHost`` changes it
without recompiling. The gradient is first multiplied by ``grad_scale`` (1/lossScaling when that
is const, and the Mean-reduction divisors), by the clip-norm factor when present, and divided by
the ``loss_scaling`` input when loss scaling is not const.

The formulas (written out in each class) follow torch.optim, which the tests compare against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..dtypes import DataType
from ..errors import ShapeError, popart_exception
from ..ir.op import Op
from ..ir.tensor import TensorInfo
from .registry import AI_GRAPHCORE, register_op
from .rounding import rounding_generator, split_seed, stochastic_round
from .state_journal import JournaledWrites, StateJournal


class OptimizerUpdate(JournaledWrites, Op):
    """Base of the update ops: input layout, hyper-parameter lookup, gradient scaling.

    In a run's journal (ops/state_journal.py) the SGD and Adam paths write the first new value
    of each state tensor out of place (``_first``), the others save their state before writing.
    """

    # Names of the state inputs, after (weight, gradient); any may be absent.
    STATE: ClassVar[tuple[str, ...]] = ()
    # Attrs fields that may instead come from a scalar input (listed in ``attrs.dynamic``).
    HYPER: ClassVar[tuple[str, ...]] = ()
    MODES: ClassVar[tuple[str, ...]] = ()
    # Updates have side effects: never evaluate them at compile time.
    foldable = False
    # enableStochasticRounding: a float16 weight (and float16 state) is updated in float32 and
    # rounded to float16 stochastically (kernel, ops/rounding.py).
    supports_stochastic_rounding = True

    def __init__(self, attrs=None, settings=None, version=None):
        super().__init__(attrs, settings, version)
        self.modifies_inputs = (0, *range(2, 2 + len(self.STATE)))
        self._const = {name: float(getattr(self.attrs, name)) for name in self.HYPER}
        self._divide_loss_scaling = "loss_scaling" in self.attrs.dynamic
        self._replicas = 1  # local replicas (bind_program)

    def bind_program(self, program) -> None:
        # Stochastic rounding draws the same on every local replica (rounding_generator).
        self._replicas = program.replication_factor

    def extra_inputs(self) -> int:
        """Inputs after the dynamic hyper-parameters (the whole-weight Lamb norms of a
        sharded update); passed to ``update`` after the state."""
        return 0

    def infer(self, weight, grad, *rest):
        if self.settings.stochastic_rounding:
            rest = rest[:-1]  # the random seed (ops/rounding.py)
        if self.settings.skip_on_overflow:
            rest = rest[:-1]  # the gradients-finite flag (automatic loss scaling)
        unknown = [d for d in self.attrs.dynamic if d not in self.HYPER]
        if unknown:
            raise popart_exception(
                f"{self.debug_name}: dynamic hyper-parameter(s) {unknown} unknown; this op has "
                f"{list(self.HYPER)}."
            )
        modes = [getattr(self.attrs, "mode", None)] if self.MODES else []
        for mode in modes:
            if mode not in self.MODES:
                raise popart_exception(
                    f"{self.debug_name}: mode '{mode}' unknown; use one of {list(self.MODES)}."
                )
        n = len(self.STATE)
        extra = self.extra_inputs()
        if len(rest) != n + 1 + len(self.attrs.dynamic) + extra:
            raise ShapeError(
                f"{self.debug_name}: expects (weight, gradient, {', '.join(self.STATE)}, "
                f"clip factor, {', '.join(self.attrs.dynamic)}"
                f"{', whole-weight norms' if extra else ''}) = "
                f"{3 + n + len(self.attrs.dynamic) + extra} inputs (absent ones as ''), "
                f"got {2 + len(rest)}."
            )
        if grad.shape != weight.shape:
            raise ShapeError(
                f"{self.debug_name}: gradient {grad} does not match weight {weight}."
            )
        for name, info in zip(self.STATE, rest[:n]):
            if info is not None and info.shape != weight.shape and name != "step":
                raise ShapeError(
                    f"{self.debug_name}: state '{name}' is {info}, the weight is {weight}."
                )
        for name, info in zip(("clip factor", *self.attrs.dynamic), rest[n : n + 1 + len(
                self.attrs.dynamic)]):
            if info is not None and info.nelms != 1:
                raise ShapeError(f"{self.debug_name}: '{name}' must be a scalar, got {info}.")
        return weight

    def kernel(self, weight, grad, *rest):
        return self.journaled_kernel(None, weight, grad, *rest)

    def journaled_kernel(self, journal: StateJournal | None, weight, grad, *rest):
        rest, seed = split_seed(self, rest)
        if self.settings.skip_on_overflow:
            rest, finite = rest[:-1], rest[-1]
            if not bool(finite):
                return weight  # a gradient overflowed: no update (loss scaling lowers)
        g, h = self._scaled_gradient(grad, rest)
        n = len(self.STATE)
        state, extra = list(rest[:n]), rest[n + 1 + len(self.attrs.dynamic) :]
        if journal is not None and journal.is_open and (seed is not None
                                                        or not self._journals_itself(h)):
            journal.save_all((weight, *state))
            journal = None
        if seed is None:
            self.update(weight, g, h, *state, *extra, journal=journal)
            return weight
        # Stochastic rounding: the update in float32, the float16 results rounded at random.
        halves = [t for t in (weight, *state) if t is not None and t.dtype == torch.float16]
        wide = {id(t): t.float() for t in halves}
        self.update(wide.get(id(weight), weight), g, h,
                    *[wide.get(id(t), t) if t is not None else None for t in state], *extra)
        generator = rounding_generator(self, seed, self._replicas)
        for tensor in halves:
            tensor.copy_(stochastic_round(wide[id(tensor)], generator))
        return weight

    def _scaled_gradient(self, grad, rest):
        """The un-loss-scaled, clipped gradient in the state's dtype, and the hyper-parameters."""
        h, factor = self._hyper_and_factor(rest)
        # Compute in the state's dtype (e.g. f32 moments of an f16 weight).
        state_dtype = next(
            (s.dtype for name, s in zip(self.STATE, rest) if s is not None and name != "step"),
            grad.dtype,
        )
        g = grad.to(state_dtype)
        if factor != 1.0:
            g = g * factor  # out of place: the gradient tensor may be read elsewhere
        return g, h

    def _hyper_and_factor(self, rest):
        """The hyper-parameters of this run and the factor the raw gradient is multiplied by
        (grad_scale, the clip factor, 1/lossScaling when that is an input)."""
        n = len(self.STATE)
        clip = rest[n]
        h = self._const
        if self.attrs.dynamic:
            h = dict(h)
            dynamic = rest[n + 1 : n + 1 + len(self.attrs.dynamic)]
            for name, value in zip(self.attrs.dynamic, dynamic):
                h[name] = float(value)
        factor = self.attrs.grad_scale
        if clip is not None:
            factor *= float(clip)
        if self._divide_loss_scaling:
            factor /= h["loss_scaling"]
        return h, factor

    def _journals_itself(self, h) -> bool:
        """Whether ``update`` with these hyper-parameters writes through the journal."""
        return False

    def update(self, weight, grad, h, *state, journal=None) -> None:
        raise NotImplementedError


def _advance_step(step, journal) -> bool:
    """Count one more update on the step counter (journalled; None: no counter). True when
    this is the first update, which takes the gradient as the velocity."""
    if step is None:
        return False
    first = float(step) == 0.0
    if journal is not None:
        journal.save(step)
    step.add_(1.0)
    return first


def _first(journal: StateJournal | None, x: torch.Tensor) -> torch.Tensor:
    """The tensor to write x's next value into (x itself outside a journal)."""
    return x if journal is None else journal.spare_for(x)


def _settle(journal: StateJournal | None, x: torch.Tensor, out: torch.Tensor) -> None:
    if journal is not None:
        journal.settle(x, out)


# --- SGD --------------------------------------------------------------------------------------


@register_op("SGDUpdate", versions=1, domain=AI_GRAPHCORE)
class SGDUpdate(OptimizerUpdate):
    """SGD with momentum, dampening, weight decay, velocity scaling and Nesterov (torch.optim.SGD).

    With d = g + wd·w (g un-loss-scaled, clipped), PopART's velocity form is

        v' = mm·v + (1 − dm)·d,     w' = w − lr·v'         (Nesterov: w' = w − lr·(d + mm·v'))

    The velocity variable stores vs·v (velocity scaling keeps small velocities representable in
    fp16) and the weight step is (lr/vs)·(vs·v'), so vs does not change the trajectory.
    Two points follow torch rather than PopART: the first momentum step sets v' = d without
    dampening (needs the ``step`` counter, present when dampening may be non-zero), and with
    momentum 0 dampening is ignored (w' = w − lr·d).
    """

    STATE = ("velocity", "step")
    HYPER = ("lr", "weight_decay", "momentum", "dampening", "velocity_scaling", "nesterov",
             "loss_scaling")

    @dataclass(frozen=True)
    class Attrs:
        lr: float = 0.1
        weight_decay: float = 0.0
        momentum: float = 0.0
        dampening: float = 0.0
        velocity_scaling: float = 1.0
        nesterov: float = 0.0
        loss_scaling: float = 1.0
        grad_scale: float = 1.0
        dynamic: tuple[str, ...] = ()

    def _journals_itself(self, h) -> bool:
        return True

    def update(self, w, g, h, velocity, step, *, journal=None):
        # Each first write goes to _first(...) (w or v themselves outside a journal), reading
        # the old value: the same kernels as in place, so the same numbers.
        wd, lr = h["weight_decay"], h["lr"]
        d = g.add(w.to(g.dtype), alpha=wd) if wd != 0.0 else g
        if velocity is None:
            out = _first(journal, w)
            torch.add(w, d.to(w.dtype), alpha=-lr, out=out)
            _settle(journal, w, out)
            return
        mm, vs = h["momentum"], h["velocity_scaling"]
        first = _advance_step(step, journal)
        scale = vs * (1.0 - h["dampening"])
        out = _first(journal, velocity)
        if mm == 0.0 or first:
            out.copy_(d).mul_(vs)
        elif scale == 1.0:
            # v' = d + mm·v in one pass over the velocity (writing its own input elementwise).
            torch.add(d, velocity, alpha=mm, out=out)
        else:
            torch.mul(velocity, mm, out=out).add_(d, alpha=scale)
        _settle(journal, velocity, out)
        out = _first(journal, w)
        if h["nesterov"] != 0.0:
            torch.add(w, d.add(velocity, alpha=mm / vs).to(w.dtype), alpha=-lr, out=out)
        else:
            torch.add(w, velocity.to(w.dtype), alpha=-lr / vs, out=out)
        _settle(journal, w, out)


# --- Adam family ------------------------------------------------------------------------------

ADAM_MODES = ("Adam", "AdamNoBias", "AdaMax", "Lamb", "LambNoBias")
WEIGHT_DECAY_MODES = ("Decay", "L2Regularization")


@register_op("AdamUpdate", versions=1, domain=AI_GRAPHCORE)
class AdamUpdate(OptimizerUpdate):
    """Adam, AdamW, AdamNoBias, AdaMax, Lamb, LambNoBias (torch.optim.Adam/AdamW/Adamax).

    With g un-loss-scaled and clipped (L2Regularization: g += wd·w), t the step (1 first):

        m' = β1·m + (1 − β1)·g
        v' = β2·v + (1 − β2)·g²            AdaMax: v' = max(β2·v, |g| + ε)
        m̂ = m'/(1 − β1ᵗ), v̂ = v'/(1 − β2ᵗ)  (no correction in the NoBias modes; AdaMax corrects m)
        u = m̂/(√v̂ + ε)                     AdaMax: u = m̂/v'
        Decay (decoupled, AdamW): u += wd·w
        Lamb: r = min(‖w‖, maxWeightNorm)/‖u‖ (1 when either norm is 0), else r = 1
        w' = w − lr·r·u

    ε is added to √v̂ as torch does. ``scaled_state`` keeps m and v multiplied by lossScaling and
    lossScaling² (PopART's scaled_optimizer_state, for fp16 state); the step is unchanged.

    ``sharded_norms`` (Lamb on replicated shards, transforms/rts.py): w, g, m and v are shards, so
    ‖w‖ and ‖u‖ come from one more input, (Σw², Σu²) of the whole weight, made by
    ``LambSquareNorms`` on each shard and summed over the sharding domain.
    """

    STATE = ("accl1", "accl2", "step")
    HYPER = ("lr", "weight_decay", "beta1", "beta2", "eps", "max_weight_norm", "loss_scaling")
    MODES = ADAM_MODES

    @dataclass(frozen=True)
    class Attrs:
        lr: float = 0.1
        weight_decay: float = 0.0
        beta1: float = 0.9
        beta2: float = 0.999
        eps: float = 1e-6
        max_weight_norm: float = 10.0
        loss_scaling: float = 1.0
        grad_scale: float = 1.0
        mode: str = "Adam"
        weight_decay_mode: str = "Decay"
        scaled_state: bool = False
        dynamic: tuple[str, ...] = ()
        sharded_norms: bool = False

    def extra_inputs(self) -> int:
        return 1 if self.attrs.sharded_norms else 0

    def infer(self, weight, grad, *rest):
        if self.attrs.sharded_norms and self.attrs.mode not in ("Lamb", "LambNoBias"):
            raise popart_exception(
                f"{self.debug_name}: sharded_norms is for the Lamb modes, not {self.attrs.mode}."
            )
        if self.extra_inputs() and rest and rest[-1] is not None and rest[-1].nelms != 2:
            raise ShapeError(f"{self.debug_name}: the whole-weight norms input must hold "
                             f"(sum w^2, sum u^2), got {rest[-1]}.")
        return super().infer(weight, grad, *rest)

    def _journals_itself(self, h) -> bool:
        return self._fast_path(h)

    def _fast_path(self, h) -> bool:
        scaled = self.attrs.scaled_state and h["loss_scaling"] != 1.0
        return self.attrs.mode in ("Adam", "AdamNoBias") and not scaled

    def update(self, w, g, h, m, v, step, square_norms=None, *, journal=None):
        mode, lr, wd = self.attrs.mode, h["lr"], h["weight_decay"]
        b1, b2, eps = h["beta1"], h["beta2"], h["eps"]
        decoupled = self.attrs.weight_decay_mode == "Decay"
        wf = w.to(m.dtype)
        if wd != 0.0 and not decoupled:
            g = g.add(wf, alpha=wd)
        if journal is not None:
            journal.save(step)
        step.add_(1.0)
        t = float(step)
        s = h["loss_scaling"] if self.attrs.scaled_state else 1.0
        bias = mode in ("Adam", "AdaMax", "Lamb")
        c1 = 1.0 - b1**t if bias else 1.0
        if self._fast_path(h):
            # torch.optim.Adam's own sequence: one pass per state, the step as one addcdiv.
            # First writes go to _first(...) out of place (same kernels, same numbers).
            out = _first(journal, m)
            torch.lerp(m, g, 1.0 - b1, out=out)
            _settle(journal, m, out)
            out = _first(journal, v)
            torch.mul(v, b2, out=out).addcmul_(g, g, value=1.0 - b2)
            _settle(journal, v, out)
            # m̂/(√v̂ + ε) = (√c2/c1)·m/(√v + ε√c2): the bias corrections become scalars.
            root_c2 = math.sqrt(1.0 - b2**t) if bias else 1.0
            denom = v.sqrt().add_(eps * root_c2)
            step_size = lr * root_c2 / c1
            out = _first(journal, w)
            if wd != 0.0 and decoupled:
                torch.mul(w, 1.0 - lr * wd, out=out)
                _settle(journal, w, out)
                out = w
            if w.dtype == m.dtype:
                torch.addcdiv(w, m, denom, value=-step_size, out=out)
            else:
                torch.add(w, (m / denom).to(w.dtype), alpha=-step_size, out=out)
            _settle(journal, w, out)
            return
        m.mul_(b1).add_(g, alpha=(1.0 - b1) * s)
        if mode == "AdaMax":
            v.mul_(b2)
            torch.maximum(v, g.abs().mul_(s).add_(eps * s), out=v)
            denom = v.mul(c1)
        else:
            v.mul_(b2).addcmul_(g, g, value=(1.0 - b2) * s * s)
            c2 = 1.0 - b2**t if bias else 1.0
            denom = v.sqrt().div_(math.sqrt(c2) * s).add_(eps).mul_(c1 * s)
        if mode in ("Lamb", "LambNoBias"):
            u = m.div(denom)
            if wd != 0.0 and decoupled:
                u.add_(wf, alpha=wd)
            if self.attrs.sharded_norms:
                # Passed in as a probe: LambSquareNorms runs this code on copies of the state.
                if square_norms is None:
                    return wf, u
                w_norm, u_norm = (math.sqrt(float(x)) for x in square_norms)
            else:
                w_norm = float(torch.linalg.vector_norm(wf))
                u_norm = float(torch.linalg.vector_norm(u))
            r1 = min(w_norm, h["max_weight_norm"])
            r2 = u_norm
            ratio = r1 / r2 if r1 > 0.0 and r2 > 0.0 else 1.0
            w.add_(u.to(w.dtype), alpha=-lr * ratio)
            return
        if wd != 0.0 and decoupled:
            w.mul_(1.0 - lr * wd)
        w.add_(m.div(denom).to(w.dtype), alpha=-lr)


@register_op("LambSquareNorms", versions=1, domain=AI_GRAPHCORE)
class LambSquareNorms(AdamUpdate):
    """(Σw², Σu²) of one replica's shard, u the Lamb update direction (``AdamUpdate``).

    Reads the inputs of the sharded ``AdamUpdate`` it serves (same attrs, without the norms
    input) and writes nothing: it steps copies of m, v and the step to find u. Pads of a shard
    are zero in w, g, m and v, hence in u, so the sums over the shards of a domain are the sums
    of the whole weight (transforms/rts.py all-reduces them).
    """

    def __init__(self, attrs=None, settings=None, version=None):
        super().__init__(attrs, settings, version)
        self.modifies_inputs = ()

    def extra_inputs(self) -> int:
        return 0

    def infer(self, weight, grad, *rest):
        if self.attrs.mode not in ("Lamb", "LambNoBias") or not self.attrs.sharded_norms:
            raise popart_exception(
                f"{self.debug_name}: computes the norms of a sharded Lamb update; needs mode "
                f"Lamb or LambNoBias and sharded_norms, got {self.attrs.mode}, "
                f"sharded_norms={self.attrs.sharded_norms}."
            )
        super().infer(weight, grad, *rest)
        return TensorInfo(DataType.FLOAT, (2,))

    def journaled_kernel(self, journal, *inputs):
        return self.kernel(*inputs)  # writes nothing

    def kernel(self, weight, grad, *rest):
        g, h = self._scaled_gradient(grad, rest)
        state = [s.clone() if s is not None else None for s in rest[: len(self.STATE)]]
        wf, u = self.update(weight, g, h, *state)
        return torch.stack([wf.float().square().sum(), u.float().square().sum()])


# --- Adaptive family --------------------------------------------------------------------------

ADAPTIVE_MODES = ("AdaGrad", "RMSProp", "CenteredRMSProp", "AdaDelta")


@register_op("AdaptiveUpdate", versions=1, domain=AI_GRAPHCORE)
class AdaptiveUpdate(OptimizerUpdate):
    """AdaGrad, RMSProp, centered RMSProp, AdaDelta (torch.optim.Adagrad/RMSprop/Adadelta).

    With g un-loss-scaled and clipped (L2Regularization: g += wd·w), α = alpha:

        AdaGrad:   a1' = a1 + g²;                      u = g/(√a1' + ε)
        RMSProp:   a1' = α·a1 + (1 − α)·g²;            u = g/(√a1' + ε)
        Centered:  a2' = α·a2 + (1 − α)·g;             u = g/(√(a1' − a2'²) + ε)
        AdaDelta:  a1' as RMSProp; u = √(a2 + ε)/√(a1' + ε)·g;  a2' = α·a2 + (1 − α)·u²
        momentum:  a3' = mm·a3 + u; u = a3'            (a3 present when momentum may be non-zero)
        Decay (decoupled): w ← w·(1 − lr·wd)
        w' = w − lr·u

    ``tf_variant`` (TensorFlow's RMSProp) puts ε inside the square root, √(a1' + ε), and starts
    a1 at 1 (the optimizer initialises the state).
    """

    STATE = ("accl1", "accl2", "accl3")
    HYPER = ("lr", "weight_decay", "alpha", "momentum", "eps", "loss_scaling")
    MODES = ADAPTIVE_MODES

    @dataclass(frozen=True)
    class Attrs:
        lr: float = 0.01
        weight_decay: float = 0.0
        alpha: float = 0.99
        momentum: float = 0.0
        eps: float = 1e-6
        loss_scaling: float = 1.0
        grad_scale: float = 1.0
        mode: str = "RMSProp"
        weight_decay_mode: str = "Decay"
        tf_variant: bool = False
        dynamic: tuple[str, ...] = ()

    def update(self, w, g, h, a1, a2, a3, *, journal=None):
        mode, lr, wd = self.attrs.mode, h["lr"], h["weight_decay"]
        alpha, eps = h["alpha"], h["eps"]
        decoupled = self.attrs.weight_decay_mode == "Decay"
        tf = self.attrs.tf_variant
        if wd != 0.0 and not decoupled:
            g = g.add(w.to(g.dtype), alpha=wd)
        if mode == "AdaDelta":
            a1.mul_(alpha).addcmul_(g, g, value=1.0 - alpha)
            std = a1.add(eps).sqrt_()
            u = a2.add(eps).sqrt_().div_(std).mul_(g)
            a2.mul_(alpha).addcmul_(u, u, value=1.0 - alpha)
        else:
            if mode == "AdaGrad":
                a1.addcmul_(g, g)
            else:
                a1.mul_(alpha).addcmul_(g, g, value=1.0 - alpha)
            avg = a1
            if mode == "CenteredRMSProp":
                a2.mul_(alpha).add_(g, alpha=1.0 - alpha)
                avg = a1.addcmul(a2, a2, value=-1.0)
            denom = avg.add(eps).sqrt_() if tf else avg.sqrt().add_(eps)
            u = g.div(denom)
        if a3 is not None:
            a3.mul_(h["momentum"]).add_(u)
            u = a3
        if wd != 0.0 and decoupled:
            w.mul_(1.0 - lr * wd)
        w.add_(u.to(w.dtype), alpha=-lr)


# --- gradient clipping ------------------------------------------------------------------------


@register_op("GlobalNormClipFactor", versions=1, domain=AI_GRAPHCORE)
class GlobalNormClipFactor(Op):
    """f = min(1, maxNorm/(‖(g_1, …, g_n)‖ + 1e-6)) over the un-loss-scaled gradients.

    The norm is the 2-norm of all listed gradients together (torch.nn.utils.clip_grad_norm_,
    including its 1e-6); each gradient is multiplied by ``grad_scale`` and, when
    ``divide_loss_scaling``, divided by the last input (the non-const lossScaling) first.
    The last ``square_sums`` gradient inputs (before the lossScaling) are instead scalar sums of
    squares of gradients (``GradientSquareSum`` of replicated shards, all-reduced; rts.py).
    """

    @dataclass(frozen=True)
    class Attrs:
        max_norm: float = 1.0
        grad_scale: float = 1.0
        divide_loss_scaling: bool = False
        square_sums: int = 0

    def infer(self, *grads):
        if not grads:
            raise ShapeError(f"{self.debug_name}: needs at least one gradient.")
        return TensorInfo(DataType.FLOAT, ())

    def kernel(self, *grads):
        scale = self.attrs.grad_scale
        if self.attrs.divide_loss_scaling:
            *grads, loss_scaling = grads
            scale /= float(loss_scaling)
        split = len(grads) - self.attrs.square_sums
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads[:split]]
        # Sums of squares of shards enter as the norms they are the squares of.
        norms += [g.reshape(()).float().sqrt() for g in grads[split:]]
        total = torch.linalg.vector_norm(torch.stack(norms)) * scale
        return torch.clamp(self.attrs.max_norm / (total + 1e-6), max=1.0)


@register_op("GradientSquareSum", versions=1, domain=AI_GRAPHCORE)
class GradientSquareSum(Op):
    """Σg² (f32 scalar) over the listed gradients: a replica's part of a global gradient norm
    when the gradients are replicated shards (their zero pads add nothing)."""

    def infer(self, *grads):
        if not grads:
            raise ShapeError(f"{self.debug_name}: needs at least one gradient.")
        return TensorInfo(DataType.FLOAT, ())

    def kernel(self, *grads):
        return torch.stack([g.float().square().sum() for g in grads]).sum()
