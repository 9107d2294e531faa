"""A catalogue of bad inputs (hardening): each is refused with the project's exception class
and a message naming what was wrong, never a raw Python error; a refused session call leaves
the session usable with its weights bit-for-bit unchanged, a refused wrapper call leaves the
wrapper usable and the model's state unchanged."""

from __future__ import annotations

import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import popart_backend as popart
import poptorch_lite as poptorch
from popart_backend.errors import ModelError, StepIOError

PE = popart.popart_exception
Error = poptorch.Error
BPS = 2


def _model():
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = builder.addInitializedInputTensor(
        np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32), "w")
    y = builder.aiOnnx.matmul([x, w])
    loss = builder.aiGraphcore.l1loss([y], 0.1)
    return builder.getModelProto(), x, w, y, loss


PROTO, X, W, Y, LOSS = _model()


def _device():
    return popart.DeviceManager().createIpuModelDevice({})


def _sgd(**values):
    return popart.SGD({"defaultLearningRate": (0.1, False), **values})


def _training(bps: int = 1, anchors=None, device=None, **options):
    user = popart.SessionOptions()
    for key, value in options.items():
        setattr(user, key, value)
    return popart.TrainingSession(
        fnModel=PROTO, dataFlow=popart.DataFlow(bps, anchors or {LOSS: popart.AnchorReturnType(
            "All")}), loss=LOSS, optimizer=_sgd(), deviceInfo=device or _device(),
        userOptions=user)


def _inference(anchor: str = Y, **kwargs):
    return popart.InferenceSession(fnModel=kwargs.pop("fnModel", PROTO), dataFlow=popart.DataFlow(
        1, {anchor: popart.AnchorReturnType("All")}), deviceInfo=kwargs.pop("deviceInfo",
                                                                          _device()), **kwargs)


@pytest.fixture(scope="module")
def ctx():
    session = _training(BPS, {LOSS: popart.AnchorReturnType("All"),
                              Y: popart.AnchorReturnType("Final")})
    session.prepareDevice()
    session.weightsFromHost()
    return SimpleNamespace(s=session, good=np.ones((BPS, 2, 3), np.float32))


def _anchors(c):
    return c.s.initAnchorArrays()


def _run(c, inputs=None, outputs=None):
    c.s.run(popart.PyStepIO({X: c.good} if inputs is None else inputs,
                            _anchors(c) if outputs is None else outputs))


def _readonly_anchors(c):
    anchors = _anchors(c)
    anchors[LOSS].setflags(write=False)
    return anchors


class _Callbacks:
    """A PyStepIOCallback whose input callback returns ``value``."""

    def __init__(self, c, value):
        self.anchors = _anchors(c)
        self.value = value

    def stepio(self):
        return popart.PyStepIOCallback(
            lambda tensor_id, prefetch: self.value, lambda tensor_id: None,
            lambda tensor_id: self.anchors[tensor_id][0], lambda tensor_id: None)


