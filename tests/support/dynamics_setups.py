"""A least-squares Setup with known answers for the dynamics checks: SGD diverges above lr 1, converges at 0.1."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt

MAX_STABLE_LR = 1.0  # SGD on this least-squares problem: 2 / (largest Hessian eigenvalue ≈ 2) — above it, divergence
KNOWN_GOOD_LR = 0.1  # converges within the probe (asserted in test_loss_curve.py)


def linreg_setup(lr, *, seed=0, scheduler=None, step=None, accumulation_steps=1, val=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(1024, 1, generator=g)
    ds = torch.utils.data.TensorDataset(x, y)
    dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True)
    torch.manual_seed(seed)
    model = nn.Linear(16, 1)
    return tropt.Setup(model, lambda m, b: F.mse_loss(m(b[0]), b[1]), lambda m: torch.optim.SGD(m.parameters(), lr=lr),
                       dl, val_data=torch.utils.data.DataLoader(ds, batch_size=256) if val else None,
                       scheduler=scheduler, step=step, accumulation_steps=accumulation_steps, seed=seed)
