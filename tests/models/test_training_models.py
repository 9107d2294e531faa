"""Exported PyTorch models trained by a TrainingSession equal eager torch.optim training (issue #3).

The MLP, the CNN with BatchNorm and the nn.TransformerEncoder of ``tests/models/zoo.py`` are
exported once per module (dynamo exporter, opset 18, eval mode), a loss is appended with
``popart.Builder`` (``training_zoo.py``) and trained with batchesPerStep > 1 over several
``run()`` calls. Features: F6, F36-F39 (optimizers, updateOptimizerFromHost), F50 (training
run), F73/F75 (gradient accumulation and its reductions), and the training semantics of
BatchNormalization and Dropout (DESIGN decision 5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart_backend as popart
from popart_backend.optim.values import AdamMode, AdaptiveMode, WeightDecayMode
from tests.models import training_zoo as tz
from tests.models import zoo
from tests.ops.test_optimizer_updates import adam_reference

BPS, RUNS = 2, 2


@pytest.fixture(scope="module")
def cases() -> dict[str, tz.TrainingCase]:
    """Each model exported once for the whole module (export is the slow part)."""
    return {name: make() for name, make in tz.CASES.items()}


def c(value):
    return (value, True)


# Some weights have an exactly zero gradient: a conv bias followed by BatchNorm (which subtracts
# the batch mean) and the key bias of attention (softmax ignores a constant shift). Their
# computed gradient is float rounding noise, which Adam and the adaptive optimizers normalise
# (g/√v ≈ ±1 when ε is far below |g|) into ±lr steps whose sign no two implementations share.
# An ε well above that noise (1e-3) keeps the comparison about the maths.
EPS = 1e-3

# name -> (popart optimizer, torch.optim factory)
OPTIMIZERS = {
    "sgd": (
        lambda: popart.SGD({"defaultLearningRate": c(0.05), "defaultMomentum": c(0.9),
                            "defaultWeightDecay": c(0.01), "defaultDampening": c(0.2)}),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, dampening=0.2),
    ),
    "sgd_nesterov": (
        lambda: popart.SGD({"defaultLearningRate": c(0.05), "defaultMomentum": c(0.8),
                            "defaultWeightDecay": c(0.01), "defaultNesterov": c(1)}),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, weight_decay=0.01, nesterov=True),
    ),
    "adam": (
        lambda: popart.Adam({"defaultLearningRate": (0.01, False), "defaultBeta1": c(0.9),
                             "defaultBeta2": c(0.99), "defaultEps": c(EPS),
                             "defaultWeightDecay": c(0.01)},
                            AdamMode.Adam, WeightDecayMode.L2Regularization),
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.99), eps=EPS, weight_decay=0.01),
    ),
    "adamw": (
        lambda: popart.Adam({"defaultLearningRate": c(0.01), "defaultBeta1": c(0.8),
                             "defaultBeta2": c(0.95), "defaultEps": c(EPS),
                             "defaultWeightDecay": c(0.05)},
                            AdamMode.Adam, WeightDecayMode.Decay),
        lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.95), eps=EPS, weight_decay=0.05),
    ),
    "adamax": (
        lambda: popart.Adam({"defaultLearningRate": c(0.01), "defaultBeta1": c(0.9),
                             "defaultBeta2": c(0.99), "defaultEps": c(EPS)}, AdamMode.AdaMax),
        lambda p: torch.optim.Adamax(p, lr=0.01, betas=(0.9, 0.99), eps=EPS),
    ),
    "rmsprop": (
        lambda: popart.Adaptive({"defaultLearningRate": c(0.005), "defaultAlpha": c(0.9),
                                 "defaultEps": c(EPS), "defaultMomentum": c(0.5),
                                 "defaultWeightDecay": c(0.01)},
                                AdaptiveMode.RMSProp, WeightDecayMode.L2Regularization),
        lambda p: torch.optim.RMSprop(p, lr=0.005, alpha=0.9, eps=EPS, momentum=0.5,
                                      weight_decay=0.01),
    ),
    "rmsprop_centered": (
        lambda: popart.Adaptive({"defaultLearningRate": c(0.005), "defaultAlpha": c(0.9),
                                 "defaultEps": c(EPS)}, AdaptiveMode.CenteredRMSProp),
        lambda p: torch.optim.RMSprop(p, lr=0.005, alpha=0.9, eps=EPS, centered=True),
    ),
    "adagrad": (
        lambda: popart.Adaptive({"defaultLearningRate": c(0.05), "defaultEps": c(EPS),
                                 "defaultWeightDecay": c(0.01)},
                                AdaptiveMode.AdaGrad, WeightDecayMode.L2Regularization),
        lambda p: torch.optim.Adagrad(p, lr=0.05, eps=EPS, weight_decay=0.01),
    ),
    "adadelta": (
        lambda: popart.Adaptive({"defaultLearningRate": c(1.0), "defaultAlpha": c(0.9),
                                 "defaultEps": c(EPS)}, AdaptiveMode.AdaDelta),
        lambda p: torch.optim.Adadelta(p, lr=1.0, rho=0.9, eps=EPS),
    ),
}


def trained(case, module) -> dict[str, np.ndarray]:
    """The torch module's parameters, plus its running statistics when they are trained."""
    out = {n: p.detach().numpy() for n, p in module.named_parameters()}
    if case.train_mode:
        out.update({n: b.numpy() for n, b in module.named_buffers() if b.dtype.is_floating_point})
    return out


