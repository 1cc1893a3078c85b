"""A tiny GAN and its steps for the multi-optimizer tests (issue 28): D steps, then G, each with its optimizer.

``gan_setup(...)`` builds a Setup with the two optimizers given to the Setup (a tuple or a dict), or with G's
optimizer built by the step and kept on ``ctx.opt_g``. The latent noise is part of each batch, so a rerun of a step
from the same state sees the same noise.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import tropt

NZ, DIM = 4, 6


class TinyGAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.netG = nn.Sequential(nn.Linear(NZ, 8), nn.ReLU(), nn.Linear(8, DIM))
        self.netD = nn.Sequential(nn.Linear(DIM, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.netG(z)


def gan_batches(n: int = 4, size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(size, DIM, generator=g) + 1.0, torch.randn(size, NZ, generator=g)) for _ in range(n)]


def gan_loss(m: TinyGAN, batch: Any) -> torch.Tensor:
    real, z = batch
    fake = m.netG(z)
    ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
    d = (F.binary_cross_entropy_with_logits(m.netD(real), ones)
         + F.binary_cross_entropy_with_logits(m.netD(fake.detach()), zeros))
    return d + F.binary_cross_entropy_with_logits(m.netD(fake), ones)


def opt_d(m: TinyGAN) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.netD.parameters(), lr=1e-2)


def opt_g(m: TinyGAN) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.netG.parameters(), lr=1e-2)


def gan_step(zero_d: bool = True, zero_g: bool = True, g_on_ctx: bool = False, carry: dict | None = None) -> Any:
    """The DCGAN order: D on real and detached fake, D steps; then G through D, G steps. ``carry`` (a dict the
    step closes over) makes each call scale D's loss by its call count: state carried outside ctx."""
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        m = ctx.model
        if g_on_ctx:
            if getattr(ctx, "opt_g", None) is None:
                ctx.opt_g = opt_g(m)
            d_opt, g_opt = ctx.optimizer, ctx.opt_g
        else:
            d_opt, g_opt = ctx.optimizers
        scale = 1.0
        if carry is not None:
            carry["calls"] = carry.get("calls", 0) + 1
            scale = float(carry["calls"])
        if zero_d:
            d_opt.zero_grad()
        total = torch.zeros(())
        for real, z in micro:
            ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
            fake = m.netG(z)
            err_d = (F.binary_cross_entropy_with_logits(m.netD(real), ones)
                     + F.binary_cross_entropy_with_logits(m.netD(fake.detach()), zeros)) * scale / len(micro)
            err_d.backward()
            total = total + err_d.detach()
        d_opt.step()
        if zero_g:
            g_opt.zero_grad()
        for _, z in micro:
            ones = torch.ones(z.shape[0], 1)
            (F.binary_cross_entropy_with_logits(m.netD(m.netG(z)), ones) / len(micro)).backward()
        g_opt.step()
        return total
    return step


def gan_setup(form: str = "tuple", **step_kw: Any) -> tropt.Setup:
    """``form``: "tuple" (optimizer=(opt_d, opt_g)), "dict" ({"D": ..., "G": ...}) or "ctx" (the Setup is given
    opt_d; the step builds G's and keeps it on ctx.opt_g)."""
    optimizer: Any = {"tuple": (opt_d, opt_g), "dict": {"D": opt_d, "G": opt_g}, "ctx": opt_d}[form]
    return tropt.Setup(TinyGAN(), gan_loss, optimizer, gan_batches(),
                       step=gan_step(g_on_ctx=form == "ctx", **step_kw))
