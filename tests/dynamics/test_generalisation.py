"""dynamics.loss_curve: labels permuted apart from their inputs are memorised but never generalise. The validation
loss never beats the input-independent baseline (the training class prior) while the training loss falls: FAIL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.dynamics import check_loss_curve, diagnose_curves
from tropt.result import Status
from tropt.testing import untouched

sklearn = pytest.importorskip("sklearn.datasets")


def digits_setup(permute: bool, *, regression: bool = False) -> tropt.Setup:
    x, y = sklearn.load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16, dtype=torch.float32), torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    xt, yt, xv, yv = x[:256], y[:256], x[1200:], y[1200:]
    if permute:  # labels shuffled apart from their inputs in the training split only
        yt = yt[torch.randperm(len(yt), generator=torch.Generator().manual_seed(1))]
    if regression:
        yt, yv = yt.float(), yv.float()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1 if regression else 10))
    loss = ((lambda m, b: F.mse_loss(m(b[0]).squeeze(-1), b[1])) if regression
            else (lambda m, b: F.cross_entropy(m(b[0]), b[1])))
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, yt), batch_size=32, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xv, yv), batch_size=128)
    return tropt.Setup(model, loss, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), train, val_data=val)


def run(setup):
    with untouched(setup):
        return check_loss_curve(setup, steps=300, min_steps=None, progress=False)  # the whole run's evidence


@pytest.mark.parametrize("regression", [False, True], ids=["cross_entropy", "mse"])
def test_permuted_labels_fail_as_not_generalising(regression):
    r = run(digits_setup(True, regression=regression))
    assert r.status is Status.FAIL, r.summary
    assert r.metrics["class"] == "not_generalising"
    assert r.summary.startswith("the model learns nothing that generalises: labels may not match inputs")
    assert r.metrics["val_best_loss"] > r.metrics["val_baseline"] * math.exp(-0.02)
    assert r.metrics["end_loss"] < r.metrics["val_baseline"] / 1.25
    assert any("paired with its own input" in a for a in r.advice)


@pytest.mark.parametrize("regression", [False, True], ids=["cross_entropy", "mse"])
def test_correct_labels_generalise(regression):
    r = run(digits_setup(False, regression=regression))
    assert r.status is not Status.FAIL, r.summary
    assert "not_generalising" not in r.metrics["classes"]
    assert r.metrics["val_below_baseline"] > 0.5  # far below the input-independent loss


def test_the_baseline_is_the_training_prior_scored_on_validation():
    setup = digits_setup(False)
    r = run(setup)
    y_train = torch.cat([b[1] for b in setup.train_data])
    prior = (torch.bincount(y_train, minlength=10).double() + 0.5) / (len(y_train) + 5.0)
    y_val = torch.cat([b[1] for b in list(setup.val_data)[:4]])
    assert r.metrics["val_baseline"] == pytest.approx(float(-prior.log()[y_val].mean()), rel=1e-6)


def test_diagnose_curves_takes_a_baseline():
    train = np.exp(-np.linspace(0, 3, 200)) + 0.01
    flat_val = np.full(15, 2.3) + np.random.default_rng(0).normal(0, 0.005, 15)
    bad = diagnose_curves(train * 2.3, val=flat_val, val_baseline=2.3)
    assert bad.status is Status.FAIL and bad.metrics["class"] == "not_generalising"
    good = diagnose_curves(train * 2.3, val=np.linspace(2.3, 0.5, 15), val_baseline=2.3)
    assert "not_generalising" not in good.metrics["classes"]


def test_the_plot_draws_the_baseline():
    r = diagnose_curves(np.exp(-np.linspace(0, 3, 200)) * 2.3, val=np.full(15, 2.3), val_baseline=2.3)
    ax = r.plot()
    assert "input-independent baseline" in [t.get_text() for t in ax.get_legend().get_texts()]


def cnn_setup(permute: bool) -> tropt.Setup:
    """A small CNN on 1200 digits at a modest learning rate: with permuted labels its training loss falls only a few
    percent below the prior in 300 steps (main called it healthy)."""
    x, y = sklearn.load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16, dtype=torch.float32).reshape(-1, 1, 8, 8), torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    yt = y[:1200][torch.randperm(1200, generator=torch.Generator().manual_seed(1))] if permute else y[:1200]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32 * 64, 10))
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:1200], yt), batch_size=32, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[1300:], y[1300:]), batch_size=128)
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), train, val_data=val)


@pytest.mark.parametrize("permute", [True, False], ids=["permuted", "correct"])
def test_a_cnn_whose_training_loss_falls_only_a_little(permute):
    r = run(cnn_setup(permute))
    if permute:
        assert r.status is Status.FAIL and r.metrics["class"] == "not_generalising", r.summary
        assert r.metrics["train_below_baseline"] < math.log(1.1)  # a small fall, but validation gains nothing
    else:
        assert r.status is Status.PASS, r.summary