# (id, kind, call, exception, message fragment). kind "session": a call on the shared training
# session (checked usable and unchanged after); "plain": no session state involved.
SESSION_CASES = [
    # --- StepIO ---
    ("input-wrong-dtype", lambda c: _run(c, {X: c.good.astype(np.float64)}), StepIOError,
     "dtype float64, but the model expects float32"),
    ("input-wrong-size", lambda c: _run(c, {X: np.ones((BPS, 2, 4), np.float32)}), StepIOError,
     "Expected 12, but received 16"),
    ("input-missing", lambda c: _run(c, {}), StepIOError, "No tensor x provided"),
    ("input-extra", lambda c: _run(c, {X: c.good, "z": c.good}), StepIOError,
     "'z', which is not an input of the model"),
    ("input-list", lambda c: _run(c, {X: c.good.tolist()}), StepIOError,
     "is a list; give a numpy array"),
    ("input-none", lambda c: _run(c, {X: None}), StepIOError, "is a NoneType"),
    ("input-not-whole-chunks", lambda c: c.s.run(_no_asserts({X: np.ones(13, np.float32)},
                                                             _anchors(c))),
     StepIOError, "not a whole number of 6-element micro-batch chunks"),
    ("output-read-only", lambda c: _run(c, outputs=_readonly_anchors(c)), StepIOError,
     "must be C-contiguous and writeable"),
    ("output-not-contiguous", lambda c: _run(c, outputs={
        k: np.zeros(v.size * 2, v.dtype)[::2] for k, v in _anchors(c).items()}), StepIOError,
     "must be C-contiguous and writeable"),
    ("output-missing", lambda c: _run(c, outputs={}), StepIOError, "No tensor L1:0 provided"),
    ("output-wrong-dtype", lambda c: _run(c, outputs={
        k: v.astype(np.float16) for k, v in _anchors(c).items()}), StepIOError,
     "dtype float16, but the model expects float32"),
    ("output-wrong-size", lambda c: _run(c, outputs={
        k: np.zeros(v.size + 1, v.dtype) for k, v in _anchors(c).items()}), StepIOError,
     "Unexpected number of output elements"),
    ("output-extra", lambda c: _run(c, outputs={**_anchors(c), "n": np.zeros(1, np.float32)}),
     StepIOError, "'n', which is not an anchor"),
    ("stepio-dict", lambda c: c.s.run({X: c.good}), StepIOError,
     "needs a PyStepIO or PyStepIOCallback, got dict"),
    ("stepio-none", lambda c: c.s.run(None), StepIOError, "got NoneType"),
    ("callback-wrong-size", lambda c: c.s.run(
        _Callbacks(c, np.ones(5, np.float32)).stepio()), StepIOError,
     "input_callback('x') returned 5 elements"),
    ("callback-list", lambda c: c.s.run(_Callbacks(c, [1.0] * 6).stepio()), StepIOError,
     "is a list; give a numpy array"),
    # --- weights ---
    ("read-unknown-weight", lambda c: c.s.readWeights(popart.PyWeightsIO(
        {"nope": np.zeros(2, np.float32)})), PE, "'nope' is not a weight of this session"),
    ("read-wrong-shape", lambda c: c.s.readWeights(popart.PyWeightsIO(
        {W: np.zeros(2, np.float32)})), PE, "is float32[2]; the weight is float32[3, 2]"),
    ("read-wrong-dtype", lambda c: c.s.readWeights(popart.PyWeightsIO(
        {W: np.zeros((3, 2), np.float64)})), PE, "is float64[3, 2]"),
    ("write-wrong-shape", lambda c: c.s.writeWeights(popart.PyWeightsIO(
        {W: np.zeros(2, np.float32)})), PE, "is float32[2]; the weight is float32[3, 2]"),
    ("write-wrong-dtype", lambda c: c.s.writeWeights(popart.PyWeightsIO(
        {W: np.zeros((3, 2), np.int32)})), PE, "is int32[3, 2]"),
    ("write-unknown-after-a-good-one", lambda c: c.s.writeWeights(popart.PyWeightsIO(
        {W: np.full((3, 2), 7.0, np.float32), "nope": np.zeros(2, np.float32)})), PE,
     "'nope' is not a weight"),
    ("write-not-weights-io", lambda c: c.s.writeWeights({W: np.zeros((3, 2), np.float32)}), PE,
     "needs a PyWeightsIO, not dict"),
    ("model-to-host-missing-folder", lambda c: c.s.modelToHost("/nonexistent_p9/m.onnx"), PE,
     "does not exist"),
    ("get-info-unknown", lambda c: c.s.getInfo("nope"), PE, "no tensor 'nope'"),
    # --- RNG ---
    ("set-rng-state-without-option", lambda c: c.s.setRNGState([1, 2]), PE,
     "enableLoadAndOffloadRNGState is True"),
    ("set-random-seed-str", lambda c: c.s.setRandomSeed("abc"), PE,
     "the seed must be an int, got str"),
    # --- optimizer updates ---
    ("update-optimizer-class", lambda c: c.s.updateOptimizerFromHost(popart.Adam({})), PE,
     "built with SGD, got Adam"),
    ("update-optimizer-dict", lambda c: c.s.updateOptimizerFromHost(
        {"defaultLearningRate": (0.1, False)}), PE, "needs a popart optimizer, not dict"),
    ("update-optimizer-constness", lambda c: c.s.updateOptimizerFromHost(popart.SGD(
        {"defaultLearningRate": (0.1, True)})), PE, "const-ness differs"),
]


