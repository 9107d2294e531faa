"""Run every conformance case and print a fresh expected_failures.py (reasons by category).

``python -m tests.conformance.triage --only REGEX`` prints pass / fail for the matching cases;
``--summary`` prints the pass counts (all node tests, PopART-list ones, model tests) and the
list's reasons.
``python -m tests.conformance.triage --write`` rewrites tests/conformance/expected_failures.py
(without ``--write`` the text goes to stdout) after ops land; review the diff. A failure this
script cannot classify keeps the hand-written reason it already has in expected_failures.py, or
comes out as ``UNCLASSIFIED: <error>``, to be replaced by a hand-written reason (or fixed).
"""

from __future__ import annotations

import re
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from .cases import MODEL_KINDS, model_cases, node_cases
from .runner import run_case

# ONNX element types the DataType enum does not have.
_DTYPE_NAMES = {
    16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
    20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0",
    25: "uint2", 26: "int2", 27: "float6e2m3", 28: "float6e3m2",
}
MAX_OPSET = 28  # the backend imports ai.onnx opsets 6-28 (the installed onnx package's range)


# Cases whose outputs differ for a reason worked out by hand (a regex over the case name).
_KNOWN_MISMATCHES = {
    r"^test_attention_.*(bf16|fp16_expanded)": (
        "16-bit rounding: the expected outputs round every partial sum of the softmax to "
        "bfloat16 / float16 one element at a time (ml_dtypes numpy); we accumulate in float32 "
        "and round once, a 1-ulp difference beyond the case's rtol 1e-3"),
    r"^test_dft_inverse": (
        "the expected output carries numpy's float32 FFT rounding noise (1.9e-7 where the exact "
        "value is 0; the case's atol is 1e-7); we return the exact 0"),
    r"^test_maxunpool_export_with_output_shape$": (
        "the expected output reads the indices over the kernel/strides size and pads to "
        "output_shape; ONNX's operator text, onnxruntime and torch read them over output_shape, "
        "as we do"),
    r"^test_if_opt$": (
        "whether the optional output is present depends on a runtime condition: its shape is "
        "not static"),
}


def classify(name: str, error: str) -> str:
    """A reason category for a failing case, from its name and error text."""
    for pattern, reason in _KNOWN_MISMATCHES.items():
        if re.search(pattern, name):
            return reason
    if name.startswith("test_training_dropout"):
        return ("Dropout training_mode=1 in an InferenceSession is inert: the session type "
                "decides, as in PopART (DESIGN decision 5, spec P15); the expected masks are "
                "numpy draws besides")
    if "training_mode" in name and "batchnorm" in name:
        return ("BatchNormalization training_mode=1 in an InferenceSession uses the running "
                "statistics: the session type decides, as in PopART (DESIGN decision 5, P15)")
    if name.startswith("test_bernoulli"):
        return "random values: the expected outputs are numpy draws our torch generator cannot equal"
    found = re.search(r"Op (\w+) \(domain ([\w.]+), opset \d+\) is not supported", error)
    if found:
        op, domain = found.groups()
        if domain == "ai.onnx":
            return f"op {op} not implemented (issue #7)"
        return f"domain {domain} (op {op}) not implemented"
    found = re.search(r"Op (\w+) in ai.onnx opset \d+ is version (\d+), but popart_backend "
                      r"implements versions", error)
    if found:
        op, version = found.group(1), int(found.group(2))
        if version > MAX_OPSET:
            return f"op {op}-{version}: ai.onnx opset > {MAX_OPSET}, outside our range (DESIGN.md)"
        return f"op {op}-{version} not implemented, only older versions (issue #7)"
    found = re.search(r"element type (\d+)", error)
    if found:
        return f"dtype {_DTYPE_NAMES.get(int(found.group(1)), found.group(1))} not modelled"
    if re.search(r"BFLOAT16|BFloat16|bfloat16", error):
        return "dtype bfloat16 not modelled"
    found = re.search(r"dtype (uint16|uint32|uint64) is valid ONNX but", error)
    if found:
        return f"dtype {found.group(1)} arithmetic not implemented (torch has no kernels for it)"
    if "uint64 shifts" in error:
        return "dtype uint64 arithmetic not implemented (torch has no kernels for it)"
    if "STRING" in error or "dtype object" in error:
        return "string tensors not supported"
    if "has no shape in the model" in error or "is a sequence" in error:
        return "sequence / optional values as graph inputs or outputs not supported"
    if "must be a constant known at compile time" in error:
        return "shape operand computed at run time: static shapes only"
    if "output shape depends on the values" in error:
        return "data-dependent output shape: static shapes only"
    return "UNCLASSIFIED: " + error.replace("\n", " | ")[:200]


