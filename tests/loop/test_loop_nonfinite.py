"""Non-finite values in the loop checks: compared exactly (never hidden by an infinite scale), and a non-finite
gradient is its own finding, never a match."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.loop_cases import mlp_setup
from torch.nn import functional as F

from tropt.loop import check_accumulation, check_ddp, check_resume, check_zero_grad
from tropt.result import Status


def test_non_finite_entries_are_compared_exactly_not_hidden_by_the_scale():
    from tropt.core.compare import compare_tensors, max_rel_error

    inf = float("inf")
    a = {"best": torch.tensor(1.0), "mode_worse": torch.tensor(inf), "w": torch.tensor([1.0, inf, 2.0])}
    b = {"best": torch.tensor(inf), "mode_worse": torch.tensor(inf), "w": torch.tensor([1.0, inf, 2.0])}
    assert max_rel_error(a, b) == 1.0  # inf vs 1 is a full mismatch, not 0 relative to an infinite scale
    table = compare_tensors(a, b).set_index("tensor")
    assert table.loc["best", "rel_error"] == 1.0 and table.loc["mode_worse", "rel_error"] == 0.0
    assert table.loc["w", "rel_error"] == 0.0 and np.isfinite(table[["norm_a", "norm_b", "abs_diff"]].to_numpy()).all()
    b["w"] = torch.tensor([1.5, inf, 2.0])  # finite entries still compared relative to the finite norm
    assert 0.1 < compare_tensors(a, b).set_index("tensor").loc["w", "rel_error"] < 0.3
    assert max_rel_error({"x": torch.tensor(float("nan"))}, {"x": torch.tensor(float("nan"))}) == 0.0


def nan_grad_loss(model, batch):
    x, y = batch
    out = model(x)
    # value 0, gradient NaN: d sqrt(u)/du is inf at u = 0, times du/d(out) = 0
    return F.cross_entropy(out, y) + torch.sqrt((out * 0).pow(2).sum(1)).sum()


@pytest.mark.parametrize("check", [check_zero_grad, check_accumulation, check_resume, check_ddp])
def test_non_finite_gradients_never_pass_and_name_no_other_cause(check):
    setup = mlp_setup(k=2, scheduler=False).replace(loss_fn=nan_grad_loss)
    r = check(setup)
    assert r.status is Status.FAIL and "non-finite" in r.summary and "at step" in r.summary, r.summary
    assert "normalises its loss" not in r.summary and "relative error 0.0e+00" not in r.summary
    assert len(r.tables["nonfinite"]) > 0 and r.metrics["nonfinite_step"] >= 1
    # The same Setup with a finite loss: no such finding.
    assert "non-finite" not in check(mlp_setup(k=2, scheduler=False)).summary
