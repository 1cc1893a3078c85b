"""data.sampling and data.eval_transforms with known answers: each planted defect is caught by exactly its check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import tropt
from tropt.data import check_eval_transforms, check_sampling
from tropt.errors import SetupError
from tropt.result import Status
from tropt.testing import untouched

import contract_cases as cc
from contract_support import caught_by_exactly

DATA_CASES = ["healthy", "class_sorted", "distributed_without_set_epoch", "distributed_with_set_epoch", "tiny_last_batch",
              "weighted_sampler", "val_without_normalisation", "random_val_transform", "declared_tta"]


@pytest.mark.parametrize("case", DATA_CASES)
def test_each_case_is_caught_by_exactly_its_check(case):
    caught_by_exactly(case)


def run(check, setup, **kw):
    with untouched(setup):
        return check(setup, **kw)


# ------------------------------------------------------------------------------------------- data.sampling
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
    s = tropt.Setup(cc.net(), cc.ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [(xs[i:i + 32], ys[i:i + 32]) for i in range(0, 384, 32)])
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


# ------------------------------------------------------------------------------------------- data.eval_transforms
def test_identical_transforms_pass():
    r = run(check_eval_transforms, cc.healthy())
    assert r.status is Status.PASS and r.metrics["features_fail"] == 0 and r.metrics["random_inputs"] == 0, r.summary
    assert "read deterministically" in r.summary


def test_validation_without_normalisation_fails_naming_the_features():
    r = run(check_eval_transforms, cc.val_without_normalisation())
    assert r.status is Status.FAIL and r.metrics["features_fail"] == cc.D
    assert "batch[0] feature" in r.summary and "far beyond sampling noise" in r.summary
    assert "normalisation" in r.advice[0]
    top = r.tables["features"].iloc[0]
    assert top["verdict"] == "fail" and top["std_ratio"] == pytest.approx(cc.STD, rel=0.25)
    r.plot()


class Images(torch.utils.data.Dataset):
    """(3, 4, 4) images with channel means 0.5/0.4/0.3; ``norm`` standardises each channel."""

    def __init__(self, n, seed, norm):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.tensor([0.5, 0.4, 0.3])[:, None, None] + 0.2 * torch.randn(n, 3, 4, 4, generator=g)
        self.y, self.norm = torch.arange(n) % 2, norm

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]
        return ((x - torch.tensor([0.5, 0.4, 0.3])[:, None, None]) / 0.2 if self.norm else x), self.y[i]


def test_images_missing_normalisation_name_the_channels():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 2))
    s = tropt.Setup(model, cc.ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                    DataLoader(Images(256, 0, True), batch_size=32, shuffle=True), val_data=DataLoader(Images(128, 1, False), batch_size=32))
    r = run(check_eval_transforms, s)
    assert r.status is Status.FAIL and "channel" in r.summary
    assert set(r.tables["features"].query("verdict == 'fail'")["index"]) == {0, 1, 2}


def test_random_validation_transform_warns_and_declared_tta_passes():
    r = run(check_eval_transforms, cc.random_val_transform())
    assert r.status is Status.WARN and "random transforms in evaluation" in r.summary
    assert r.tables["randomness"]["differing"].sum() > 0 and "eval_augmentation=True" in r.advice[0]
    tta = run(check_eval_transforms, cc.declared_tta())
    assert tta.status is Status.PASS and "declared test-time augmentation" in tta.summary


def test_shuffled_validation_loader_compares_items_not_batches():
    xv, yv = cc.raw(256, seed=1)
    s = cc.make(val=DataLoader(cc.Items(xv, yv), batch_size=64, shuffle=True))
    r = run(check_eval_transforms, s)
    assert r.status is Status.PASS and "read twice" in r.metrics["random_compared"], r.summary
    s = cc.make(val=DataLoader(cc.Items(xv, yv, transform=cc.noisy), batch_size=64, shuffle=True))
    assert run(check_eval_transforms, s).status is Status.WARN


def test_eval_transforms_skips_without_val_data_and_setup_rejects_tta_without_it():
    r = run(check_eval_transforms, cc.make(val=None, metric=None))
    assert r.status is Status.SKIP and "no val_data" in r.summary
    with pytest.raises(SetupError, match="eval_augmentation=True but there is no val_data"):
        cc.make(val=None, metric=None, eval_augmentation=True)


def test_genuine_small_shift_is_a_warn_not_a_fail():
    xv, yv = cc.raw(256, seed=1)
    xv = xv + 0.6 * cc.STD * (torch.arange(cc.D) == 2)  # feature 2 moved by 0.6 std: a shift, not a missing transform
    r = run(check_eval_transforms, cc.make(val=DataLoader(cc.Items(xv, yv), batch_size=64)))
    assert r.status is Status.WARN and "batch[0] feature 2" in r.summary and "genuine shift" in r.summary
    assert np.isclose(r.tables["features"].iloc[0]["effect"], 0.6, atol=0.2)


def _blocks_of_two_classes():
    """8 classes ordered in blocks of 2 (each batch mixes 2 of the 8): partly ordered, rarely one class per batch."""
    x, y = cc.raw(512, classes=8)
    g = torch.Generator().manual_seed(3)
    order = torch.argsort((y // 2).float() + 0.5 * torch.rand(len(y), generator=g))
    return cc.make(train=DataLoader(cc.Items(x[order], y[order]), batch_size=32), model=cc.net(classes=8), metric=None)


def test_partly_ordered_batches_warn_and_imbalanced_shuffled_data_does_not():
    r = run(check_sampling, _blocks_of_two_classes())
    assert r.status is Status.WARN and "mix classes far less than shuffling would" in r.summary, r.summary
    assert r.metrics["one_class_batches"] < 0.5 and r.metrics["entropy_ratio"] < 0.5 and r.metrics["entropy_deficit_z"] >= 4
    x, y = cc.raw(384, shares=[0.99, 0.01, 0.0, 0.0])  # shuffled, but nearly every batch is one class by chance
    r = run(check_sampling, cc.make(train=DataLoader(cc.Items(x, y), batch_size=32, shuffle=True)))
    assert r.status is Status.PASS, r.summary
    assert r.metrics["shuffled_one_class_batches"] > 0.5  # what shuffling gives: not a defect


def _digits_setup(val_scale: float = 1.0, contiguous: bool = False, unscaled: tuple = ()):
    """sklearn's digits (8x8 images as 64 features, several of them zero in all but a few images), split at random
    (or as two contiguous blocks: the file is ordered by writer); ``unscaled`` pixels of validation left at 0-16."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    perm = torch.arange(len(y)) if contiguous else torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    tr, va = (perm[:512], perm[512:640]) if contiguous else (perm[:1500], perm[1500:])
    if unscaled:
        x[va[:, None], torch.tensor(unscaled)] *= 16.0
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    return tropt.Setup(model, cc.ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       DataLoader(TensorDataset(x[tr], torch.tensor(y)[tr]), batch_size=64, shuffle=True),
                       val_data=DataLoader(TensorDataset(x[va] * val_scale, torch.tensor(y)[va]), batch_size=64))


