"""The exception hierarchy and the test hooks that raise each kind.

Application errors (bad model, bad options, bad step IO) are ``popart_exception`` and its
subclasses; system errors model device faults and carry a ``recoveryAction``.
"""

from __future__ import annotations

import enum


class RecoveryAction(enum.Enum):
    """What to do after a recoverable system error (decision: union of 2.3 and SDK 3)."""

    IPU_RESET = "IPU_RESET"
    LINK_RESET = "LINK_RESET"
    PARTITION_RESET = "PARTITION_RESET"
    POWER_CYCLE = "POWER_CYCLE"
    FULL_RESET = "POWER_CYCLE"  # 2.3 bindings' name for the same action


class popart_exception(RuntimeError):  # noqa: N801 - PopART's public name
    """Configuration or graph error made by the user (or a framework bug): fix the input."""


class popart_internal_exception(popart_exception):  # noqa: N801
    """An invariant of the implementation was broken: a bug in popart_backend."""


class popart_runtime_error(popart_exception):  # noqa: N801
    """Error while running a prepared session, e.g. step-IO buffers of the wrong size."""


class OutOfMemoryError:
    """PopART's out-of-memory status: ``OutOfMemoryError()`` is a success (no overflow);
    ``prepareDevice(err=status)`` fills it instead of raising. Every
    ``OutOfMemoryException`` is also one."""

    def __init__(self, message: str = "", summary_report: str = "", profile_path: str = ""):
        self._set_status(message, summary_report, profile_path)

    def _set_status(self, message: str, summary_report: str, profile_path: str) -> None:
        self._message = message
        self._summary_report = summary_report
        self._profile_path = profile_path

    def isSuccessful(self) -> bool:  # noqa: N802 - PopART's names
        return not self._message

    def getSummaryReport(self) -> str:  # noqa: N802
        return self._summary_report

    def getProfilePath(self) -> str:  # noqa: N802
        return self._profile_path

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        state = "successful" if self.isSuccessful() else self._message.splitlines()[0]
        return f"{type(self).__name__}({state!r})"


class OutOfMemoryException(popart_exception, OutOfMemoryError):
    """The simulated IPU memory overflowed at ``prepareDevice()``."""

    def __init__(self, message: str, summary_report: str = "", profile_path: str = ""):
        popart_exception.__init__(self, message)
        self._set_status(message, summary_report, profile_path)


class poplibs_exception(RuntimeError):  # noqa: N801
    """Error raised by a simulated poplibs kernel."""


class poplar_exception(RuntimeError):  # noqa: N801
    """Error raised by the simulated Poplar layer."""


class poplar_runtime_error(poplar_exception):  # noqa: N801
    pass


class poplar_application_runtime_error(poplar_runtime_error):  # noqa: N801
    pass


class poplar_system_runtime_error(poplar_runtime_error):  # noqa: N801
    pass


class poplar_recoverable_runtime_error(poplar_system_runtime_error):  # noqa: N801
    def __init__(self, message: str, recovery_action: RecoveryAction = RecoveryAction.IPU_RESET):
        super().__init__(message)
        self.recoveryAction = recovery_action


class poplar_unrecoverable_runtime_error(poplar_system_runtime_error):  # noqa: N801
    pass


class poplar_unknown_runtime_error(poplar_system_runtime_error):  # noqa: N801
    pass


# Descriptive subclasses used inside the backend (STYLE.md). Each is a popart_exception so
# user code catching PopART's names keeps working.
class ShapeError(popart_exception):
    """Shape or dtype inference failed for an op."""


class UnsupportedOpError(popart_exception):
    """An ONNX node names an op type or version the registry does not have."""


class ModelError(popart_exception):
    """The ONNX model itself is malformed or unreadable."""


class StepIOError(popart_runtime_error):
    """Input/output buffers handed to ``run()`` do not match the data flow."""


class NotImplementedOptionError(popart_exception):
    """A SessionOption was set to a value whose behaviour is not built yet."""


class ResourceLimitError(popart_exception):
    """A model or setting asks for more host memory or work than the resource guard allows
    (``POPART_SIM_MAX_BYTES``, see docs/security.md)."""


_THROW_KINDS = {
    "popart_error": lambda m: popart_exception(m),
    "popart_internal_error": lambda m: popart_internal_exception(m),
    "popart_runtime_error": lambda m: popart_runtime_error(m),
    "poplibs_error": lambda m: poplibs_exception(m),
    "poplar_error": lambda m: poplar_exception(m),
    "poplar_runtime_error": lambda m: poplar_runtime_error(m),
    "application_runtime_error": lambda m: poplar_application_runtime_error(m),
    "system_runtime_error": lambda m: poplar_system_runtime_error(m),
    "recoverable_runtime_error": lambda m: poplar_recoverable_runtime_error(
        m, RecoveryAction.IPU_RESET
    ),
    "unrecoverable_runtime_error": lambda m: poplar_unrecoverable_runtime_error(m),
    "unknown_runtime_error": lambda m: poplar_unknown_runtime_error(m),
}


def make_throw_hooks() -> dict:
    """The ``popart._throw_<kind>(msg)`` test hooks, by attribute name."""

    def hook(kind):
        def throw(message: str):
            raise _THROW_KINDS[kind](message)

        throw.__name__ = f"_throw_{kind}"
        return throw

    return {f"_throw_{kind}": hook(kind) for kind in _THROW_KINDS}
