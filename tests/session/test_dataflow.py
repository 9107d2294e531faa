"""DataFlow and AnchorReturnType construction and validation (spec §4.2; F30–F34, F103)."""

from __future__ import annotations

import re

import pytest

import popart_backend as popart
from popart_backend.dataflow import anchor_fetches_per_run, anchor_shape


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize("text, expected", [
    ("All", popart.AnchorReturnTypeId.All),
    ("ALL", popart.AnchorReturnTypeId.All),
    ("all", popart.AnchorReturnTypeId.All),
    ("Final", popart.AnchorReturnTypeId.Final),
    ("FINAL", popart.AnchorReturnTypeId.Final),
    ("sum", popart.AnchorReturnTypeId.Sum),
    ("SUM", popart.AnchorReturnTypeId.Sum),
])
def test_art_strings_are_case_insensitive(text, expected):
    art = popart.AnchorReturnType(text)
    assert art.id() is expected
    assert art.rp() == 0
    assert art.tileSet() is popart.TileSet.Compute
    assert art.exchangeStrategy() is popart.ExchangeStrategy.JustInTime


@pytest.mark.parametrize("text", ["EveryN", "EVERYN", "everyn"])
def test_art_everyn_with_period(text):
    art = popart.AnchorReturnType(text, 3)
    assert art.id() is popart.AnchorReturnTypeId.EveryN
    assert art.rp() == 3


def test_art_tile_set_and_exchange_strategy_positional_and_keyword_F103():
    art = popart.AnchorReturnType("All", popart.TileSet.IO, popart.ExchangeStrategy.OverlapLoops)
    assert art.tileSet() is popart.TileSet.IO
    assert art.exchangeStrategy() is popart.ExchangeStrategy.OverlapLoops
    art = popart.AnchorReturnType("EveryN", 2, popart.TileSet.IO,
                                  popart.ExchangeStrategy.OverlapInnerLoop)
    assert (art.rp(), art.tileSet(), art.exchangeStrategy()) == (
        2, popart.TileSet.IO, popart.ExchangeStrategy.OverlapInnerLoop)
    art = popart.AnchorReturnType("Final", tileSet=popart.TileSet.IO)
    assert art.tileSet() is popart.TileSet.IO


def test_art_everyn_without_period():
    with pytest.raises(popart.popart_exception,
                       match=exact("Must specify return period with option 'EVERYN'")):
        popart.AnchorReturnType("EVERYN")


@pytest.mark.parametrize("period", [0, -2])
def test_art_period_not_positive(period):
    with pytest.raises(popart.popart_exception, match="greater than zero"):
        popart.AnchorReturnType("EveryN", period)


@pytest.mark.parametrize("text", ["All", "Final", "Sum"])
def test_art_period_for_other_types(text):
    with pytest.raises(popart.popart_exception, match="return period should not be supplied"):
        popart.AnchorReturnType(text, 2)


def test_art_unknown_string():
    with pytest.raises(popart.popart_exception,
                       match="Invalid anchor return type ID supplied: Most"):
        popart.AnchorReturnType("Most")


def test_art_bad_tile_set():
    with pytest.raises(popart.popart_exception, match="tileSet must be a TileSet"):
        popart.AnchorReturnType("All", "IO")


def test_dataflow_dict_constructor():
    flow = popart.DataFlow(4, {"y": popart.AnchorReturnType("All"),
                               "z": popart.AnchorReturnType("EveryN", 2)})
    assert flow.batchesPerStep() == 4
    assert flow.nAnchors() == 2
    assert flow.anchors() == ["y", "z"]
    assert flow.isAnchored("y") and flow.isAnchored("z") and not flow.isAnchored("x")
    assert flow.art("z").id() is popart.AnchorReturnTypeId.EveryN
    assert flow.art("z").rp() == 2


