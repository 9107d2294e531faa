"""DataLoader combined batches, drop_last and async loading (spec §2.6, P46-P50)."""

import pytest
import torch

import poptorch_lite as poptorch


def dataset(n):
    return torch.utils.data.TensorDataset(torch.arange(n, dtype=torch.float32).reshape(n, 1),
                                          torch.arange(n))


def test_combined_batches_and_drop_last_warning():
    opts = poptorch.Options().deviceIterations(3)
    with pytest.warns(UserWarning, match="4 of 22 samples are dropped"):
        loader = poptorch.DataLoader(opts, dataset(22), batch_size=2)
    assert loader.combinedBatchSize == 6 and len(loader) == 3
    shapes = [x.shape for x, _ in loader]
    assert shapes == [torch.Size([6, 1])] * 3
    with pytest.raises(AttributeError, match="frozen"):
        opts.deviceIterations(2)


def test_keep_last_warns_with_size():
    with pytest.warns(UserWarning, match="last batch has 2 samples"):
        loader = poptorch.DataLoader(poptorch.Options().deviceIterations(2), dataset(10),
                                     batch_size=2, drop_last=False)
    assert [len(y) for _, y in loader] == [4, 4, 2]


def test_async_equals_sync():
    opts = poptorch.Options().deviceIterations(2)
    sync = poptorch.DataLoader(opts, dataset(16), batch_size=2)
    asyn = poptorch.DataLoader(opts, dataset(16), batch_size=2,
                               mode=poptorch.DataLoaderMode.Async)
    try:
        for _ in range(2):  # two epochs: the worker restarts the loader
            got = [y.clone() for _, y in asyn]
            want = [y for _, y in sync]
            assert len(got) == len(want) == 4
            for a, b in zip(got, want):
                assert torch.equal(a, b)
    finally:
        asyn.terminate()


def test_accessor_over_plain_iterable_and_terminate():
    accessor = poptorch.AsynchronousDataAccessor([torch.ones(2) * i for i in range(5)],
                                                 buffer_size=2, load_indefinitely=False)
    assert [int(t[0]) for t in accessor] == [0, 1, 2, 3, 4]
    accessor.terminate()
    with pytest.raises(ValueError):
        poptorch.AsynchronousDataAccessor([1], rebatched_size=1)


def test_batch_sampler_batches_are_concatenated():
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(12)), 3,
                                            drop_last=True)
    loader = poptorch.DataLoader(poptorch.Options().deviceIterations(2), dataset(12),
                                 batch_sampler=sampler)
    assert [y.tolist() for _, y in loader] == [list(range(6)), list(range(6, 12))]


@pytest.mark.parametrize("mode", [poptorch.DataLoaderMode.Async,
                                  poptorch.DataLoaderMode.AsyncRebatched])
def test_async_keep_last_rebatches_to_whole_combined_batches(mode):
    """P47: asynchronous loading never yields a short batch a compiled wrapper would refuse."""
    opts = poptorch.Options().deviceIterations(2)
    with pytest.warns(UserWarning, match="2 of 10 samples do not fill a combined batch of 4"):
        loader = poptorch.DataLoader(opts, dataset(10), batch_size=2, drop_last=False,
                                     mode=mode)
    try:
        got = [y.clone() for _, y in loader]
    finally:
        loader.terminate()
    assert [y.tolist() for y in got] == [list(range(0, 4)), list(range(4, 8))]


def test_short_last_batch_is_refused_by_the_compiled_wrapper():
    """P24: the short batch of drop_last=False is an input change, named as such."""
    opts = poptorch.Options().deviceIterations(2)
    with pytest.warns(UserWarning, match="needs its own wrapper"):
        loader = poptorch.DataLoader(opts, dataset(10), batch_size=2, drop_last=False)
    model = torch.nn.Linear(1, 1)
    wrapper = poptorch.inferenceModel(model, opts)
    batches = [x for x, _ in loader]
    for x in batches[:-1]:
        torch.testing.assert_close(wrapper(x), model(x).detach())
    with pytest.raises(poptorch.Error) as info:
        wrapper(batches[-1])
    message = str(info.value)
    assert "input input: expected float32[4, 1], got float32[2, 1]" in message
    assert "build a new wrapper or call destroy() to recompile" in message
    assert "Data-dependent" not in message
