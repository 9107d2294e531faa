"""Memory accounting of whole training sessions against hand counts (issue #6 acceptance):
accumulators only with accumulation, pipeline stash ring sizes per spec §5.1, and weights split
over two IPUs taking half each."""

import popart_backend as popart
from tests.session.pipeline_models import D, chain_model, chain_weights, options

WEIGHT_BYTES = D * D * 4


def _memory(layers, ipus, opts, bps=1, optimizer=None):
    weights = chain_weights(layers)
    proto, loss, _ = chain_model(weights, ipus, stages=opts.enablePipelining)
    opts.engineOptions = {"autoReport.all": "true"}
    session = popart.TrainingSession(
        proto, popart.DataFlow(bps, [loss]), loss, optimizer or popart.ConstSGD(0.1),
        popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus}), userOptions=opts)
    session.prepareDevice()
    return session, session.getReport().model.memory.ipus


def _category(ipu_memory, name):
    return ipu_memory.categories[name]


def test_accumulators_only_with_accumulation():
    """Accum___<w> exists (one weight's bytes each) only when accumulation is on."""
    _, plain = _memory(3, 1, options())
    _, accumulating = _memory(3, 1, options(af=4))
    assert _category(plain[0], "accumulators") == 0
    assert _category(accumulating[0], "accumulators") == 3 * WEIGHT_BYTES
    assert _category(plain[0], "weights") == _category(accumulating[0], "weights") == 3 * WEIGHT_BYTES


def test_sgd_momentum_state_equals_the_weights():
    sgd = popart.SGD({"defaultLearningRate": (0.1, True), "defaultMomentum": (0.9, True)})
    _, ipus = _memory(2, 1, options(), optimizer=sgd)
    assert _category(ipus[0], "optimizer state") == 2 * WEIGHT_BYTES


def test_stash_ring_sizes_follow_the_spec_formula():
    """F67: a tensor stashed on stage s and restored by stage r keeps r - s + 1 entries.

    Two IPUs, stages 0 and 1 forward, loss on stage L = 1: backward of stage 0 is 2L - 0 = 2,
    so stage-0 activations need 3-entry rings; the last forward stage needs none."""
    session, ipus = _memory(2, 2, options(ipus=2, pipelined=True, af=4))
    graph = session.getIr().main
    buffers = {t.id: t for t in graph.tensors.values() if t.id.startswith("StashBuffer___")}
    assert buffers, "the pipelined IR has stash buffers"
    for tensor in buffers.values():
        readers = {op.settings.pipeline_stage for op in tensor.consumers}
        assert tensor.info.shape[0] == 3, (tensor.id, tensor.info, readers)
    # Each ring also keeps its stash and restore positions (two INT64 counters).
    stash_bytes = sum(t.info.num_bytes + 2 * 8 for t in buffers.values())
    assert sum(_category(m, "pipeline stashes") for m in ipus) == stash_bytes
    assert _category(ipus[1], "pipeline stashes") == 0


def test_weights_split_over_two_ipus_take_half_each():
    _, one = _memory(4, 1, options())
    _, two = _memory(4, 2, options(ipus=2))
    assert _category(one[0], "weights") == 4 * WEIGHT_BYTES
    assert [_category(m, "weights") for m in two] == [2 * WEIGHT_BYTES, 2 * WEIGHT_BYTES]
    # Data (everything but the per-tile code estimate and the planner's per-op working memory,
    # which does not split with the layers) is about half per IPU.
    def data(m):
        return sum(v for k, v in m.categories.items()
                   if k not in ("code", "planner temporaries"))

    assert all(data(m) < 0.8 * data(one[0]) for m in two)