def _no_asserts(inputs, outputs):
    stepio = popart.PyStepIO(inputs, outputs)
    stepio.enableRuntimeAsserts(False)
    return stepio


def _weights(session) -> np.ndarray:
    array = np.empty((3, 2), np.float32)
    session.readWeights(popart.PyWeightsIO({W: array}))
    return array


@pytest.mark.parametrize("call,exception,fragment",
                         [pytest.param(*case[1:], id=case[0]) for case in SESSION_CASES])
def test_bad_session_call(ctx, call, exception, fragment):
    session = ctx.s
    session.weightsToHost()
    before = _weights(session)
    with pytest.raises(exception, match=re.escape(fragment)):
        call(ctx)
    assert _weights(session).tobytes() == before.tobytes()  # host copy
    session.weightsToHost()
    assert _weights(session).tobytes() == before.tobytes()  # device copy
    anchors = _anchors(ctx)
    _run(ctx, outputs=anchors)  # still usable
    assert np.isfinite(anchors[LOSS]).all() and anchors[LOSS].any()


def _user_options(**options):
    user = popart.SessionOptions()
    for key, value in options.items():
        setattr(user, key, value)
    return user


PLAIN_CASES = [
    # --- PyStepIO / PyWeightsIO construction ---
    ("pystepio-inputs-list", lambda: popart.PyStepIO([1], {}), PE, "both must be dicts"),
    ("pystepio-outputs-none", lambda: popart.PyStepIO({}, None), PE, "both must be dicts"),
    ("pyweightsio-list", lambda: popart.PyWeightsIO([1]), PE, "expected a dict"),
    # --- DataFlow and anchors ---
    ("dataflow-bps-zero", lambda: popart.DataFlow(0, {}), PE, "must be greater than zero"),
    ("dataflow-bps-negative", lambda: popart.DataFlow(-1, {}), PE, "must be greater than zero"),
    ("dataflow-bps-float", lambda: popart.DataFlow(1.5, {}), PE, "must be an integer, not 1.5"),
    ("dataflow-bps-str", lambda: popart.DataFlow("2", {}), PE, "must be an integer, not '2'"),
    ("dataflow-return-type-str", lambda: popart.DataFlow(1, {"a": "All"}), PE,
     "expected an AnchorReturnType"),
    ("return-type-unknown", lambda: popart.AnchorReturnType("Some"), PE,
     "Invalid anchor return type ID supplied: Some"),
    ("return-type-int", lambda: popart.AnchorReturnType(3), PE, "must be a string"),
    ("return-period-zero", lambda: popart.AnchorReturnType("EveryN", 0), PE,
     "period must be greater than zero"),
    ("return-period-negative", lambda: popart.AnchorReturnType("EveryN", -2), PE,
     "period must be greater than zero"),
    ("return-period-not-factor", lambda: _training(4, {LOSS: popart.AnchorReturnType(
        "EveryN", 3)}), PE, "must be a factor of the number of batches per step"),
    ("anchor-unknown", lambda: _inference("nope"), PE, "Anchor 'nope' is not a tensor"),
    # --- SessionOptions ---
    ("option-int-as-str", lambda: _user_options(accumulationFactor="2"), PE,
     "accumulationFactor expects int, got str '2'"),
    ("option-unknown", lambda: _user_options(notAnOption=1), PE,
     "has no option 'notAnOption'"),
    ("option-bool-as-str", lambda: _user_options(enableGradientAccumulation="yes"), PE,
     "expects bool, got str 'yes'"),
    ("option-enum-as-int", lambda: _user_options(virtualGraphMode=7), PE,
     "virtualGraphMode expects VirtualGraphMode, got int 7"),
    ("option-enum-as-str", lambda: _user_options(syntheticDataMode="Zeros"), PE,
     "expects SyntheticDataMode, got str 'Zeros'"),
    ("option-dict-as-list", lambda: _user_options(engineOptions=[1]), PE,
     "engineOptions expects dict[str, str], got list"),
    ("user-options-dict", lambda: _inference(userOptions={"a": 1}), PE,
     "userOptions must be a SessionOptions, got dict"),
    ("accumulation-not-enabled", lambda: _training(accumulationFactor=4), PE,
     "enableGradientAccumulation is false, but accumulationFactor > 1"),
    ("replicas-negative", lambda: _training(enableReplicatedGraphs=True,
                                            replicatedGraphCount=-1), PE,
     "replicatedGraphCount = -1 is out of range"),
    ("accumulation-zero", lambda: _training(enableGradientAccumulation=True,
                                            accumulationFactor=0), PE,
     "accumulationFactor = 0 is out of range"),
    # --- devices ---
    ("ipus-zero", lambda: popart.DeviceManager().createIpuModelDevice({"numIPUs": 0}), PE,
     "numIPUs must be at least 1, got 0"),
    ("ipus-str", lambda: popart.DeviceManager().createIpuModelDevice({"numIPUs": "two"}), PE,
     "expects a int (or its string form), got 'two'"),
    ("device-option-unknown", lambda: popart.DeviceManager().createIpuModelDevice(
        {"colour": 1}), PE, "Invalid option `colour'"),
    ("tiles-negative", lambda: popart.DeviceManager().createIpuModelDevice(
        {"tilesPerIPU": -4}), PE, "tilesPerIPU=-4 is out of range"),
    ("device-id-unknown", lambda: popart.DeviceManager().acquireDeviceById(9999), PE,
     "no device with id 9999"),
    ("device-id-negative", lambda: popart.DeviceManager().acquireDeviceById(-1), PE,
     "no device with id -1"),
    ("acquire-three-ipus", lambda: popart.DeviceManager().acquireAvailableDevice(3), PE,
     "numIpus=3 is not a power of two"),
    ("device-info-str", lambda: _inference(deviceInfo="ipu"), PE,
     "deviceInfo must be a DeviceInfo"),
    ("device-info-none", lambda: _inference(deviceInfo=None), PE, "deviceInfo is None"),
    ("replicas-exceed-device", lambda: _training(enableReplicatedGraphs=True,
                                                 replicatedGraphCount=2), PE,
     "need 2 IPUs"),
    # --- optimizers ---
    ("sgd-negative-rate", lambda: _sgd(defaultLearningRate=(-0.1, False)), PE,
     "learningRate must be >= 0, got -0.1"),
    ("sgd-unknown-key", lambda: popart.SGD({"defaultLearningRat": (0.1, False)}), PE,
     "unknown key 'defaultLearningRat'"),
    ("sgd-value-str", lambda: popart.SGD({"defaultLearningRate": "fast"}), PE,
     "value 'fast' is not an OptimizerValue"),
    ("sgd-rate-nan", lambda: _sgd(defaultLearningRate=(float("nan"), False)), PE,
     "must be a finite number, got nan"),
    ("sgd-dampening", lambda: _sgd(defaultDampening=(-1.0, False)), PE,
     "dampening must be in [0, 1], got -1.0"),
    ("sgd-weight-decay", lambda: _sgd(defaultWeightDecay=(-1.0, False)), PE,
     "weightDecay must be >= 0, got -1.0"),
    ("sgd-loss-scaling-zero", lambda: _sgd(lossScaling=(0.0, False)), PE,
     "lossScaling must be positive and finite, got 0.0"),
    ("sgd-values-list", lambda: popart.SGD([0.1]), PE, "must be a dict"),
    ("adam-unknown-key", lambda: popart.Adam({"defaultBeta3": (0.9, False)}), PE,
     "unknown key 'defaultBeta3'"),
    ("adam-beta1", lambda: popart.Adam({"defaultBeta1": (1.5, False)}), PE,
     "beta1 must be in [0, 1), got 1.5"),
    ("adam-eps", lambda: popart.Adam({"defaultEps": (-1e-8, False)}), PE,
     "eps must be >= 0, got -1e-08"),
    ("adam-mode-str", lambda: popart.Adam({}, mode="adam"), PE,
     "expected a popart.AdamMode"),
    ("session-optimizer-float", lambda: popart.TrainingSession(
        fnModel=PROTO, dataFlow=popart.DataFlow(1, {LOSS: popart.AnchorReturnType("All")}),
        loss=LOSS, optimizer=0.1, deviceInfo=_device()), PE,
     "optimizer must be a popart optimizer"),
    # --- sessions ---
    ("model-bytes-garbage", lambda: _inference(fnModel=b"garbage"), ModelError,
     "Could not parse the 7 model bytes"),
    ("dataflow-dict", lambda: popart.InferenceSession(fnModel=PROTO, dataFlow={Y: 1},
                                                      deviceInfo=_device()), PE,
     "dataFlow must be a DataFlow, not dict"),
    ("loss-unknown", lambda: popart.TrainingSession(
        fnModel=PROTO, dataFlow=popart.DataFlow(1, {LOSS: popart.AnchorReturnType("All")}),
        loss="nope", optimizer=_sgd(), deviceInfo=_device()), PE,
     "the loss 'nope' is not a tensor of the model"),
    # --- Builder ---
    ("builder-unknown-input", lambda: popart.Builder().aiOnnx.relu(["nope"]), PE,
     "input(s) ['nope'] are not tensors of this builder"),
    ("builder-attribute-type", lambda: _builder_op("softmax", axis="x"), PE,
     "attribute 'axis' expects an int, got str 'x'"),
    ("builder-attribute-float", lambda: _builder_op("concat", 1.5), PE,
     "attribute 'axis' expects an int, got float 1.5"),
    ("builder-opset-old", lambda: popart.Builder(opsets={"ai.onnx": 3}), PE,
     "ai.onnx opset 3 is not available"),
    ("builder-opset-future", lambda: popart.Builder(opsets={"ai.onnx": 99}), PE,
     "ai.onnx opset 99 is not available"),
    ("tensor-info-dtype", lambda: popart.TensorInfo("FLOAT65", [2]), PE,
     "Unknown data type string 'FLOAT65'"),
    ("tensor-info-negative-dim", lambda: popart.TensorInfo("FLOAT", [-2]), PE,
     "has negative dimensions"),
    ("initializer-objects", lambda: popart.Builder().addInitializedInputTensor(
        np.array([object()])), PE, "an object array can only hold strings"),
    ("output-unknown", lambda: popart.Builder().addOutputTensor("nope"), PE,
     "input(s) ['nope'] are not tensors"),
    ("virtual-graph-str", lambda: _builder_annotation(), PE,
     "virtualGraph: value must be an int, not 'one'"),
    ("tensor-shape-unknown", lambda: popart.Builder().getTensorShape("nope"), PE,
     "Tensor 'nope' is not in this builder's model"),
    ("builder-input-int", lambda: popart.Builder().aiOnnx.relu([3]), PE,
     "every input id must be a string, got [3]"),
    ("builder-args-not-list", lambda: _builder_op("relu", as_list=False), PE,
     "args must be a list of tensor ids"),
]


