"""Op registry: registration rules and version resolution (spec §6.4, F82)."""

import collections

import onnx.defs
import pytest

from popart_backend.errors import UnsupportedOpError, popart_exception
from popart_backend.ir.op import Op
from popart_backend.ops import registry
from popart_backend.ops.registry import all_registered, register_op, resolve

MAX_OPSET = 28  # the installed onnx package's opset (DESIGN.md said 6-21; widened for issue #7)


def _onnx_versions() -> dict[str, list[int]]:
    versions = collections.defaultdict(set)
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "" and schema.since_version <= MAX_OPSET and not schema.deprecated:
            versions[schema.name].add(schema.since_version)
    return {k: sorted(v) for k, v in versions.items()}


def test_every_onnx_version_up_to_max_opset_is_registered():
    """Each registered ai.onnx op has every since-version from its first registered one to MAX_OPSET."""
    onnx_versions = _onnx_versions()
    missing = {}
    for (domain, op_type), table in registry._REGISTRY.items():
        if domain != registry.AI_ONNX:
            continue
        assert op_type in onnx_versions, f"{op_type} is not an ONNX op"
        wanted = [v for v in onnx_versions[op_type] if v >= min(table)]
        gaps = [v for v in wanted if v not in table]
        if gaps:
            missing[op_type] = gaps
    assert not missing, f"registered ops lacking ONNX versions <= {MAX_OPSET}: {missing}"


def test_registered_versions_are_real_onnx_versions():
    onnx_versions = _onnx_versions()
    bogus = {
        (op_type, v)
        for domain, op_type, v, _ in all_registered()
        if domain == registry.AI_ONNX and v not in onnx_versions.get(op_type, [])
    }
    # Deprecated schemas (e.g. Upsample-10, Scatter-11) are not in onnx_versions; allow them only
    # where ONNX has a (deprecated) schema of that exact version.
    deprecated = {
        (s.name, s.since_version)
        for s in onnx.defs.get_all_schemas_with_history()
        if s.domain == "" and s.deprecated
    }
    assert not (bogus - deprecated), f"not ONNX since-versions: {sorted(bogus - deprecated)}"


def test_resolution_picks_highest_version_not_above_opset():
    cls, version = resolve("Add", "", 12)
    assert version == 7 and cls.op_type == "Add"
    cls, version = resolve("Add", "ai.onnx", 21)
    assert version == 14


def test_unknown_op_lists_what_exists():
    with pytest.raises(UnsupportedOpError, match=r"Op Ad \(domain ai.onnx, opset 13\).*Add"):
        resolve("Ad", "", 13)


def test_strict_version_mismatch_and_relaxed_fallback(caplog):
    @register_op("Softsign", versions=(1,), domain="test.strict")
    class _Dummy(Op):
        pass

    # ai.onnx strictness: a version we lack at the model's opset raises with the versions we have.
    table = registry._REGISTRY[("ai.onnx", "Relu")]
    saved = dict(table)
    try:
        del table[14]
        with pytest.raises(UnsupportedOpError, match=r"Relu in ai.onnx opset 14 is version 14.*\[6, 13\]"):
            resolve("Relu", "", 14, strict=True)
        cls, version = resolve("Relu", "", 14, strict=False)
        assert version == 13
        assert "may differ" in caplog.text
    finally:
        table.clear()
        table.update(saved)
        del registry._REGISTRY[("test.strict", "Softsign")]


def test_registering_twice_raises():
    with pytest.raises(popart_exception, match="registered twice"):
        @register_op("Relu", versions=(6,))
        class _Again(Op):
            pass


def test_version_below_first_supported():
    with pytest.raises(UnsupportedOpError, match="earliest version we support"):
        resolve("Relu", "", 5)


def test_every_differentiable_onnx_op_has_a_gradient():
    """Issue #7 item 3: each registered ai.onnx (op, version) whose ONNX schema marks an input
    Differentiable defines grad() (each family's tests check it against torch.autograd or
    central differences)."""
    from popart_backend.supported_ops import is_public

    differentiable = onnx.defs.OpSchema.DifferentiationCategory.Differentiable
    missing = []
    for domain, op_type, version, cls in all_registered():
        if domain != registry.AI_ONNX or not is_public(domain, op_type, cls):
            continue
        schema = onnx.defs.get_schema(op_type, version)
        if schema.since_version != version:
            continue  # a deprecated version with no schema of its own
        inputs = [i.name for i in schema.inputs
                  if i.differentiation_category == differentiable]
        if inputs and cls.grad is Op.grad:
            missing.append(f"{op_type}-{version} ({', '.join(inputs)})")
    assert not missing, f"differentiable ops without a gradient: {missing}"
