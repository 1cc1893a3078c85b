"""dynamics.loss_curve with several optimizers (one gradient-norm series) and with objectives that are not an
error measure (a policy-gradient surrogate changes sign)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.dynamics import check_loss_curve


class TwoParts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 1)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


def _batches() -> list:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x.sum(1, keepdim=True)
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]


def _loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def test_two_optimizers_give_one_gradient_norm_series_the_first_optimizers():
    def step(ctx, micro_batches):
        opt_a, opt_b = ctx.optimizers
        x, y = micro_batches[0]
        opt_a.zero_grad()
        F.mse_loss(ctx.model.a(x), y).backward()
        opt_a.step()
        opt_b.zero_grad()
        (1e4 * F.mse_loss(ctx.model.b(x), y)).backward()  # b's gradients are ~1e4 times a's
        opt_b.step()
        return F.mse_loss(ctx.model(x), y).detach()

    torch.manual_seed(0)
    setup = tropt.Setup(TwoParts(), _loss, (lambda m: torch.optim.SGD(m.a.parameters(), lr=0.05),
                                            lambda m: torch.optim.SGD(m.b.parameters(), lr=1e-6)),
                        _batches(), step=step)
    r = check_loss_curve(setup, steps=40, progress=False)
    # Interleaved, half the norms are b's and the 90th percentile is b's scale.
    assert r.metrics["grad_norm_p90"] < 100, r.metrics  # a's norms are O(1); b's are O(1e4)
    assert "(the first of several optimizers)" in r.metrics["grad_norm_from"]


def test_a_flat_objective_that_takes_both_signs_is_a_warn_naming_why():
    import numpy as np
    from support import curves as cf

    from tropt.dynamics import diagnose_curves
    from tropt.result import Status

    rng = np.random.default_rng(0)
    y = np.linspace(0.012, -0.03, 300) + rng.normal(0.0, 0.05, 300)  # a PPO surrogate on a fixed rollout
    r = diagnose_curves(y)
    assert r.metrics["class"] == "flat"
    assert r.status is Status.WARN, r.summary
    assert "takes both signs" in r.summary and "task's own metric" in " ".join(r.advice)
    # Flat and of one sign, even negative (a shifted NLL): still the flat FAIL.
    neg = diagnose_curves(cf.flat(2000) - 3.0)
    assert neg.metrics["class"] == "flat" and neg.status is Status.FAIL
    assert diagnose_curves(cf.flat(2000)).status is Status.FAIL