def _builder_op(name, *args, as_list=True, **kwargs):
    builder = popart.Builder()
    tensor = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    return getattr(builder.aiOnnx, name)([tensor] if as_list else tensor, *args, **kwargs)


def _builder_annotation():
    builder = popart.Builder()
    builder.virtualGraph(builder.addInputTensor(popart.TensorInfo("FLOAT", [2])), "one")


@pytest.mark.parametrize("call,exception,fragment",
                         [pytest.param(*case[1:], id=case[0]) for case in PLAIN_CASES])
def test_bad_value(call, exception, fragment):
    with pytest.raises(exception, match=re.escape(fragment)):
        call()


# --- the frontend ---


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, a):
        return self.lin(a)


@pytest.fixture(scope="module")
def wrapper():
    model = _Net()
    wrapped = poptorch.inferenceModel(model)
    wrapped(torch.ones(2, 3))
    yield SimpleNamespace(model=model, w=wrapped)
    wrapped.destroy()


def _rng_state_str(w):
    w.rng_state = "abc"


WRAPPER_CASES = [
    ("too-few-inputs", lambda w: w(), Error, "missing a required argument: 'a'"),
    ("too-many-inputs", lambda w: w(torch.ones(2, 3), torch.ones(2, 3)), Error,
     "too many positional arguments"),
    ("unknown-keyword", lambda w: w(torch.ones(2, 3), b=1), Error,
     "got an unexpected keyword argument 'b'"),
    ("wrong-shape", lambda w: w(torch.ones(2, 4)), Error,
     "got float32[2, 4]. A compiled wrapper only takes inputs"),
    ("list-input", lambda w: w([[1.0, 2.0, 3.0]] * 2), Error,
     "inputs differ from those used to compile"),
    ("str-input", lambda w: w("abc"), Error, "got 'abc'"),
    ("rng-state-str", _rng_state_str, Error, "give a list of ints"),
]


