"""Known-answer cases of stochastic steps (the noise floor, issue 27 §1): a diffusion-like loss that draws its noise
and timesteps per sample from the global RNG, the same with a planted missing ``/K``, a step whose functional
dropout ignores the mode, and a model whose forward updates a buffer (a running input mean, not BatchNorm)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt


class Denoiser(nn.Module):
    """A tiny MLP noise predictor: (noisy x, t / T) -> predicted noise."""

    def __init__(self, d: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d + 1, hidden), nn.SiLU(), nn.Linear(hidden, d))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, t[:, None].float() / 100.0], 1))


_BETAS = torch.linspace(1e-4, 0.2, 100)
_ALPHA_BAR = torch.cumprod(1 - _BETAS, 0)


def diffusion_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The DDPM objective: noise and a timestep drawn per sample (the global RNG), predict the noise."""
    x0 = batch
    noise = torch.randn_like(x0)
    t = torch.randint(0, 100, (x0.shape[0],))
    a = _ALPHA_BAR[t][:, None]
    return F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)


def diffusion_setup(step=None, *, k: int = 4) -> tropt.Setup:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 8, generator=g) * 0.5 + torch.linspace(-1, 1, 8)
    torch.manual_seed(0)
    return tropt.Setup(Denoiser(), diffusion_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
                       [x[i:i + 16] for i in range(0, 64, 16)], step=step, accumulation_steps=k)


def step_diffusion_not_divided(ctx, micro_batches):
    """The planted bug: each micro-batch's loss backpropagated without dividing by K."""
    for mb in micro_batches:
        ctx.loss_fn(ctx.model, mb).backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


class Ema:
    """An EMA of a model's parameters that counts its updates and warms its decay up with them (as diffusers'
    ``EMAModel``): ``decay = min(max_decay, (1 + n) / (10 + n))``."""

    def __init__(self, model: nn.Module, max_decay: float = 0.999) -> None:
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.max_decay, self.optimization_step = max_decay, 0

    @torch.no_grad()
    def step(self, model: nn.Module) -> None:
        self.optimization_step += 1
        decay = min(self.max_decay, (1 + self.optimization_step) / (10 + self.optimization_step))
        for n, p in model.named_parameters():
            self.shadow[n].mul_(decay).add_(p.detach(), alpha=1 - decay)

    def state_dict(self) -> dict:
        return {"shadow": {n: t.clone() for n, t in self.shadow.items()}, "optimization_step": self.optimization_step}

    def load_state_dict(self, state: dict) -> None:
        self.shadow = {n: t.clone() for n, t in state["shadow"].items()}
        self.optimization_step = int(state["optimization_step"])


def step_with_ema(ctx, micro_batches, *, per_micro_batch: bool = False):
    """Accumulate (loss / K), step once, then update the EMA kept on ctx: per step, or (the bug) per micro-batch."""
    if not hasattr(ctx, "ema"):
        ctx.ema = Ema(ctx.model)
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        if per_micro_batch:
            ctx.ema.step(ctx.model)
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    if not per_micro_batch:
        ctx.ema.step(ctx.model)


def step_ema_per_micro_batch(ctx, micro_batches):
    step_with_ema(ctx, micro_batches, per_micro_batch=True)


class RunningCenter(nn.Module):
    """Subtracts a running mean of its inputs, updated in training by every forward (a buffer, not BatchNorm)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(x.mean(0), alpha=0.5)
        return x - self.mean


def running_mean_setup(step=None, *, k: int = 4) -> tropt.Setup:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 6, generator=g) + 2.0
    y = (x[:, 0] > 2.0).long()
    torch.manual_seed(0)
    model = nn.Sequential(RunningCenter(6), nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [(x[i:i + 16], y[i:i + 16])
                                                                           for i in range(0, 64, 16)],
                       step=step, accumulation_steps=k)


class PlainEma:
    """An EMA with a fixed decay and no update counter (timm's ModelEmaV2 style): only its tensors can differ."""

    def __init__(self, model: nn.Module, decay: float = 0.9) -> None:
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.decay = decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for n, p in model.named_parameters():
            self.shadow[n].mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def state_dict(self) -> dict:
        return {n: t.clone() for n, t in self.shadow.items()}

    def load_state_dict(self, state: dict) -> None:
        self.shadow = {n: t.clone() for n, t in state.items()}


def step_plain_ema_before_the_update(ctx, micro_batches):
    """The bug: the EMA updated after every micro-batch's backward, before optimizer.step()."""
    if not hasattr(ctx, "ema"):
        ctx.ema = PlainEma(ctx.model)
    for mb in micro_batches:
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        ctx.ema.update(ctx.model)
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
