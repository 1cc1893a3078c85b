"""data.eval_transforms with known answers: validation data prepared unlike training data, random transforms in
evaluation, declared test-time augmentation, and genuine shifts between the splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import contract_cases as cc
from support.split_runs import run
from torch.utils.data import DataLoader, TensorDataset

import tropt
from tropt.data import check_eval_transforms
from tropt.errors import SetupError
from tropt.result import Status


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
                    DataLoader(Images(256, 0, True), batch_size=32, shuffle=True),
                    val_data=DataLoader(Images(128, 1, False), batch_size=32))
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
    # noise is many times the normal-theory value (the kurtosis is ~1/p), so the std ratio of a random split varies
    # a lot.
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


def _token_setup(val_as_list: bool = False):
    """Token ids (int64) and labels only: no floating-point input whose statistics could be compared."""
    g = torch.Generator().manual_seed(0)
    ids, y = torch.randint(0, 50, (256, 12), generator=g), torch.randint(0, 2, (256,), generator=g)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Flatten(), torch.nn.Linear(96, 2))
    val = DataLoader(TensorDataset(ids[192:], y[192:]), batch_size=32)
    return tropt.Setup(model, cc.ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                       DataLoader(TensorDataset(ids[:192], y[:192]), batch_size=32, shuffle=True),
                       val_data=list(val) if val_as_list else val)


@pytest.mark.parametrize("val_as_list", [False, True], ids=["val_loader", "val_list"])
def test_token_ids_only_is_a_skip_that_says_nothing_was_compared(val_as_list):
    r = run(check_eval_transforms, _token_setup(val_as_list))
    assert r.status is Status.SKIP, r.summary
    assert "no floating-point input" in r.summary and "nothing was compared" in r.summary
    assert r.metrics["features_compared"] == 0 and r.metrics["random_samples_compared"] == 0