def train_both(case, optimizer, make_torch_optimizer, runs: int = RUNS, bps: int = BPS,
               seed: int = 0, lr_schedule=None, between_runs=None):
    """Train ``runs`` × ``bps`` weight updates here and in torch; returns (ours, torch's)."""
    session = tz.session(case, optimizer, bps=bps)
    all_steps = []
    for r in range(runs):
        if between_runs is not None and r > 0:
            between_runs(session, r)
        feeds = case.feeds((bps,), seed=seed + r)
        tz.run(session, feeds)
        all_steps += tz.split_steps(feeds)
    module = tz.torch_train(case, all_steps, make_torch_optimizer, lr_schedule=lr_schedule)
    want = trained(case, module)
    return tz.read(session, list(want)), want


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("model", list(tz.CASES))
def test_trained_weights_equal_torch_F39_F50(cases, model, optimizer):
    """Each optimizer with a torch.optim counterpart, bps 2, two run() calls: every weight (and
    the CNN's BatchNorm running statistics) equals torch's within 1e-4 relative."""
    make, make_torch = OPTIMIZERS[optimizer]
    case = cases[model]
    got, want = train_both(case, make(), make_torch)
    tz.assert_close(got, want, what=f"{model}/{optimizer}")
    moved = max(np.abs(want[n] - v).max() for n, v in case.parameters().items())
    assert moved > 1e-3, "training did not move the weights; the test would prove nothing"


@pytest.mark.parametrize("mode", [AdamMode.Lamb, AdamMode.LambNoBias])
@pytest.mark.parametrize("model", ["mlp", "transformer_encoder"])
def test_lamb_equals_formula_reference_F39(cases, model, mode):
    """Lamb has no torch.optim counterpart: the reference is the float64 formula of the
    optimizer tests (``adam_reference``), fed with torch.autograd gradients at each step."""
    case = cases[model]
    lr, b1, b2, eps, wd, mwn = 0.01, 0.9, 0.99, EPS, 0.01, 0.5
    optimizer = popart.Adam({"defaultLearningRate": c(lr), "defaultBeta1": c(b1),
                             "defaultBeta2": c(b2), "defaultEps": c(eps),
                             "defaultWeightDecay": c(wd), "defaultMaxWeightNorm": c(mwn)}, mode)
    session = tz.session(case, optimizer, bps=BPS)
    steps = []
    for r in range(RUNS):
        feeds = case.feeds((BPS,), seed=r)
        tz.run(session, feeds)
        steps += tz.split_steps(feeds)

    start = case.parameters()
    module = tz.torch_train(case, [], lambda p: torch.optim.SGD(p, lr=0.0))
    params = dict(module.named_parameters())
    grads, weights = [], start
    for micro_batches in steps:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(torch.from_numpy(np.asarray(weights[name], np.float32)))
        for p in params.values():
            p.grad = None
        case.torch_loss(module, micro_batches[0]).backward()
        grads.append({n: p.grad.numpy().copy() for n, p in params.items()})
        # The reference replays the whole trajectory on the gradients seen so far.
        weights = adam_reference(mode, start, grads, lr, b1, b2, eps, wd=wd, mwn=mwn)[-1]
    tz.assert_close(tz.read(session, list(start)), weights, what=f"{model}/{mode.name}")


# --- gradient accumulation (F73, F75) -------------------------------------------------------

AF = 4


def momentum_sgd():
    return popart.SGD({"defaultLearningRate": c(0.05), "defaultMomentum": c(0.9)})


def torch_momentum_sgd(p):
    return torch.optim.SGD(p, lr=0.05, momentum=0.9)


@pytest.mark.parametrize("strategy", [popart.MeanReductionStrategy.Post,
                                      popart.MeanReductionStrategy.Running])
