"""Public names of PopTorch 3.x on ``PoplarExecutor``: ``getTensorNames``, ``cycleCount``, the
perf counters and latencies from the simulated timeline, and ``copyNamedBuffersToDevice``."""

import pytest
import torch

import poptorch_lite as poptorch


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("shift", torch.zeros(3))

    def forward(self, x):
        return self.fc(x) + self.shift


@pytest.fixture(scope="module")
def ran():
    """An inference wrapper with 2 device iterations, run once."""
    torch.manual_seed(0)
    model = WithBuffer().eval()
    opts = (poptorch.Options().deviceIterations(2).logCycleCount(True)
            .updatableNamedBuffers(["shift"]))
    wrapper = poptorch.inferenceModel(model, opts)
    x = torch.randn(4, 4)
    out = wrapper(x)
    return wrapper, model, x, out


def test_before_compile():
    wrapper = poptorch.inferenceModel(WithBuffer().eval())
    assert wrapper.getPerfCounters() == {"input": [[]], "input_complete": [[]],
                                         "output": [[]], "output_complete": [[]]}
    assert wrapper.getLatency() == (0.0, 0.0, 0.0)
    for call in (wrapper.getTensorNames, wrapper.cycleCount, wrapper.copyNamedBuffersToDevice):
        with pytest.raises(poptorch.Error, match="not been compiled"):
            call()


def test_tensor_names_are_the_backend_ids(ran):
    wrapper = ran[0]
    names = wrapper.getTensorNames()
    assert names == sorted(names)
    ir = wrapper._active.session.getIr()
    assert set(names) == {t for g in ir.graphs.values() for t in g.tensors}
    traced = wrapper._active.traced
    assert set(traced.output_names) <= set(names)
    assert {n for n in traced.input_names if n} <= set(names)


def test_cycle_count_is_the_session_report_figure(ran):
    wrapper = ran[0]
    cycles = wrapper.cycleCount()
    assert cycles > 0
    assert cycles == wrapper._active.session.getReport().execution["cyclesPerStep"]


def test_cycle_count_needs_log_cycle_count():
    wrapper = poptorch.inferenceModel(WithBuffer().eval())
    wrapper(torch.randn(2, 4))
    with pytest.raises(poptorch.Error, match="logCycleCount"):
        wrapper.cycleCount()


def test_ipu_model_has_no_cycle_counter():
    opts = poptorch.Options().useIpuModel(True).logCycleCount(True)
    with pytest.raises(poptorch.Error, match="IPU Model"):
        opts.to_backend(training=False)


def test_perf_counters_lay_out_the_run(ran):
    wrapper = ran[0]
    counters = wrapper.getPerfCounters()
    assert set(counters) == {"input", "input_complete", "output", "output_complete"}
    assert len(counters["input"]) == 1 and len(counters["output"]) == 1  # one tensor each
    assert all(len(per_tensor) == 2 for c in counters.values() for per_tensor in c)
    for i in range(2):
        events = [counters[e][0][i] for e in ("input", "input_complete", "output",
                                              "output_complete")]
        assert events == sorted(events)
    assert counters["input"][0][0] == 0.0
    clock = wrapper._active.session.getReport().compilation["target"]["clockHz"]
    # The iterations fill the run: its end is cycleCount() cycles at the IPU clock.
    assert counters["output_complete"][0][-1] == pytest.approx(wrapper.cycleCount() / clock)
    assert counters["input"][0][1] == pytest.approx(counters["output_complete"][0][0])


def test_latencies_are_min_max_mean_of_the_timeline(ran):
    wrapper = ran[0]
    c = wrapper.getPerfCounters()
    total = [b - a for a, b in zip(c["input"][0], c["output_complete"][0])]
    assert wrapper.getLatency() == pytest.approx((min(total), max(total), sum(total) / 2))
    host_ipu, compute, ipu_host = (wrapper.getHostIpuLatency(), wrapper.getComputeLatency(),
                                   wrapper.getIpuHostLatency())
    assert compute[2] > 0 and host_ipu[2] > 0 and ipu_host[2] >= 0
    assert host_ipu[2] + compute[2] + ipu_host[2] == pytest.approx(wrapper.getLatency()[2])


def test_copy_named_buffers_to_device(ran):
    wrapper, model, x, out = ran
    with torch.no_grad():
        model.shift.fill_(1.5)
    assert torch.allclose(wrapper(x), out)  # the device still has the old buffer
    wrapper.copyNamedBuffersToDevice()
    assert torch.allclose(wrapper(x), out + 1.5)


def test_copy_named_buffers_needs_the_option():
    wrapper = poptorch.inferenceModel(WithBuffer().eval())
    wrapper(torch.randn(2, 4))
    with pytest.raises(poptorch.Error, match="updatableNamedBuffers"):
        wrapper.copyNamedBuffersToDevice()