def failures(only: str | None = None) -> dict[str, str]:
    """Case id -> reason of every failing case (of those whose id matches regex ``only``)."""
    cases = node_cases() + [c for kind in MODEL_KINDS for c in model_cases(kind)]
    result = {}
    for case in cases:
        case_id = case.name if case.kind == "node" else f"{case.kind}/{case.name}"
        if only is not None and not re.search(only, case_id):
            continue
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                run_case(case)
        except Exception as exc:  # noqa: BLE001 - every failure is classified, none hidden
            result[case_id] = classify(case.name, f"{type(exc).__name__}: {exc}")
    return result


_HEADER = '''"""Conformance cases expected to fail and why: a strict xfail list that only shrinks.

Keys are node test names (``test_abs``) or ``<kind>/<name>`` for the shipped model tests. When a
change makes a listed case pass, the suite fails (strict xfail) until its entry is deleted here.
Reasons name the missing piece: an op (``op X not implemented (issue #7)``), an op version, a
dtype the simulated IPU does not model, or a limit of static shapes. Regenerate with
``python -m tests.conformance.triage --write``.
"""

from __future__ import annotations

_GROUPS: dict[str, list[str]] = {'''


def render(reasons: dict[str, str], hand_written: dict[str, str]) -> str:
    """expected_failures.py text; ``hand_written`` reasons win over the classifier's."""
    groups: dict[str, list[str]] = defaultdict(list)
    for case_id, reason in reasons.items():
        if reason.startswith("UNCLASSIFIED") and case_id in hand_written:
            reason = hand_written[case_id]
        groups[reason].append(case_id)
    order = ("op ", "domain ", "dtype ", "string", "sequence", "shape operand", "data-dependent")

    def key(reason: str):
        return next((i for i, p in enumerate(order) if reason.startswith(p)), len(order)), reason

    lines = _HEADER.splitlines()
    for reason in sorted(groups, key=key):
        lines.append(f"    {reason!r}: [")
        line = "       "
        for case_id in sorted(groups[reason]):
            item = f" {case_id!r},"
            if len(line) + len(item) > 100:
                lines.append(line)
                line = "       "
            line += item
        lines += [line, "    ],"]
    lines += [
        "}",
        "",
        "EXPECTED_FAILURES: dict[str, str] = {",
        "    name: reason for reason, names in _GROUPS.items() for name in names",
        "}",
        "",
    ]
    return "\n".join(lines)


def report(only: str) -> int:
    """Print pass / fail (with the error) of every case whose id matches regex ``only``."""
    cases = node_cases() + [c for kind in MODEL_KINDS for c in model_cases(kind)]
    passed = failed = 0
    for case in cases:
        case_id = case.name if case.kind == "node" else f"{case.kind}/{case.name}"
        if not re.search(only, case_id):
            continue
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                run_case(case)
        except Exception as exc:  # noqa: BLE001 - printed, not hidden
            failed += 1
            print(f"FAIL {case_id}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        else:
            passed += 1
            print(f"pass {case_id}")
    print(f"{passed} passed, {failed} failed")
    return 0


def summary() -> int:
    """The figures issue #7's acceptance asks for, from the expected-failure list (which the
    suite keeps exact: a listed case that passes fails the suite)."""
    from .expected_failures import EXPECTED_FAILURES
    from .popart_ops import uses_only_popart_ops

    nodes = node_cases()
    failing = [c for c in nodes if c.name in EXPECTED_FAILURES]
    popart = [c for c in nodes if uses_only_popart_ops(c.model)]
    popart_failing = [c for c in popart if c.name in EXPECTED_FAILURES]
    models = [c for kind in MODEL_KINDS for c in model_cases(kind)]
    models_failing = [c for c in models if f"{c.kind}/{c.name}" in EXPECTED_FAILURES]

    def line(what, total, failed):
        print(f"{what}: {total - len(failed)} / {total} pass ({100 * (total - len(failed)) / total:.1f} %)")

    line("node tests", len(nodes), failing)
    line("node tests of PopART-list op types (spec 6.1, 6.2)", len(popart), popart_failing)
    line("shipped model tests", len(models), models_failing)
    print(f"expected-failure list: {len(EXPECTED_FAILURES)} entries")
    by_reason: dict[str, int] = defaultdict(int)
    for case_id in EXPECTED_FAILURES:
        by_reason[EXPECTED_FAILURES[case_id]] += 1
    for reason, count in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {reason}")
    if popart_failing:
        print("PopART-list node tests failing:")
        for case in popart_failing:
            print(f"  {case.name}: {EXPECTED_FAILURES[case.name]}")
    return 0


def main() -> int:
    from .expected_failures import EXPECTED_FAILURES

    if "--summary" in sys.argv[1:]:
        return summary()
    if "--only" in sys.argv[1:]:
        return report(sys.argv[sys.argv.index("--only") + 1])
    text = render(failures(), EXPECTED_FAILURES)
    if "--write" in sys.argv[1:]:
        Path(__file__).with_name("expected_failures.py").write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