@pytest.mark.parametrize("call,exception,fragment",
                         [pytest.param(*case[1:], id=case[0]) for case in WRAPPER_CASES])
def test_bad_wrapper_call(wrapper, call, exception, fragment):
    state = {k: v.clone() for k, v in wrapper.model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(exception, match=re.escape(fragment)):
            call(wrapper.w)
    out = wrapper.w(torch.ones(2, 3))  # still usable, same weights
    torch.testing.assert_close(out, wrapper.model(torch.ones(2, 3)), rtol=0, atol=1e-6)
    for key, value in wrapper.model.state_dict().items():
        assert torch.equal(value, state[key]), key


OPTIONS_CASES = [
    ("device-iterations-zero", lambda: poptorch.Options().deviceIterations(0), ValueError,
     "must be >= 1, got 0"),
    ("device-iterations-str", lambda: poptorch.Options().deviceIterations("4"), TypeError,
     "expected int, got str ('4')"),
    ("replication-negative", lambda: poptorch.Options().replicationFactor(-1), ValueError,
     "must be >= 1, got -1"),
    ("accumulation-zero", lambda: poptorch.Options().Training.gradientAccumulation(0),
     ValueError, "must be >= 1, got 0"),
    ("output-mode-str", lambda: poptorch.Options().outputMode("everything"), TypeError,
     "expected an OutputMode, got 'everything'"),
    ("assign-unknown", lambda: setattr(poptorch.Options(), "deviceIteration", 2),
     AttributeError, "use the setter methods"),
    ("seed-str", lambda: poptorch.Options().randomSeed("x"), TypeError,
     "expected int, got str ('x')"),
    ("connection-str", lambda: poptorch.Options().connectionType("always"), TypeError,
     "expected ConnectionType, got str ('always')"),
    ("options-dict", lambda: poptorch.inferenceModel(_Net(), options={"a": 1}), Error,
     "options must be a poptorch_lite.Options, not dict"),
    ("model-function", lambda: poptorch.inferenceModel(lambda a: a), Error,
     "Expected a torch.nn.Module to wrap, got function"),
    ("optimizer-str", lambda: poptorch.trainingModel(_Net(), optimizer="sgd"), Error,
     "optimizer must be a torch.optim.Optimizer"),
    ("batch-not-multiple", lambda: poptorch.inferenceModel(
        _Net(), poptorch.Options().deviceIterations(4))(torch.ones(2, 3)), Error,
     "batch dimension 2 is not a multiple of deviceIterations(4)"),
]


@pytest.mark.parametrize("call,exception,fragment",
                         [pytest.param(*case[1:], id=case[0]) for case in OPTIONS_CASES])
def test_bad_frontend_value(call, exception, fragment):
    with pytest.raises(exception, match=re.escape(fragment)):
        call()


class _DoubleLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, a):
        return self.lin(a).abs().mean().double()


