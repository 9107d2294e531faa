"""SessionOptions.opxModifyChecking / opxAliasChecking (spec §2.4; transforms/numerics_options.py
KernelChecks, device/plan.py modify_checked / alias_checked).

Misbehaving test ops (an undeclared in-place write, an undeclared aliasing output) must be
caught with the op and input named; the same ops declaring what they do, and ordinary models
trained with both checks on, run clean and give the results of a run without the checks.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import popart_backend as popart
from popart_backend.ir.op import Op
from popart_backend.ops.registry import register_op
from tests.session import replication_models as rm

DOMAIN = "test.debug_checks"


class _SameShape(Op):
    def infer(self, x):
        return x


@register_op("ScribblesOnInput", versions=1, domain=DOMAIN)
class ScribblesOnInput(_SameShape):
    """Wrong: writes its input in place without declaring modifies_inputs."""

    def kernel(self, x):
        x.add_(1.0)
        return x * 2


@register_op("DeclaredInplace", versions=1, domain=DOMAIN)
class DeclaredInplace(_SameShape):
    """Right: the same write, declared (so it returns the modified input)."""

    modifies_inputs = (0,)

    def kernel(self, x):
        return x.add_(1.0)


@register_op("LeaksView", versions=1, domain=DOMAIN)
class LeaksView(_SameShape):
    """Wrong: returns a view of its input without declaring aliases_inputs."""

    def kernel(self, x):
        return x.view(x.shape)


@register_op("DeclaredView", versions=1, domain=DOMAIN)
class DeclaredView(_SameShape):
    aliases_inputs = True

    def kernel(self, x):
        return x.view(x.shape)


@register_op("KeepsNaN", versions=1, domain=DOMAIN)
class KeepsNaN(_SameShape):
    """Right: reads an input holding NaN (NaN != NaN must not count as a change)."""

    def kernel(self, x):
        return x + 1


def run_op(op_type: str, x: np.ndarray, modify: bool = False, alias: bool = False):
    """y = Relu(op(Relu(x))): the op reads an activation, as in-place kernels would."""
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node(op_type, ["b"], ["c"], domain=DOMAIN, name="probe"),
             helper.make_node("Neg", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "checks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(DOMAIN, 1)])
    options = popart.SessionOptions()
    options.opxModifyChecking = modify
    options.opxAliasChecking = alias
    session = popart.InferenceSession(model, popart.DataFlow(1, ["y", "b"]),
                                      popart.DeviceManager().createCpuDevice(),
                                      userOptions=options)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x}, anchors))
    return anchors


X = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_undeclared_modification_is_caught():
    # Without the check the write goes unnoticed (the anchored input 'b' is corrupted).
    anchors = run_op("ScribblesOnInput", X)
    np.testing.assert_array_equal(anchors["b"], -X + 1)
    with pytest.raises(popart.popart_internal_exception,
                       match=r"ScribblesOnInput 'probe'.*modified input 0 'b' "
                             r"f32\[2,3\].*modifies_inputs = \(\).*opxModifyChecking"):
        run_op("ScribblesOnInput", X, modify=True)


def test_undeclared_alias_is_caught():
    np.testing.assert_array_equal(run_op("LeaksView", X)["y"], X)
    with pytest.raises(popart.popart_internal_exception,
                       match=r"LeaksView 'probe'.*output 0 'c'.*shares storage with input 0 "
                             r"'b'.*opxAliasChecking"):
        run_op("LeaksView", X, alias=True)


@pytest.mark.parametrize("op_type, ref", [("DeclaredInplace", -(-X + 1)),
                                          ("DeclaredView", X),
                                          ("KeepsNaN", -(-X + 1))])
def test_declared_behaviour_runs_clean(op_type, ref):
    np.testing.assert_array_equal(run_op(op_type, X, modify=True, alias=True)["y"], ref)


def test_nan_inputs_are_not_reported_as_modified():
    x = X.copy()
    x[0, 1] = np.nan
    y = run_op("KeepsNaN", x, modify=True, alias=True)["y"]
    np.testing.assert_array_equal(y, -(-x + 1))


def test_checks_are_marked_by_a_pass_only_when_asked():
    def marks(**flags):
        options = popart.SessionOptions()
        for name, value in flags.items():
            setattr(options, name, value)
        s, _ = rm.session(rm.params(), 2, 1, options)
        ops = list(s.getIr().main.ops.values())
        return ({getattr(op, "check_modify", False) for op in ops},
                {getattr(op, "check_alias", False) for op in ops})

    assert marks() == ({False}, {False})
    assert marks(opxModifyChecking=True) == ({True}, {False})
    assert marks(opxAliasChecking=True) == ({False}, {True})


@pytest.mark.parametrize("rf, af, stages", [(1, 1, False), (2, 2, False), (1, 4, True)])
def test_training_runs_clean_and_unchanged_with_both_checks(rf, af, stages):
    """Autodiff, optimizer, accumulation, replication and pipelining ops honour their
    declarations: the checks raise nothing and change no result."""
    p = rm.params(1)
    bps = 2
    mb = 2
    x = np.random.default_rng(3).standard_normal(
        (bps, af, rf, mb, rm.D_IN)).astype(np.float32).reshape(
        [bps] + ([af] if af > 1 else []) + ([rf] if rf > 1 else []) + [mb, rm.D_IN])
    plain_opts = rm.options(rf, af, stages)
    checked_opts = rm.options(rf, af, stages)
    checked_opts.opxModifyChecking = True
    checked_opts.opxAliasChecking = True
    plain, plain_out, _ = rm.train(p, x, mb, bps, plain_opts, stages)
    checked, checked_out, _ = rm.train(p, x, mb, bps, checked_opts, stages)
    for key in plain:
        np.testing.assert_array_equal(checked[key], plain[key], err_msg=key)
    for key in plain_out:
        np.testing.assert_array_equal(checked_out[key], plain_out[key], err_msg=key)
