"""data.sampling names a missing ``set_epoch`` only when calling it on a copy of the sampler changes the order
(issue 27 §2, "confirm the fix"); a sampler that never reshuffles is named for that instead."""

from __future__ import annotations

import torch
from support import contract_cases as cc
from support.split_runs import run
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from tropt.data import check_sampling
from tropt.result import Status


def test_a_missing_set_epoch_is_confirmed_on_a_copy_of_the_sampler():
    s = cc.distributed_without_set_epoch()
    sampler = s.train_data.sampler
    r = run(check_sampling, s)
    assert r.status is Status.WARN and r.metrics["cause"] == "set_epoch_not_called", r.summary
    assert r.metrics["confirmed"] is True
    assert "confirmed: with DistributedSampler.set_epoch(epoch + 1) on a copy of the sampler the order changes" \
        in r.summary
    assert sampler.epoch == 0  # the copy's epoch moved, not the user's


def test_an_unshuffled_distributed_sampler_is_not_blamed_on_set_epoch():
    x, y = cc.raw()
    ds = cc.Items(x, y)
    s = cc.make(train=DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds, num_replicas=1, rank=0,
                                                                               shuffle=False)))
    r = run(check_sampling, s)
    assert r.status is Status.WARN and r.metrics["same_order_every_pass"] is True, r.summary
    assert r.metrics["confirmed"] is False and r.metrics["cause"] == "no_shuffle"
    assert "set_epoch is never called" not in r.summary and "not confirmed" in r.summary
    assert "shuffle=False" in r.summary and "shuffle=True" in r.advice[0]


class GeneratorSampler(Sampler):
    """A sampler with its own generator whose order ignores the epoch it is given."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0
        self.generator = torch.Generator().manual_seed(3)
        self.order = torch.randperm(n, generator=self.generator).tolist()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        torch.randperm(self.n, generator=self.generator)  # advances the generator, order stays fixed
        return iter(self.order)

    def __len__(self) -> int:
        return self.n


def test_confirming_on_a_copy_leaves_the_samplers_generator_alone():
    x, y = cc.raw()
    ds = cc.Items(x, y)
    sampler = GeneratorSampler(len(ds))
    s = cc.make(train=DataLoader(ds, batch_size=32, sampler=sampler))
    before = sampler.generator.get_state()
    r = check_sampling(s)
    assert r.metrics["cause"] == "no_shuffle" and r.metrics["confirmed"] is False, r.summary
    assert "set_epoch is never called" not in r.summary
    assert torch.equal(sampler.generator.get_state(), before) and sampler.epoch == 0
