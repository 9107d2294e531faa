"""``PoplarExecutor``'s introspection of the compiled model and its last run:
``getTensorNames``, ``getAnchoredTensor``, ``cycleCount``, the perf counters and latencies, and
``copyNamedBuffersToDevice``.

The figures are the simulated IPU's. ``cycleCount()`` is the backend session's cycle counter
(``getCycleCount``, built when ``Options.logCycleCount(True)``). The perf counters lay the last
``run()`` of replica 0 out on a timeline from the session's report (``getReport().execution``,
which the frontend always asks for): per device iteration, its micro-batches' host -> IPU input
transfers, then the compute (micro-batches, weight update), then its share of the IPU -> host
output transfers. Timestamps are simulated seconds from the start of that run (PopTorch leaves
the reference point undefined; only differences mean something), so the iterations add up to
``cycleCount()`` cycles at the IPU clock. Replicas run in lockstep, so they share the timeline.
"""

from __future__ import annotations

import numpy as np

import popart_backend as popart

from ..errors import Error

__all__: list[str] = []

_EVENTS = ("input", "input_complete", "output", "output_complete")


class IntrospectionMixin:
    """Tensor names, cycles, perf counters and latencies, and updatable buffers."""

    def getTensorNames(self) -> list[str]:  # noqa: N802 - PopTorch's name
        """The backend's tensor ids of the compiled model (all graphs), sorted."""
        executable = self._require_compiled("getTensorNames()")
        ir = executable.session.getIr()
        return sorted({tid for graph in ir.graphs.values() for tid in graph.tensors})

    def getAnchoredTensor(self, short_name: str):  # noqa: N802 - PopTorch's name
        """The value from the last run of the tensor registered with
        ``Options.anchorTensor(short_name, long_name, ...)``, shaped by its output mode as the
        outputs are (P18)."""
        executable = self._require_compiled(f"getAnchoredTensor({short_name!r})")
        if short_name not in executable.anchored:
            known = ", ".join(repr(s) for s in executable.anchored) or "none"
            raise Error(f"getAnchoredTensor({short_name!r}): no tensor was anchored under this "
                        f"name (anchored: {known}). Register it with "
                        f"Options.anchorTensor(short_name, long_name) before compiling.")
        if executable.anchored_values is None:
            raise Error(f"getAnchoredTensor({short_name!r}): the model has not run yet; call "
                        f"the wrapper first.")
        return executable.anchored_values[short_name]

    def cycleCount(self) -> int:  # noqa: N802
        """Simulated cycles of the last run (replica 0); needs ``Options.logCycleCount(True)``."""
        executable = self._require_compiled("cycleCount()")
        if not self._options._values["logCycleCount"]:
            raise Error("cycleCount(): the cycle counter is off; build the wrapper with "
                        "Options().logCycleCount(True).")
        try:
            return executable.session.getCycleCount()
        except popart.popart_exception as exc:
            raise Error(f"cycleCount(): {exc}") from exc

    def _timeline(self) -> tuple[dict, int, int] | None:
        """(execution report, inputs, outputs) of the last run; None before any run."""
        if self._active is None:
            return None
        execution = self._active.session.getReport().execution
        if execution["runs"] == 0:
            return None
        traced = self._active.traced
        inputs = sum(1 for name in traced.input_names if name is not None)
        return execution, inputs, len(dict.fromkeys(traced.output_names))

    def getPerfCounters(self) -> dict[str, list[list[float]]]:  # noqa: N802
        """``{"input", "input_complete", "output", "output_complete"}`` -> per tensor, the
        simulated timestamp (seconds) of that event in each device iteration of the last run;
        ``[[]]`` for each before a run."""
        found = self._timeline()
        if found is None:
            return {event: [[]] for event in _EVENTS}
        execution, inputs, outputs = found
        batch = execution["batch"]
        iterations = batch["batchesPerStep"]
        micro = batch["accumulationFactor"]
        step = execution["cyclesPerStep"]
        anchor = execution["hostAnchorCyclesPerStep"]
        # Host input cycles that the step holds (streams on IO tiles overlap compute instead).
        host_in = min(execution["hostInputCyclesPerMicroBatch"] * micro,
                      max(step - anchor, 0) / iterations)
        out = anchor / iterations
        compute = max(step - anchor, 0) / iterations - host_in
        clock = self._active.session.getReport().compilation["target"]["clockHz"]
        start = np.arange(iterations) * (host_in + compute + out)
        times = {"input": start, "input_complete": start + host_in,
                 "output": start + host_in + compute, "output_complete": start + host_in
                 + compute + out}
        counts = {"input": inputs, "input_complete": inputs, "output": outputs,
                  "output_complete": outputs}
        return {event: [[float(t) / clock for t in times[event]]] * counts[event]
                for event in _EVENTS}

    def _latency(self, first: str, first_of, last: str, last_of) -> tuple[float, float, float]:
        """(min, max, mean) over the iterations of ``last_of(last) - first_of(first)`` across
        tensors, as PopTorch computes it; zeros before a run."""
        counters = self.getPerfCounters()
        begin = [first_of(ts) for ts in zip(*counters[first])]
        end = [last_of(ts) for ts in zip(*counters[last])]
        durations = [b - a for a, b in zip(begin, end)]
        if not durations:
            return (0.0, 0.0, 0.0)
        return (min(durations), max(durations), sum(durations) / len(durations))

    def getHostIpuLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """First input requested -> last input transferred: (min, max, avg) seconds."""
        return self._latency("input", min, "input_complete", max)

    def getComputeLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """Last input transferred -> first output requested: (min, max, avg) seconds."""
        return self._latency("input_complete", max, "output", min)

    def getIpuHostLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """First output requested -> last output transferred: (min, max, avg) seconds."""
        return self._latency("output", min, "output_complete", max)

    def getLatency(self) -> tuple[float, float, float]:  # noqa: N802
        """First input requested -> last output transferred: (min, max, avg) seconds."""
        return self._latency("input", min, "output_complete", max)

    def copyNamedBuffersToDevice(self) -> None:  # noqa: N802
        """Host -> device copy of the buffers named in ``Options.updatableNamedBuffers``."""
        executable = self._require_compiled("copyNamedBuffersToDevice()")
        names = list(self._options._values["updatableNamedBuffers"])
        if not names:
            raise Error("copyNamedBuffersToDevice(): no buffers are updatable; list them with "
                        "Options().updatableNamedBuffers([...]).")
        buffers = dict(self._user_model.named_buffers())
        unknown = [n for n in names if n not in buffers]
        if unknown:
            raise Error(f"copyNamedBuffersToDevice(): {unknown} are not buffers of the model; "
                        f"its buffers are {sorted(buffers)}.")
        on_device = {fqn: onnx for onnx, fqn in executable.device_weights.items()}
        unused = [n for n in names if n not in on_device]
        if unused:
            self._warn_once("copyNamedBuffersToDevice",
                            f"copyNamedBuffersToDevice(): {unused} are not used by the compiled "
                            f"model, so copying them has no effect.")
        arrays = {on_device[n]: np.array(buffers[n].detach().cpu().numpy(), order="C")
                  for n in names if n in on_device}
        if not arrays:
            return
        session = executable.session
        if self._attached:
            # weightsFromHost() writes every variable: refresh the host copies first so only
            # the named buffers change on the device.
            session.weightsToHost()
        session.writeWeights(popart.PyWeightsIO(arrays))
        if self._attached:
            session.weightsFromHost()
