"""Diffusion family (issue 28): DDPM training loops, a stochastic step whose noise and timesteps are drawn per sample.

Tiny denoisers on generated 8x8 images; every healthy port must pass every check (the noise floor, issue 27 §1), and
the planted bugs (a loss not divided by K, an EMA updated per micro-batch) must still be found by loop.accumulation.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port


def _images(n: int = 64, seed: int = 0) -> torch.Tensor:
    """Generated 1x8x8 images in [-1, 1]: a blob at a random place (what a tiny denoiser can learn)."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    c = torch.rand(n, 2, generator=g) * 6 + 1
    img = torch.exp(-((yy - c[:, 0, None, None]) ** 2 + (xx - c[:, 1, None, None]) ** 2) / 4.0)
    return (img * 2 - 1)[:, None]


class TinyUNet(nn.Module):
    """A UNet-ish noise predictor: conv down, sinusoidal timestep embedding added, conv up with a skip; GroupNorm."""

    def __init__(self, ch: int = 8) -> None:
        super().__init__()
        self.ch = ch
        self.inp = nn.Conv2d(1, ch, 3, padding=1)
        self.temb = nn.Sequential(nn.Linear(ch, ch * 2), nn.SiLU(), nn.Linear(ch * 2, ch))
        self.down = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.mid = nn.Sequential(nn.GroupNorm(2, ch), nn.SiLU(), nn.Conv2d(ch, ch, 3, padding=1))
        self.up = nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1)
        self.out = nn.Sequential(nn.GroupNorm(2, 2 * ch), nn.SiLU(), nn.Conv2d(2 * ch, 1, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        half = self.ch // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        emb = t.float()[:, None] * freqs[None]
        emb = self.temb(torch.cat([emb.sin(), emb.cos()], 1))
        h0 = self.inp(x) + emb[:, :, None, None]
        h = self.mid(self.down(h0))
        return self.out(torch.cat([self.up(h), h0], 1))


def _linear_alphas(steps: int = 1000) -> torch.Tensor:
    betas = torch.linspace(1e-4, 0.02, steps)  # DDPMScheduler(beta_schedule="linear")
    return torch.cumprod(1 - betas, 0)


def _cosine_alphas(steps: int = 100, s: float = 0.008) -> torch.Tensor:
    x = torch.linspace(0, steps, steps + 1)
    ac = torch.cos(((x / steps) + s) / (1 + s) * math.pi * 0.5) ** 2
    betas = (1 - ac[1:] / ac[:-1]).clamp(0, 0.999)  # lucidrains' cosine_beta_schedule
    return torch.cumprod(1 - betas, 0)


class DiffusersEma:
    """diffusers' EMAModel (paraphrased): shadow parameters, ``optimization_step`` counter, warmup decay
    ``1 - (1 + step / inv_gamma) ** -power`` clamped to [min_decay, max_decay]."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, inv_gamma: float = 1.0, power: float = 0.75) -> None:
        self.shadow = [p.detach().clone() for p in model.parameters()]
        self.decay, self.inv_gamma, self.power, self.optimization_step = decay, inv_gamma, power, 0

    def get_decay(self, step: int) -> float:
        value = 1 - (1 + step / self.inv_gamma) ** -self.power
        return 0.0 if step <= 0 else min(max(value, 0.0), self.decay)

    @torch.no_grad()
    def step(self, parameters) -> None:
        self.optimization_step += 1
        d = self.get_decay(self.optimization_step)
        for s, p in zip(self.shadow, parameters, strict=True):
            s.sub_((1 - d) * (s - p.detach()))

    def state_dict(self) -> dict:
        return {"decay": self.decay, "optimization_step": self.optimization_step,
                "shadow_params": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        self.optimization_step = int(state["optimization_step"])
        self.shadow = [s.clone() for s in state["shadow_params"]]


def _ddpm_loss(alphas: torch.Tensor):
    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        noise = torch.randn_like(batch)  # per-sample noise and timesteps, from the global RNG (as upstream)
        t = torch.randint(0, len(alphas), (batch.shape[0],), device=batch.device)
        a = alphas[t].view(-1, 1, 1, 1)
        noisy = a.sqrt() * batch + (1 - a).sqrt() * noise  # noise_scheduler.add_noise
        return F.mse_loss(model(noisy, t), noise)
    return loss_fn


def _diffusers_step(*, divide: bool = True, ema_per_micro_batch: bool = False):
    def step(ctx, micro_batches):
        if not hasattr(ctx, "ema_model"):
            ctx.ema_model = DiffusersEma(ctx.model)
        for i, mb in enumerate(micro_batches):
            loss = ctx.loss_fn(ctx.model, mb)
            (loss / len(micro_batches) if divide else loss).backward()  # accelerator.backward inside accumulate()
            last = i == len(micro_batches) - 1  # accelerator.sync_gradients
            if last:
                torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
                ctx.optimizer.step()
                ctx.scheduler.step()
                ctx.optimizer.zero_grad()
            if ema_per_micro_batch or last:  # upstream: `if accelerator.sync_gradients: ema_model.step(...)`
                ctx.ema_model.step(ctx.model.parameters())
    return step


def _warmup_cosine(warmup: int = 5, total: int = 100):
    def f(s: int) -> float:
        return (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))
    return lambda o: torch.optim.lr_scheduler.LambdaLR(o, f)


def _checkpoint(ema_attr: str, make_ema, *, rng: bool):
    """save_state/load_state holding the model, optimizer, scheduler and the EMA (upstream saves the EMA with the
    accelerator state: diffusers' save_model_hook, lucidrains' Trainer.save); with ``rng``, the RNG states too
    (``accelerator.save_state`` writes random_states_0.pkl; lucidrains' Trainer.save does not)."""
    def save(ctx):
        state = {"model": ctx.model.state_dict(), "opt": ctx.optimizer.state_dict()}
        if rng:
            state["rng"] = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        if ctx.scheduler is not None:
            state["scheduler"] = ctx.scheduler.state_dict()
        if hasattr(ctx, ema_attr):
            state["ema"] = getattr(ctx, ema_attr).state_dict()
        return state

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["opt"])
        if "rng" in state:
            torch.set_rng_state(state["rng"][0])
            np.random.set_state(state["rng"][1])
            random.setstate(state["rng"][2])
        if "scheduler" in state:
            ctx.scheduler.load_state_dict(state["scheduler"])
        if "ema" in state:
            if not hasattr(ctx, ema_attr):
                setattr(ctx, ema_attr, make_ema(ctx.model))
            getattr(ctx, ema_attr).load_state_dict(state["ema"])
    return {"save_state": save, "load_state": load}


def _diffusers_setup(**kw) -> tropt.Setup:
    x = _images(64, seed=1)
    torch.manual_seed(0)
    return tropt.Setup(TinyUNet(), _ddpm_loss(_linear_alphas()),
                       lambda m: torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.95, 0.999), weight_decay=1e-6,
                                                   eps=1e-8),
                       [x[i:i + 16] for i in range(0, 64, 16)], scheduler=_warmup_cosine(),
                       step=_diffusers_step(**kw), accumulation_steps=2, grad_clip=1.0,
                       **_checkpoint("ema_model", DiffusersEma, rng=True))


