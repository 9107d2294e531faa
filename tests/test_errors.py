"""Exception hierarchy, recovery actions and the ``popart._throw_<kind>`` hooks (spec §4.9;
F60, F61)."""

from __future__ import annotations

import pytest

import popart_backend as popart

# kind -> (class raised, its parents per §4.9)
HOOKS = {
    "popart_error": (popart.popart_exception, ()),
    "popart_internal_error": (popart.popart_internal_exception, (popart.popart_exception,)),
    "popart_runtime_error": (popart.popart_runtime_error, (popart.popart_exception,)),
    "poplibs_error": (popart.poplibs_exception, ()),
    "poplar_error": (popart.poplar_exception, ()),
    "poplar_runtime_error": (popart.poplar_runtime_error, (popart.poplar_exception,)),
    "application_runtime_error": (
        popart.poplar_application_runtime_error,
        (popart.poplar_runtime_error, popart.poplar_exception),
    ),
    "system_runtime_error": (
        popart.poplar_system_runtime_error,
        (popart.poplar_runtime_error, popart.poplar_exception),
    ),
    "recoverable_runtime_error": (
        popart.poplar_recoverable_runtime_error,
        (popart.poplar_system_runtime_error, popart.poplar_runtime_error),
    ),
    "unrecoverable_runtime_error": (
        popart.poplar_unrecoverable_runtime_error,
        (popart.poplar_system_runtime_error,),
    ),
    "unknown_runtime_error": (
        popart.poplar_unknown_runtime_error,
        (popart.poplar_system_runtime_error,),
    ),
}


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_F60_throw_hooks_raise_their_class(kind):
    cls, parents = HOOKS[kind]
    hook = getattr(popart, f"_throw_{kind}")
    with pytest.raises(cls, match=f"boom {kind}") as info:
        hook(f"boom {kind}")
    assert type(info.value) is cls
    for parent in parents:
        assert isinstance(info.value, parent)


def test_F60_application_and_system_errors_are_separate_trees():
    assert not issubclass(popart.poplibs_exception, popart.popart_exception)
    assert not issubclass(popart.poplar_exception, popart.popart_exception)
    assert not issubclass(popart.popart_exception, popart.poplar_exception)
    for cls in (popart.popart_exception, popart.poplibs_exception, popart.poplar_exception):
        assert issubclass(cls, RuntimeError)


def test_F60_backend_errors_are_popart_exceptions():
    for cls in (
        popart.ShapeError,
        popart.UnsupportedOpError,
        popart.ModelError,
        popart.NotImplementedOptionError,
        popart.OutOfMemoryException,
    ):
        assert issubclass(cls, popart.popart_exception)
    assert issubclass(popart.StepIOError, popart.popart_runtime_error)


def test_F47_out_of_memory_exception_accessors():
    error = popart.OutOfMemoryException("ipu 0 overflow", "summary text", "/tmp/profile")
    assert isinstance(error, popart.popart_exception)
    assert error.getSummaryReport() == "summary text"
    assert error.getProfilePath() == "/tmp/profile"


def test_F61_recovery_action():
    with pytest.raises(popart.poplar_recoverable_runtime_error) as info:
        popart._throw_recoverable_runtime_error("reset me")
    assert info.value.recoveryAction is popart.RecoveryAction.IPU_RESET
    names = set(popart.RecoveryAction.__members__)
    assert {"IPU_RESET", "LINK_RESET", "PARTITION_RESET", "POWER_CYCLE", "FULL_RESET"} <= names
    assert popart.RecoveryAction.FULL_RESET is popart.RecoveryAction.POWER_CYCLE
    error = popart.poplar_recoverable_runtime_error("x", popart.RecoveryAction.LINK_RESET)
    assert error.recoveryAction is popart.RecoveryAction.LINK_RESET
