"""data.near_duplicates on small images: an average hash of an 8x8 digit is too coarse to decide alone (different
handwriting of one digit hashes identically), so a hash match needs the per-sample correlation to confirm it; planted
brightness/contrast/noise copies are still found, exactly. Splits whose images differ in shape are this check's FAIL."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tropt
from tropt.data import check_near_duplicates
from tropt.result import Status

sklearn = pytest.importorskip("sklearn.datasets")


def digits():
    x, y = sklearn.load_digits(return_X_y=True)
    return x.reshape(-1, 1, 8, 8).astype(np.float32), y


def split(seed: int):
    from sklearn.model_selection import train_test_split

    x, y = digits()
    a, b = train_test_split(np.arange(len(y)), test_size=0.25, random_state=seed)
    return x, y, a, b


def as_splits(x_train, y_train, x_test, y_test) -> dict:
    return {"train": (torch.tensor(x_train), torch.tensor(y_train)),
            "test": (torch.tensor(x_test), torch.tensor(y_test))}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_split_of_digits_has_no_near_duplicates(seed):
    x, y, a, b = split(seed)
    r = check_near_duplicates(as_splits(x[a], y[a], x[b], y[b]), label=1, progress=False)
    assert r.status is Status.PASS, r.summary
    assert r.metrics["hash_only_rejected.test_in_train"] > 0  # hash-identical different handwriting, not confirmed


@pytest.mark.parametrize("kind", ["brightness", "contrast", "noise"])
def test_planted_near_copies_of_digits_are_found_exactly(kind):
    x, y, a, b = split(0)
    src = a[:20]
    copies = x[src].copy()
    if kind == "brightness":
        copies += 2.0
    elif kind == "contrast":
        copies = copies * 1.3 + 1.0
    else:
        copies += np.random.default_rng(0).normal(0, 0.1, copies.shape).astype(np.float32)
    x_test, y_test = np.concatenate([x[b], copies]), np.concatenate([y[b], y[src]])
    r = check_near_duplicates(as_splits(x[a], y[a], x_test, y_test), label=1, progress=False)
    assert r.status is Status.FAIL and r.metrics["leaked_rows"] == 20, r.summary
    found = r.tables["near_duplicates"]
    assert set(found["row"]) == set(range(len(b), len(b) + 20))
    assert dict(zip(found["row"], found["earlier_row"])) == {len(b) + i: i for i in range(20)}  # each its own source


def test_images_of_different_shapes_fail_in_near_duplicates_only():
    g = torch.Generator().manual_seed(0)
    splits = {"train": (torch.rand(200, 3, 8, 8, generator=g), torch.randint(0, 3, (200,), generator=g)),
              "test": (torch.rand(60, 3, 9, 9, generator=g), torch.randint(0, 3, (60,), generator=g))}
    r = check_near_duplicates(splits, label=1, progress=False)
    assert r.status is Status.FAIL, r.summary
    assert "3×8×8" in r.summary and "3×9×9" in r.summary and "not prepared alike" in r.summary
    assert r.metrics["sample_shape.test"] == "3×9×9" and "Resize" in r.advice[0]
    report = tropt.diagnose(splits=splits, label=1, progress=False)
    others = [x for x in report.results if x.check.startswith("data.") and x.check != "data.near_duplicates"]
    assert not [x.check for x in others if x.status in (Status.FAIL, Status.ERROR)]
    assert not [x.check for x in others if "3×9×9" in x.summary]


def test_sequences_of_different_lengths_are_a_warn():
    g = torch.Generator().manual_seed(0)
    splits = {"train": (torch.randn(100, 2, 20, generator=g), torch.randint(0, 2, (100,), generator=g)),
              "test": (torch.randn(40, 2, 24, generator=g), torch.randint(0, 2, (40,), generator=g))}
    r = check_near_duplicates(splits, progress=False)  # (X, y) pairs: y is the label
    assert r.status is Status.WARN and "40 values" in r.summary and "48 values" in r.summary


def test_channel_first_train_and_channel_last_test_are_a_shape_finding():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(260, 3, 8, 8, generator=g)
    splits = {"train": (x[:200], torch.zeros(200)), "test": (x[200:].permute(0, 2, 3, 1).contiguous(), torch.zeros(60))}
    r = check_near_duplicates(splits, progress=False)
    assert r.status is Status.FAIL and "3×8×8" in r.summary and "8×8×3" in r.summary, r.summary
