"""GradientMonitor watches parameters unfrozen after it starts (gradual unfreezing, ULMFiT-style)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.result import Status


def _run(optimizer_over_all: bool) -> tropt.CheckResult:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    for p in model[0].parameters():
        p.requires_grad_(False)
    params = model.parameters() if optimizer_over_all else filter(lambda p: p.requires_grad, model.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with tropt.GradientMonitor(model, full_every=1) as mon:
        for step in range(4):
            if step == 2:  # unfreeze the first layer halfway
                for p in model[0].parameters():
                    p.requires_grad_(True)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return mon.result()


def test_parameters_unfrozen_later_in_no_optimizer_are_named_never_updated():
    r = _run(optimizer_over_all=False)
    assert r.status is Status.FAIL, r.summary
    assert "never updated" in r.summary and "0.weight" in r.summary and "0.bias" in r.summary
    assert "not in any optimizer param group" in r.summary


def test_parameters_unfrozen_later_in_the_optimizer_pass():
    r = _run(optimizer_over_all=True)
    assert r.status is Status.PASS, r.summary
    assert "frozen on purpose" not in r.summary
    assert r.metrics["parameters"] == 4
