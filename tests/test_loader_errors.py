"""A Dataset whose __getitem__ raises, and DataLoader workers that raise or die: every setup check is an ERROR that
names train_data or val_data and the sample (or batch), not "this is unexpected: report it to tropt"."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tropt
from tropt.loader_errors import loading_error

CHECKS = ["model.init_loss", "loop.resume"]


class _Samples(Dataset):
    def __init__(self, bad: int | None = None, kill: int | None = None) -> None:
        self.bad, self.kill = bad, kill

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        if i == self.bad:
            raise ValueError(f"corrupt record {i}")
        if i == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)  # only ever in a worker process
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), i % 3


def _setup(train, val=None) -> tropt.Setup:
    torch.manual_seed(0)
    return tropt.Setup(nn.Linear(8, 3), lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1), train, val_data=val)


def _errors(setup) -> list:
    rep = tropt.diagnose(setup, checks=CHECKS, progress=False, budget="quick", threads=1)
    assert [r.status.value for r in rep.results] == ["error"] * len(CHECKS), [r.summary for r in rep.results]
    for r in rep.results:
        assert "report it to tropt" not in " ".join(r.advice), r.advice
    return rep.results


def test_a_raising_getitem_names_train_data_and_the_sample():
    for r in _errors(_setup(DataLoader(_Samples(bad=3), batch_size=8))):
        assert "train_data: reading sample 3 (batch 0 of the epoch) raised ValueError: corrupt record 3" in r.summary
        assert "__getitem__" in r.advice[0]


def test_a_raising_getitem_of_val_data_names_val_data():
    setup = _setup(DataLoader(_Samples(), batch_size=8), DataLoader(_Samples(bad=13), batch_size=8))
    with pytest.raises(ValueError) as info:
        list(setup.batches(which="val", cycle=False))
    err = loading_error(info.value, setup)
    assert err is not None and str(err).startswith("val_data: reading sample 13 (batch 1 of the epoch) raised")


def test_a_worker_that_raises_names_train_data_and_the_batch():
    for r in _errors(_setup(DataLoader(_Samples(bad=11), batch_size=8, num_workers=1))):
        assert r.summary.startswith("could not run: train_data: a DataLoader worker raised reading a batch")
        assert "ValueError: corrupt record 11" in r.summary and "num_workers=0" in r.advice[0]


def test_a_worker_that_dies_names_train_data():
    for r in _errors(_setup(DataLoader(_Samples(kill=2), batch_size=8, num_workers=1))):
        assert "train_data: a DataLoader worker process died reading a batch (batch 0 of the epoch)" in r.summary
        assert "num_workers=0" in r.advice[0]


def test_other_errors_are_left_alone():
    assert loading_error(ValueError("x"), _setup(DataLoader(_Samples(), batch_size=8))) is None