def test_no_loss_names_the_outputs_and_what_a_loss_must_be():
    """A float64 loss (computed in forward) is refused with what forward returned and what a
    loss must be, not only "no loss found"."""
    model = _DoubleLoss()
    wrapped = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(),
                                                                      lr=0.1))
    with pytest.raises(Error, match=r"0-d float32 or float16 tensor.*float64\[\]"):
        wrapped(torch.ones(2, 3))


class _Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, a, target):
        out = self.lin(a)
        return out, torch.nn.functional.mse_loss(out, target)


def test_float64_inputs_to_a_training_model_are_cast_with_a_warning():
    """float64 inputs are cast to float32 with PopTorch's warning and train like float32
    inputs (they used to make the traced loss float64: "no loss found")."""
    a = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    target = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    model, reference = _Regression(), _Regression()
    wrapped = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(),
                                                                      lr=0.1))
    with pytest.warns(UserWarning, match="float64.*cast to float32"):
        out, loss = wrapped(a, target)
    assert out.dtype is torch.float32 and loss.dtype is torch.float32
    expected_out, expected_loss = reference(a.float(), target.float())
    torch.testing.assert_close(loss, expected_loss.detach(), rtol=1e-5, atol=1e-6)
    expected_loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    wrapped.copyWeightsToHost()
    for got, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
