"""Recovery at the header of a loop over a torch DataLoader: RETRY fetches
the same batch again (0 and N worker processes), CONTINUE drops it, and both
work through tqdm's generator (which dies with the exception) and through
enumerate around it.  Every recovered run is compared, tensor for tensor,
with the run of the corrected program."""

from __future__ import annotations

import pytest

import daifu
from daifu.engine._events import capture

from .support import crashes, vaccinate

torch = pytest.importorskip("torch", reason="PyTorch not available")
tqdm = pytest.importorskip("tqdm", reason="tqdm not installed (the test extra has it)")

PROGRAM = '''
import sys
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from tqdm import tqdm


class Records(Dataset):
    def __init__(self, bad=()):
        self.x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        self.bad = set(bad)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"bad record {i}")
        return self.x[i]


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(40):
            if i == 13:
                raise ValueError("bad record 13")
            yield torch.full((4,), float(i))


def loader(bad=(), workers=0, shuffle=True):
    return DataLoader(Records(bad), batch_size=8, shuffle=shuffle, num_workers=workers,
                      generator=torch.Generator().manual_seed(1))


def wrapped(data, wrap):
    if wrap == "tqdm":
        return tqdm(data, file=sys.stderr, mininterval=0)
    if wrap == "enumerate(tqdm)":
        return enumerate(tqdm(data, file=sys.stderr, mininterval=0))
    if wrap == "enumerate":
        return enumerate(data)
    return data


def train(data, wrap):
    total, batches = torch.zeros(4), []
    for item in wrapped(data, wrap):
        xb = item[1] if isinstance(item, tuple) else item
        total += xb.sum(0) * (len(batches) + 1)
        batches.append(xb.clone())
    return total, batches


def prefetch(data):
    for batch in data:
        yield batch * 1.0


def train_prefetched(data):
    n = 0
    for xb in prefetch(data):
        n += 1
    return n
'''


@pytest.fixture(scope="module")
def program():
    from daifu.engine._loaders import record_sent_indices

    record_sent_indices()  # what python -m daifu and daifu.install() do (idempotent)
    return vaccinate(PROGRAM, entries=("train", "train_prefetched"), name="loader_program")


def same_run(a, b) -> bool:
    return (torch.equal(a[0], b[0]) and len(a[1]) == len(b[1])
            and all(torch.equal(x, y) for x, y in zip(a[1], b[1])))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("wrap", ["plain", "tqdm", "enumerate", "enumerate(tqdm)"])
def test_retry_at_the_loop_header_fetches_the_same_batch_again(program, workers, wrap):
    data = program["loader"](bad={13}, workers=workers)
    repaired = []

    @daifu.on(ValueError)
    def repair(crash):
        assert crash.kind == "loop-header"
        crash.vars["data"].dataset.bad.clear()
        repaired.append(crash.attempt)
        return daifu.RETRY

    with capture() as events:
        got = program["train"](data, wrap)
    corrected = program["train"](program["loader"](workers=workers), wrap)
    assert repaired == [1]
    assert same_run(got, corrected)  # no batch lost, none repeated, the same order
    applied = [e["summary"] for e in events if e["event"] == "patch.applied"]
    assert len(applied) == 1 and "the failed batch is fetched again" in applied[0]
    assert ("tqdm" in wrap) == ("tqdm.__iter__ generator ended" in applied[0])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("wrap", ["plain", "tqdm"])
def test_continue_at_the_loop_header_drops_the_failed_batch(program, workers, wrap):
    data = program["loader"](bad={13}, workers=workers, shuffle=False)

    @daifu.on(ValueError)
    def drop(crash):
        return daifu.CONTINUE

    total, batches = program["train"](data, wrap)
    clean = program["train"](program["loader"](workers=workers, shuffle=False), "plain")[1]
    assert len(batches) == 7
    assert all(torch.equal(x, y) for x, y in zip(batches, clean[:1] + clean[2:]))  # batch 1 dropped


def test_a_retry_whose_fetch_fails_again_is_the_next_attempt(program):
    data = program["loader"](bad={13})
    attempts = []

    @daifu.on(ValueError)
    def repair_on_second_try(crash):
        attempts.append(crash.attempt)
        if crash.attempt == 2:
            crash.vars["data"].dataset.bad.clear()
        return daifu.RETRY

    got = program["train"](data, "plain")
    assert attempts == [1, 2]
    assert same_run(got, program["train"](program["loader"](), "plain"))


