"""Compile time of one-node models and the wall time of the ONNX conformance suite (issue #7).

For every node test of the conformance suite (tests/conformance/) that is not on the
expected-failure list, time ``InferenceSession(...)`` + ``prepareDevice()`` alone, and the whole
case (import, compile, run every data set, compare) as the suite runs it. Prints the median and
95th percentile of the compile time (target: a few milliseconds for a one-node model), the
slowest cases, and the total time of all cases in one process (the suite's CPU cost without
pytest's overhead; pytest -n 2 spreads it over two workers).

    python benchmarks/bench_conformance.py [--only REGEX]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the suite's case generator and runner live with the tests

import popart_backend as popart
from tests.conformance.cases import node_cases
from tests.conformance.expected_failures import EXPECTED_FAILURES
from tests.conformance.runner import prepare_model, run_case


def compile_seconds(case) -> float:
    """InferenceSession construction + prepareDevice of the case's model."""
    model_bytes, _, _, shape_info = prepare_model(case)
    outputs = [o.name for o in onnx.load_from_string(case.model).graph.output]
    data_flow = popart.DataFlow(1, {o: popart.AnchorReturnType("All") for o in outputs})
    device = popart.DeviceManager().createCpuDevice()
    start = time.perf_counter()
    session = popart.InferenceSession(model_bytes, data_flow, device, inputShapeInfo=shape_info,
                                      userOptions=popart.SessionOptions())
    session.prepareDevice()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="regex over case names")
    args = parser.parse_args()
    cases = [c for c in node_cases() if c.name not in EXPECTED_FAILURES
             and re.search(args.only, c.name)]
    compile_times, case_times = {}, {}
    wall = time.perf_counter()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for case in cases:
            compile_times[case.name] = compile_seconds(case)
            start = time.perf_counter()
            run_case(case)
            case_times[case.name] = time.perf_counter() - start
    wall = time.perf_counter() - wall
    ms = sorted(1e3 * t for t in compile_times.values())
    print(f"{len(cases)} passing node cases")
    print(f"compile (InferenceSession + prepareDevice): median {statistics.median(ms):.2f} ms, "
          f"p95 {ms[int(0.95 * (len(ms) - 1))]:.2f} ms, max {ms[-1]:.1f} ms")
    print(f"all cases run as the suite runs them: {sum(case_times.values()):.1f} s "
          f"(this script's total incl. the separate compile timing: {wall:.1f} s)")
    print("slowest cases:")
    for name, seconds in sorted(case_times.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {name}: {1e3 * seconds:.0f} ms (compile {1e3 * compile_times[name]:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