def test_accumulation_mean_equals_one_step_on_the_whole_batch_F73_F75(cases, strategy):
    """af 4 with Mean: each weight update equals one torch step on the 4× batch (the 4
    micro-batches concatenated), over bps 2 and two run() calls."""
    case = cases["mlp"]
    options = popart.SessionOptions()
    options.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    options.meanAccumulationAndReplicationReductionStrategy = strategy
    session = tz.session(case, momentum_sgd(), bps=BPS, af=AF, options=options)
    big_batches = []
    for r in range(RUNS):
        feeds = case.feeds((BPS, AF), seed=10 + r)
        tz.run(session, feeds)
        for b in range(BPS):
            big_batches.append([{k: v[b].reshape(-1, *v.shape[3:]) for k, v in feeds.items()}])
    assert len(big_batches[0][0]["x"]) == AF * case.micro_batch
    module = tz.torch_train(case, big_batches, torch_momentum_sgd)
    tz.assert_close(tz.read(session, [n for n, _ in module.named_parameters()]),
                    trained(case, module))


def test_accumulation_sum_equals_summed_gradient_F73_F75(cases):
    """af 4 with Sum: each update uses the sum of the 4 micro-batch gradients; the gradient
    anchor of each micro-batch equals torch's gradient there."""
    case = cases["mlp"]
    options = popart.SessionOptions()
    options.accumulationAndReplicationReductionType = popart.ReductionType.Sum
    weight = "net.0.weight"
    session = tz.session(case, momentum_sgd(), bps=BPS, af=AF, options=options,
                         anchors=[popart.reservedGradientPrefix() + weight])
    steps, grads = [], []
    for r in range(RUNS):
        feeds = case.feeds((BPS, AF), seed=20 + r)
        anchors = tz.run(session, feeds)
        grads.append(anchors[popart.reservedGradientPrefix() + weight])
        steps += tz.split_steps(feeds, af=AF)
    module = tz.torch_train(case, steps, torch_momentum_sgd, mean=False)
    tz.assert_close(tz.read(session, [n for n, _ in module.named_parameters()]),
                    trained(case, module))

    # The first micro-batch's gradient is at the initial weights.
    reference = tz.torch_train(case, [], torch_momentum_sgd)
    case.torch_loss(reference, steps[0][0]).backward()
    assert grads[0].shape == (BPS, AF, *reference.net[0].weight.shape)
    tz.assert_close({"g": grads[0][0, 0]}, {"g": reference.net[0].weight.grad.numpy()},
                    rtol=1e-5)


# --- training semantics ---------------------------------------------------------------------


def test_batchnorm_running_statistics_follow_torch_with_accumulation(cases):
    """BatchNorm updates its running mean/var every micro-batch with batch statistics, as
    torch's train mode does, also inside an accumulation window (af 2)."""
    case = cases["cnn"]
    session = tz.session(case, momentum_sgd(), bps=BPS, af=2)
    feeds = case.feeds((BPS, 2), seed=30)
    tz.run(session, feeds)
    # The default accumulation reduction is Sum (spec §5.3): gradients are summed.
    module = tz.torch_train(case, tz.split_steps(feeds, af=2), torch_momentum_sgd, mean=False)
    want = trained(case, module)
    stats = [n for n in want if "running" in n]
    assert stats and all(not np.allclose(want[n], case.buffers()[n]) for n in stats)
    tz.assert_close(tz.read(session, list(want)), want)


class DropoutMLP(torch.nn.Module):
    def __init__(self, ratio: float):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 256)
        self.drop = torch.nn.Dropout(ratio)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


RATIO, DROP_MB = 0.3, 8


@pytest.fixture(scope="module")
def dropout_case() -> tz.TrainingCase:
    """Exported in train mode so the export keeps its Dropout node (an eval export drops it)."""
    torch.manual_seed(0)
    module = DropoutMLP(RATIO).train()
    feeds = {"x": np.zeros((DROP_MB, 16), np.float32)}
    proto = zoo.export(module, feeds, ("logits",), "dynamo", 18)
    assert any(n.op_type == "Dropout" for n in proto.graph.node)
    builder = popart.Builder(proto.SerializeToString())
    label = builder.addInputTensor(popart.TensorInfo("INT32", [DROP_MB]), "label")
    log_probs = builder.aiOnnx.logsoftmax(["logits"], axis=-1)
    loss = builder.aiGraphcore.nllloss([log_probs, label], reduction=popart.ReductionType.Mean,
                                       inputIsLogProbability=True)

    def make(rng, lead):
        return {"x": rng.standard_normal((*lead, DROP_MB, 16)).astype(np.float32),
                label: rng.integers(0, 10, (*lead, DROP_MB)).astype(np.int32)}

    return tz.TrainingCase("dropout_mlp", module, tz.proto_of(builder), loss, label, ("x",),
                           DROP_MB, make, torch_loss=None, train_mode=True)