def test_an_iterable_dataset_cannot_refetch_and_says_so(program):
    data = torch.utils.data.DataLoader(program["Stream"](), batch_size=4)
    reasons = []

    @daifu.on(ValueError)
    def look(crash):
        reasons.append(crash.retry_reason)
        return daifu.SKIP  # ends the loop

    total, batches = program["train"](data, "plain")
    assert len(batches) == 3
    assert "IterableDataset" in reasons[0] and "CONTINUE" in reasons[0]


def test_a_generator_that_transforms_items_is_not_swapped(program):
    # daifu cannot know what a generator did to each item: retrying the loop
    # over a dead one is refused (it would silently end the loop), not
    # swapped for the iterator it was reading
    data = program["loader"](bad={13})
    reasons = []

    @daifu.on(ValueError)
    def look(crash):
        reasons.append(crash.retry_reason)
        return None

    with crashes(ValueError):
        program["train_prefetched"](data)
    assert "finished generator" in reasons[0] and "prefetch" in reasons[0]


def test_worker_iterators_remember_only_the_batches_in_flight(program):
    it = iter(torch.utils.data.DataLoader(program["Records"](), batch_size=2, num_workers=2))
    for _ in range(5):
        next(it)
    sent = it._daifu_sent
    assert 0 < len(sent) <= it._prefetch_factor * 2 + 1
    assert min(sent) >= it._rcvd_idx - 1
    del it


def test_a_worker_failure_is_reported_with_its_cause_and_its_batch(program):
    # the report's title was torch's wrapper ("Caught ValueError in DataLoader
    # worker process 0. Original Traceback ..." cut short), every line of the
    # loop was marked as failing, and the worker's error, the dataset's frame
    # and the batch's indices were nowhere (nor reachable from the console)
    from daifu.engine.human import _report

    data = program["loader"](bad={13}, workers=2, shuffle=False)
    seen = {}

    @daifu.on(ValueError)
    def look(crash):
        seen["report"] = _report.build(crash)
        seen["worker"] = crash.eval("__worker__")
        seen["exception"] = crash.eval("__exception__")
        crash.vars["data"].dataset.bad.clear()
        return daifu.RETRY

    program["train"](data, "plain")
    report, worker = seen["report"], seen["worker"]
    assert report.title.startswith("ValueError: bad record 13 (in DataLoader worker process ")
    failing = [text for _, text, marked in report.source if marked]
    assert failing == ["    for item in wrapped(data, wrap):"]
    assert worker.error == "ValueError: bad record 13"
    assert worker.indices == list(range(8, 16))
    (file, _line, func, code), = worker.frames[-1:]
    assert (func, code) == ("__getitem__", 'raise ValueError(f"bad record {i}")')
    rendered = report.render()
    assert "raised ValueError: bad record 13" in rendered and "__getitem__" in rendered
    assert "the batch's indices: [8, 9, 10, 11, 12, 13, 14, 15]" in rendered
    assert seen["exception"] is not None and "Caught ValueError" in str(seen["exception"])


REPLACED = '''
import torch
from torch.utils.data import DataLoader

def train(data):
    total = 0.0
    for xb in data:
        total += float(xb.sum()) / float(xb[0, 0] - xb[0, 0])
    return total

def main():
    data = DataLoader(torch.arange(16.0).reshape(8, 2), batch_size=4)
    return train(data)
'''


def test_a_replace_while_a_loader_loop_runs_says_what_it_redraws_once():
    # the note that a retry in a caller makes a new iterator (a new seed)
    # was said twice: once by the replace's redirect, once for the retry
    ns = vaccinate(REPLACED, name="replaced_loader")

    def fixed(data):
        return sum(float(xb.sum()) for xb in data)

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        daifu.replace(crash.globals["train"], fixed)
        return daifu.RETRY

    with capture() as events:
        assert ns["main"]() == float(sum(range(16)))
    notes = " ".join(str(e.get("summary", "")) + str(e.get("note", "")) for e in events)
    assert notes.count("will not be identical to an uninterrupted one") == 1, notes