def test_dataflow_list_constructor_defaults_to_all():
    flow = popart.DataFlow(2, ["a", "b"])
    assert flow.anchors() == ["a", "b"]
    assert all(flow.art(t).id() is popart.AnchorReturnTypeId.All for t in ("a", "b"))
    flow = popart.DataFlow(2, ["a"], popart.AnchorReturnType("Sum"))
    assert flow.art("a").id() is popart.AnchorReturnTypeId.Sum


def test_dataflow_no_anchors():
    flow = popart.DataFlow(1, {})
    assert flow.nAnchors() == 0 and flow.anchors() == []


@pytest.mark.parametrize("bps", [0, -1])
def test_dataflow_bps_not_positive(bps):
    with pytest.raises(popart.popart_exception,
                       match=exact("'Batches per step' must be greater than zero")):
        popart.DataFlow(bps, {"y": popart.AnchorReturnType("All")})


def test_dataflow_period_larger_than_bps():
    with pytest.raises(popart.popart_exception,
                       match=exact("Return period must be <= to the number of batches per step")):
        popart.DataFlow(2, {"y": popart.AnchorReturnType("EveryN", 3)})


def test_dataflow_period_not_a_factor():
    with pytest.raises(
        popart.popart_exception,
        match=exact("Return period must be a factor of the number of batches per step"),
    ):
        popart.DataFlow(6, {"y": popart.AnchorReturnType("EveryN", 4)})


def test_dataflow_art_of_non_anchor():
    flow = popart.DataFlow(1, ["y"])
    with pytest.raises(popart.popart_exception, match=exact("Tensor q is not an anchor")):
        flow.art("q")


def test_dataflow_bad_arguments():
    with pytest.raises(popart.popart_exception, match="expected an AnchorReturnType"):
        popart.DataFlow(1, {"y": "All"})
    with pytest.raises(popart.popart_exception, match="listed more than once"):
        popart.DataFlow(1, ["y", "y"])
    with pytest.raises(popart.popart_exception, match="batchesPerStep must be an integer"):
        popart.DataFlow(1.5, ["y"])
    with pytest.raises(popart.popart_exception, match="list of tensor ids"):
        popart.DataFlow(1, "y")


# The §4.2 table: shape before squeeze, squeezing only the leading part, element counts.
@pytest.mark.parametrize("art, bps, af, rf, sample, expected", [
    (("All",), 1, 1, 1, (2, 3), (2, 3)),
    (("All",), 1, 1, 1, (1, 3), (1, 3)),  # size-1 dims of T stay
    (("All",), 4, 1, 2, (5,), (4, 2, 5)),
    (("Final",), 4, 1, 2, (5,), (2, 5)),
    (("Final",), 4, 1, 1, (5,), (5,)),
    (("Sum",), 4, 3, 2, (1,), (2, 1)),
    (("EveryN", 2), 6, 3, 1, (7,), (3, 3, 7)),
    (("EveryN", 3), 6, 1, 1, (), (2,)),
    (("EveryN", 6), 6, 1, 1, (4,), (4,)),
])
def test_anchor_shape_table_F29(art, bps, af, rf, sample, expected):
    art = popart.AnchorReturnType(*art)
    assert anchor_shape(art, sample, bps, af, rf) == expected
    divisor = {"All": 1, "EveryN": art.rp(), "Final": bps * af, "Sum": bps * af}[art.id().name]
    assert anchor_fetches_per_run(art, bps, af, rf) == bps * af * rf // divisor


def test_weights_io_and_step_io_containers():
    import numpy as np

    io = popart.PyWeightsIO({"w": np.zeros(3, np.float32)})
    assert io.contains("w") and not io.contains("b")
    step = popart.PyStepIO({"x": np.zeros(3, np.float32)}, {})
    step.enableRuntimeAsserts(False)
    assert step.runtime_asserts is False
    with pytest.raises(popart.popart_exception, match="must be callable"):
        popart.PyStepIOCallback(None, print, print, print)
