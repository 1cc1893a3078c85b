"""model.overfit_batch: a loss that rises far above its start diverges (FAIL, never "still falling" or "ignores its
input"); a partly frozen model that fits every label PASSes with a note on the loss floor its frozen layers impose."""

from __future__ import annotations

import torch
from _model_fixtures import C, D, adam, mlp, setup_for
from torch import nn

from tropt.model import check_overfit_batch
from tropt.result import Status
from tropt.testing import untouched


def run(setup, **kw):
    with untouched(setup):
        return check_overfit_batch(setup, progress=False, **kw)


def ascent_step(ctx, micro):
    """A planted sign bug: the step climbs the loss (backward on -loss)."""
    loss = sum(ctx.loss_fn(ctx.model, mb) for mb in micro) / len(micro)
    (-loss).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    return loss


def frozen_head(scale: float = 1.0) -> nn.Module:
    """Trainable tanh features under a frozen linear head: the logits are bounded, so the loss has a floor."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, C))
    with torch.no_grad():
        m[2].weight.mul_(scale)
    for p in m[2].parameters():
        p.requires_grad_(False)
    return m


def trainable_adam(m):
    return torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)


def test_a_loss_rising_far_above_its_start_is_diverging():
    r = run(setup_for(mlp(), opt=adam(1e-3), step=ascent_step))
    assert r.status is Status.FAIL, r.summary
    assert "diverges" in r.summary and "still falling" not in r.summary and "ignores its input" not in r.summary
    assert r.metrics["final_loss"] > 2 * r.metrics["start_loss"]
    assert any("Lower the learning rate" in a for a in r.advice)


def climbing_then_descending(n_up: int):
    """A step that climbs the loss for its first ``n_up`` calls, then descends: the loss blows up, then falls."""
    calls = [0]

    def step(ctx, micro):
        calls[0] += 1
        loss = sum(ctx.loss_fn(ctx.model, mb) for mb in micro) / len(micro)
        (-loss if calls[0] <= n_up else loss).backward()
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
        return loss

    return step


def test_a_loss_that_blew_up_and_is_coming_back_is_not_still_falling():
    """Start 1.14, a peak of thousands, falling again at the end (main said 'still falling ... 2959% of its start')."""
    r = run(setup_for(mlp(), opt=adam(1e-2), step=climbing_then_descending(60)))
    assert r.status is Status.FAIL and "diverge" in r.summary and "still falling" not in r.summary, r.summary
    assert r.metrics["peak_loss"] > 1000 * r.metrics["start_loss"] and 55 <= r.metrics["peak_step"] <= 80


def test_a_healthy_model_does_not_diverge():
    r = run(setup_for(mlp(), opt=adam(1e-2)))
    assert r.status is Status.PASS and "diverge" not in r.summary


def test_a_partly_frozen_model_at_full_accuracy_passes_with_a_floor_note():
    r = run(setup_for(frozen_head(1.0), opt=trainable_adam))
    assert r.status is Status.PASS, r.summary
    assert r.metrics["final_accuracy"] == 1.0 and r.metrics["loss_fraction"] > 0.1  # the floor: not 10% of its start
    assert r.metrics["frozen_parameters"] == 2 and "floor" in r.summary and "2.weight" in r.summary
    assert set(r.tables["frozen"]["parameter"]) == {"2.weight", "2.bias"}


def test_a_frozen_model_that_does_not_fit_every_label_still_fails():
    r = run(setup_for(frozen_head(0.3), opt=trainable_adam))  # accuracy 93.7%: below min_accuracy
    assert r.status is Status.FAIL and "frozen_parameters" not in r.metrics