def dropout_session(case, seed: int):
    """A session anchoring the Dropout mask (TrainingSemantics names it '<output>/mask')."""
    (dropout,) = [n for n in case.model.graph.node if n.op_type == "Dropout"]
    mask = f"{dropout.output[0]}/mask"
    session = tz.session(case, popart.ConstSGD(0.1), bps=3, anchors=[mask])
    session.setRandomSeed(seed)
    return session, mask


def test_dropout_masks_differ_replay_and_keep_the_ratio(dropout_case):
    """Dropout is active in training: its mask changes every micro-batch and run, keeps
    1 - ratio of the values, replays exactly with the same seed, differs with another seed;
    the weights equal torch trained with the same masks."""
    case = dropout_case
    feeds = [case.feeds((3,), seed=s) for s in (40, 41)]
    session, mask_id = dropout_session(case, seed=7)
    masks = np.concatenate([tz.run(session, f)[mask_id] for f in feeds])
    assert masks.dtype == np.bool_ and masks.shape == (6, DROP_MB, 256)
    for i in range(len(masks)):
        for j in range(i):
            assert (masks[i] != masks[j]).any(), f"micro-batches {j} and {i} share a mask"
    kept = masks.mean()
    # 6·8·256 Bernoulli(0.7) draws: the standard deviation of the mean is 0.004.
    assert abs(kept - (1 - RATIO)) < 0.02, kept

    again, _ = dropout_session(case, seed=7)
    replay = np.concatenate([tz.run(again, f)[mask_id] for f in feeds])
    np.testing.assert_array_equal(replay, masks)
    other, _ = dropout_session(case, seed=8)
    assert (tz.run(other, feeds[0])[mask_id] != masks[:3]).any()

    # torch with the recorded masks gives the same weights.
    module = tz.torch_train(case, [], lambda p: torch.optim.SGD(p, lr=0.0)).train()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    steps = tz.split_steps(feeds[0]) + tz.split_steps(feeds[1])
    for mask, (step,) in zip(masks, steps):
        optimizer.zero_grad()
        hidden = torch.relu(module.fc1(torch.from_numpy(step["x"])))
        logits = module.fc2(hidden * torch.from_numpy(mask) / (1 - RATIO))
        target = torch.from_numpy(step[case.label]).long()
        torch.nn.functional.nll_loss(torch.log_softmax(logits, -1), target).backward()
        optimizer.step()
    want = {n: p.detach().numpy() for n, p in module.named_parameters()}
    tz.assert_close(tz.read(session, list(want)), want)


# --- loss scaling and updateOptimizerFromHost (F38) -----------------------------------------


@pytest.mark.parametrize("const", [True, False])
def test_loss_scaling_leaves_trained_weights_unchanged_F38(cases, const):
    """Training with lossScaling 1024 (const or not) gives the weights of training without it,
    within float rounding."""
    case = cases["cnn"]

    def adam(loss_scaling):
        return popart.Adam({"defaultLearningRate": c(0.01), "defaultWeightDecay": c(0.01),
                            "defaultEps": c(EPS), "lossScaling": (loss_scaling, const)},
                           AdamMode.Adam)

    weights = list(case.parameters())
    results = []
    for optimizer in (adam(1.0), adam(1024.0)):
        session = tz.session(case, optimizer, bps=BPS)
        for r in range(RUNS):
            tz.run(session, case.feeds((BPS,), seed=50 + r))
        results.append(tz.read(session, weights))
    tz.assert_close(results[1], results[0], rtol=1e-5)


def test_update_optimizer_from_host_mid_training_F38(cases):
    """A non-const learning rate changed between run() calls equals changing torch's
    param_groups lr at the same step (transformer, Adam, then SGD with momentum)."""
    case = cases["transformer_encoder"]

    def adam(lr):
        return popart.Adam({"defaultLearningRate": (lr, False), "defaultBeta1": c(0.9),
                            "defaultBeta2": c(0.99), "defaultEps": c(EPS)})

    got, want = train_both(
        case, adam(0.01), lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.99), eps=EPS),
        runs=3, lr_schedule={BPS: 0.002, 2 * BPS: 0.02},
        between_runs=lambda s, r: s.updateOptimizerFromHost(adam({1: 0.002, 2: 0.02}[r])))
    tz.assert_close(got, want)

    def sgd(lr):
        return popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": c(0.9)})

    got, want = train_both(
        cases["mlp"], sgd(0.05), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        lr_schedule={BPS: 0.2},
        between_runs=lambda s, r: s.updateOptimizerFromHost(sgd(0.2)))
    tz.assert_close(got, want)
