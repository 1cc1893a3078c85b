"""Known-answer training setups for the stage 2-3 checks (small, CPU-fast)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.testing import untouched

D, C, N = 8, 3, 256


def data(n: int = N, seed: int = 0, batch: int = 32, classes: int = C):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    teacher = torch.randn(D, classes, generator=g)
    y = (x @ teacher).argmax(1)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n, batch)]


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def adam(lr: float = 1e-2):
    return lambda m: torch.optim.Adam(m.parameters(), lr=lr)


def mlp(width: int = 64, depth: int = 2, act=nn.ReLU, out: int = C, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers, d = [], D
    for _ in range(depth):
        layers += [nn.Linear(d, width), act()]
        d = width
    layers.append(nn.Linear(d, out))
    return nn.Sequential(*layers)


def setup_for(model: nn.Module, loss=ce, opt=None, batches=None, **kw) -> tropt.Setup:
    return tropt.Setup(model, loss, opt or adam(), batches if batches is not None else data(), **kw)


def healthy() -> tropt.Setup:
    return setup_for(mlp(), num_classes=C)


def run(check, setup, **kw):
    """Every check runs under the shared no-mutation assertion."""
    with untouched(setup):
        return check(setup, progress=False, **kw)


class IgnoresInput(nn.Module):
    """The healthy MLP fed zeros instead of its input: it can only learn the label marginals."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        return self.net(torch.zeros_like(x))


class Detached(nn.Module):
    """A side branch whose output is detached: its parameters require grad but never get one."""

    def __init__(self) -> None:
        super().__init__()
        self.main = mlp()
        self.side = nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, C))

    def forward(self, x):
        return self.main(x) + self.side(x).detach()


def problems(result, column="name"):
    return set(result.tables["problems"][column]) if "problems" in result.tables else set()