def test_rare_nonzero_features_of_a_random_split_are_not_a_shift():
    # A feature that is non-zero in a handful of images has a std estimate dominated by those few: its sampling
    # noise is many times the normal-theory value (the kurtosis is ~1/p), so the std ratio of a random split varies a lot.
    r = run(check_eval_transforms, _digits_setup())
    assert r.status is Status.PASS, r.summary
    # ... while the same split with the validation inputs left on the raw 0-16 scale fails, on every varying pixel.
    bad = run(check_eval_transforms, _digits_setup(val_scale=16.0))
    assert bad.status is Status.FAIL and bad.metrics["features_fail"] >= 40, bad.summary


def test_a_contiguous_block_of_ordered_rows_is_another_population_not_a_transform():
    """digits is ordered by writer: its rows 512-640 as validation differ from rows 0-512 on a few pixels, in both
    directions, the rest alike. That is how the split was drawn, not how validation was prepared: WARN with that
    cause (it was a FAIL advising to apply the training preprocessing). The same block with validation left on the
    raw 0-16 scale, or with three pixels left unscaled (moved the same way), is still a transform FAIL."""
    r = run(check_eval_transforms, _digits_setup(contiguous=True))
    assert r.status is Status.WARN and r.metrics["pattern"] == "population", r.summary
    assert "another population, not prepared differently" in r.summary and "drawn" in r.advice[0]
    for kw in ({"val_scale": 16.0}, {"unscaled": (20, 21, 28)}):
        bad = run(check_eval_transforms, _digits_setup(contiguous=True, **kw))
        assert bad.status is Status.FAIL and bad.metrics["pattern"] == "transform", (kw, bad.summary)
        assert "Apply the training transform's preprocessing" in bad.advice[0]