def build_diffusers_unconditional() -> tropt.Setup:
    """Follows diffusers' examples/unconditional_image_generation/train_unconditional.py: DDPMScheduler (linear
    betas, 1000 steps) add_noise with noise and a timestep per sample, MSE on the noise, AdamW, warmup+cosine LR,
    clip 1.0 and the EMA (EMAModel, warmup decay) stepped once per optimizer step, with gradient accumulation."""
    return _diffusers_setup()


class LucidEma:
    """ema_pytorch's EMA (paraphrased): an EMA copy with a ``step`` counter and ``initted`` flag, beta 0.995,
    copied straight from the model until ``update_after_step``."""

    def __init__(self, model: nn.Module, beta: float = 0.995, update_after_step: int = 0) -> None:
        self.ema = [p.detach().clone() for p in model.parameters()]
        self.beta, self.update_after_step, self.step_count = beta, update_after_step, 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.step_count += 1
        for e, p in zip(self.ema, model.parameters(), strict=True):
            if self.step_count <= self.update_after_step:
                e.copy_(p.detach())
            else:
                e.lerp_(p.detach(), 1 - self.beta)

    def state_dict(self) -> dict:
        return {"step": self.step_count, "ema": [e.clone() for e in self.ema]}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step"])
        self.ema = [e.clone() for e in state["ema"]]


def _lucid_loss(alphas: torch.Tensor):
    snr = alphas / (1 - alphas)
    weight = snr.clamp(max=5.0) / snr  # min-SNR loss weight for objective pred_noise

    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        t = torch.randint(0, len(alphas), (batch.shape[0],))
        noise = torch.randn_like(batch)
        a = alphas[t].view(-1, 1, 1, 1)
        out = model(a.sqrt() * batch + (1 - a).sqrt() * noise, t)
        loss = F.mse_loss(out, noise, reduction="none").mean(dim=(1, 2, 3))  # per sample
        return (loss * weight[t]).mean()
    return loss_fn


def _lucid_step(ctx, micro_batches):
    if not hasattr(ctx, "ema"):
        ctx.ema = LucidEma(ctx.model)
    for mb in micro_batches:  # for _ in range(gradient_accumulate_every)
        loss = ctx.loss_fn(ctx.model, mb) / len(micro_batches)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()
    ctx.ema.update(ctx.model)


def build_lucidrains_trainer() -> tropt.Setup:
    """Follows lucidrains/denoising-diffusion-pytorch's Trainer.train and GaussianDiffusion.p_losses: cosine beta
    schedule, a timestep and noise per sample, per-sample MSE weighted by min-SNR, loss / gradient_accumulate_every,
    clip 1.0, Adam(betas=(0.9, 0.99)), then ema.update() once per optimizer step."""
    x = _images(64, seed=2)
    torch.manual_seed(0)
    return tropt.Setup(TinyUNet(), _lucid_loss(_cosine_alphas()),
                       lambda m: torch.optim.Adam(m.parameters(), lr=8e-5, betas=(0.9, 0.99)),
                       [x[i:i + 16] for i in range(0, 64, 16)], step=_lucid_step, accumulation_steps=2, grad_clip=1.0,
                       **_checkpoint("ema", LucidEma, rng=False))


_DIFFUSERS = "huggingface/diffusers/examples/unconditional_image_generation/train_unconditional.py"
PORTS = [
    Port("ddpm_diffusers_unconditional", "diffusion", _DIFFUSERS, build_diffusers_unconditional, bugs=(
        Bug("loss_not_divided_by_k", "loop.accumulation", ("summed, not averaged",),
            lambda: _diffusers_setup(divide=False),
            "a hand-written accumulation loop without accelerate's division by gradient_accumulation_steps"),
        Bug("ema_per_micro_batch", "loop.accumulation", ("updated once per micro-batch", "ctx.ema_model"),
            lambda: _diffusers_setup(ema_per_micro_batch=True),
            "ema_model.step() outside `if accelerator.sync_gradients:` (diffusers issue #2433 and its fix)"),
    )),
    Port("ddpm_lucidrains_trainer", "diffusion",
         "lucidrains/denoising-diffusion-pytorch/denoising_diffusion_pytorch/denoising_diffusion_pytorch.py",
         build_lucidrains_trainer),
]
