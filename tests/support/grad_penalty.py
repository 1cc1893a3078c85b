"""Losses that need autograd inside the loss (issue 28): small CPU setups whose ``loss_fn`` differentiates itself.

- ``wgan_gp_setup``: a WGAN-GP critic (Gulrajani et al. 2017; the ``calc_gradient_penalty`` of
  caogang/wgan-gp's ``gan_toy.py``, paraphrased): ``D(fake).mean() - D(real).mean() + lambda * (||grad_x D(x_hat)|| -
  1)^2`` on random interpolates ``x_hat``, the gradient taken with ``autograd.grad(..., create_graph=True)`` inside
  ``loss_fn``; one optimizer (the critic's), the generator's samples given as data;
- ``double_backprop_setup``: a classifier trained with input-gradient regularisation (Drucker & LeCun's "double
  backpropagation"): cross entropy plus ``lambda * ||d CE / d x||^2``, the gradient taken inside ``loss_fn``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt

D, C = 8, 3


def critic(seed: int = 0, bias: float = 0.0) -> nn.Sequential:
    """A small MLP critic; ``bias`` shifts the hidden pre-activations (a large negative one kills the ReLUs)."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    with torch.no_grad():
        for i in (0, 2):
            net[i].bias.add_(bias)
    return net


def real_fake_batches(n_batches: int = 4, batch: int = 32, seed: int = 0) -> list:
    """(real, fake) pairs: real samples around +1, a fixed generator's samples around 0."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, D, generator=g) + 1.0, torch.randn(batch, D, generator=g)) for _ in range(n_batches)]


def gradient_penalty(model: nn.Module, real: torch.Tensor, fake: torch.Tensor, weight: float = 10.0) -> torch.Tensor:
    eps = torch.rand(real.shape[0], 1, device=real.device)
    x_hat = (eps * real + (1 - eps) * fake).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(model(x_hat).sum(), x_hat, create_graph=True)
    return weight * ((g.norm(2, dim=1) - 1) ** 2).mean()


def wgan_gp_loss(model: nn.Module, batch) -> torch.Tensor:
    real, fake = batch
    return model(fake).mean() - model(real).mean() + gradient_penalty(model, real, fake)


def wgan_gp_setup(model: nn.Module | None = None) -> tropt.Setup:
    """The critic's side of WGAN-GP: Adam(lr=1e-4, betas=(0.5, 0.9)) as the paper trains it (lr raised for speed)."""
    return tropt.Setup(model if model is not None else critic(), wgan_gp_loss,
                       lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, betas=(0.5, 0.9)), real_fake_batches())


def class_batches(n_batches: int = 4, batch: int = 32, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(D, C, generator=g)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, D, generator=g)
        out.append((x, (x @ teacher).argmax(1)))
    return out


def classifier(seed: int = 0, softmax: bool = False) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, C)]
    return nn.Sequential(*layers, *([nn.Softmax(-1)] if softmax else []))


def double_backprop_loss(model: nn.Module, batch, weight: float = 0.01) -> torch.Tensor:
    x, y = batch
    x = x.detach().requires_grad_(True)
    ce = F.cross_entropy(model(x), y)
    (g,) = torch.autograd.grad(ce, x, create_graph=True)
    return ce + weight * g.pow(2).sum(1).mean()


def double_backprop_setup(model: nn.Module | None = None) -> tropt.Setup:
    return tropt.Setup(model if model is not None else classifier(), double_backprop_loss,
                       lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), class_batches(), num_classes=C)
