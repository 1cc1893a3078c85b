"""Small comparison problems with known answers (import with ``from support.compare_setups import ...``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def sgd(lr: float = 0.05, momentum: float = 0.0):
    return lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)


def adam(lr: float = 3e-3):
    return lambda m: torch.optim.Adam(m.parameters(), lr=lr)


def make_setup(n_train: int = 256, n_val: int = 64, *, lr: float = 0.05, momentum: float = 0.0, shuffled: bool = True,
               **kwargs) -> tropt.Setup:
    """A 3-class linear-ish problem and an MLP; a shuffled Dataset (seeds change the data order) by default."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_train + n_val, 8, generator=g)
    w = torch.randn(8, 3, generator=g)
    y = (x @ w).argmax(1)
    if shuffled:
        train = torch.utils.data.TensorDataset(x[:n_train], y[:n_train])
    else:
        train = [(x[i:i + 32], y[i:i + 32]) for i in range(0, n_train, 32)]
    val = [(x[n_train:], y[n_train:])]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    kwargs.setdefault("num_classes", 3)
    return tropt.Setup(model, ce, sgd(lr, momentum), train, val, batch_size=32, **kwargs)
