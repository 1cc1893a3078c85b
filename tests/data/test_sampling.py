"""data.sampling with known answers: class-sorted, unshuffled and partly ordered loaders, set_epoch, a tiny last
batch beside BatchNorm, sampler weights, and the label rule."""

from __future__ import annotations

import pytest
import torch
from support import contract_cases as cc
from support.split_runs import run
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import tropt
from tropt.data import check_eval_transforms, check_sampling
from tropt.errors import SetupError
from tropt.result import Status


def test_shuffled_loader_passes_with_the_evidence():
    r = run(check_sampling, cc.healthy())
    assert r.status is Status.PASS, r.summary
    assert r.metrics["same_order_every_pass"] is False and r.metrics["one_class_batches"] == 0.0
    assert r.metrics["classes"] == cc.C and r.metrics["label_source"] == "every dataset item"
    assert 0.8 < r.metrics["entropy_ratio"] < 1.2


def test_class_sorted_loader_fails_with_one_class_batches():
    r = run(check_sampling, cc.class_sorted())
    assert r.status is Status.FAIL
    assert "hold a single class while the data has 4 classes" in r.summary and "shuffle=True" in r.advice[0]
    batches = r.tables["batches"]
    assert (batches["classes"] == 1).mean() >= 0.5 and r.metrics["shuffled_one_class_batches"] == 0.0
    assert r.metrics["same_order_every_pass"] is True  # an unshuffled loader also repeats its order
    r.plot()


def test_distributed_sampler_without_set_epoch_warns_and_with_it_passes():
    r = run(check_sampling, cc.distributed_without_set_epoch())
    assert r.status is Status.WARN and "DistributedSampler's set_epoch is never called" in r.summary
    assert "set_epoch(epoch)" in r.advice[0] and r.tables["order"]["same"].all()
    declared = run(check_sampling, cc.distributed_without_set_epoch(), set_epoch=True)  # the user's loop calls it
    assert declared.status is Status.PASS, declared.summary
    s = cc.distributed_with_set_epoch()  # a loader that calls set_epoch each pass (Accelerate/Lightning style)
    epoch = s.train_data.sampler.epoch
    assert run(check_sampling, s).status is Status.PASS
    assert s.train_data.sampler.epoch == epoch  # the sampler's epoch is put back


@pytest.mark.parametrize("n, last, words", [(385, 1, "raises on a batch of 1"), (386, 2, "noise at this size")])
def test_tiny_last_batch_with_batchnorm_warns_with_drop_last(n, last, words):
    r = run(check_sampling, cc.tiny_last_batch(n))
    assert r.status is Status.WARN and f"holds {last} sample(s) of 32" in r.summary and words in r.summary
    assert "drop_last=True" in r.advice[0] and r.metrics["last_batch_size"] == last


def test_tiny_last_batch_is_fine_with_drop_last_or_without_batchnorm():
    x, y = cc.raw(385)
    dropped = cc.make(train=DataLoader(cc.Items(x, y), batch_size=32, shuffle=True, drop_last=True))
    assert run(check_sampling, dropped).status is Status.PASS
    no_bn = cc.make(train=DataLoader(cc.Items(x, y), batch_size=32, shuffle=True), model=cc.net(bn=False))
    r = run(check_sampling, no_bn)
    assert r.status is Status.PASS and r.metrics["last_batch_size"] == 1 and r.metrics["batch_dependent_layers"] == 0


def test_weighted_sampler_is_information_with_the_effective_distribution():
    r = run(check_sampling, cc.weighted_sampler())
    assert r.status is Status.PASS and "the sampler's weights change the class balance" in r.summary
    dist = r.tables["class_distribution"].set_index("class")
    assert dist.loc[0, "data_share"] == pytest.approx(0.25)
    assert dist.loc[0, "sampled_share"] == pytest.approx(0.75)  # 9 / (9 + 3): exact, from the weights


def test_labels_by_the_documented_rule_and_skip_without_them():
    x, y = cc.raw()
    xs = cc.normalise(x)
    dict_batches = [{"x": xs[i:i + 32], "label": y[i:i + 32]} for i in range(0, 384, 32)]
    s = tropt.Setup(cc.net(), lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]), b["label"]),
                    lambda m: torch.optim.SGD(m.parameters(), lr=0.1), dict_batches)
    r = run(check_sampling, s)
    assert r.status is Status.PASS and r.metrics["classes"] == cc.C and "given order" in r.summary
    reg = tropt.Setup(torch.nn.Linear(cc.D, 1), lambda m, b: torch.nn.functional.mse_loss(m(b[0]).squeeze(1), b[1]),
                      lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                      DataLoader(TensorDataset(xs, y.float()), batch_size=32, shuffle=True))
    r = run(check_sampling, reg)
    assert r.status is Status.SKIP and "floating point" in r.summary and "regression" in r.summary
    assert r.metrics["same_order_every_pass"] is False  # the label-free parts still ran


def test_sorted_list_of_batches_fails_too():
    x, y = cc.raw()
    order = y.argsort(stable=True)
    xs, ys = cc.normalise(x)[order], y[order]
    s = tropt.Setup(cc.net(), cc.ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                    [(xs[i:i + 32], ys[i:i + 32]) for i in range(0, 384, 32)])
    assert run(check_sampling, s).status is Status.FAIL


class Empty(IterableDataset):
    def __iter__(self):
        return iter([])


def test_a_loader_that_yields_no_batches_is_a_clear_error():
    s = cc.make(train=DataLoader(Empty(), batch_size=4))
    with pytest.raises(SetupError, match="train_data yielded no batches"):
        check_sampling(s)
    s = cc.make(val=DataLoader(Empty(), batch_size=4))
    with pytest.raises(SetupError, match="val_data yielded no batches"):
        check_eval_transforms(s)
    report = tropt.diagnose(cc.make(train=DataLoader(Empty(), batch_size=4)), checks=["data.sampling"], progress=False)
    assert report["data.sampling"].status is Status.ERROR and "yielded no batches" in report["data.sampling"].summary


def _blocks_of_two_classes():
    """8 classes ordered in blocks of 2 (each batch mixes 2 of the 8): partly ordered, rarely one class per batch."""
    x, y = cc.raw(512, classes=8)
    g = torch.Generator().manual_seed(3)
    order = torch.argsort((y // 2).float() + 0.5 * torch.rand(len(y), generator=g))
    return cc.make(train=DataLoader(cc.Items(x[order], y[order]), batch_size=32), model=cc.net(classes=8), metric=None)


def test_partly_ordered_batches_warn_and_imbalanced_shuffled_data_does_not():
    r = run(check_sampling, _blocks_of_two_classes())
    assert r.status is Status.WARN and "mix classes far less than shuffling would" in r.summary, r.summary
    assert (r.metrics["one_class_batches"] < 0.5 and r.metrics["entropy_ratio"] < 0.5
            and r.metrics["entropy_deficit_z"] >= 4)
    x, y = cc.raw(384, shares=[0.99, 0.01, 0.0, 0.0])  # shuffled, but nearly every batch is one class by chance
    r = run(check_sampling, cc.make(train=DataLoader(cc.Items(x, y), batch_size=32, shuffle=True)))
    assert r.status is Status.PASS, r.summary
    assert r.metrics["shuffled_one_class_batches"] > 0.5  # what shuffling gives: not a defect
