"""StyleGAN2-style lazy R1 regularisation (held-out probe "gen"): the R1 penalty on real images is applied only every
``d_reg_every``-th iteration (the iteration counter kept on ctx), scaled by d_reg_every; the optimizers' lr/betas
adjusted by the lazy ratio; a non-saturating logistic loss; the generator's EMA copy kept on ctx.

- ``stylegan2_rosinality``: rosinality/stylegan2-pytorch train.py: on a regularisation iteration D takes a *second*
  optimizer step on the R1 loss alone (d_optim.step() twice in that iteration);
- ``stylegan2_lucidrains_fused``: lucidrains/stylegan2-pytorch: every 4th step the gradient penalty is added to the
  discriminator's loss, one D step per iteration.

Planted bug: a checkpoint that saves the networks, g_ema and the optimizers but not the iteration counter (rosinality
reads start_iter back from the checkpoint's file name; a renamed checkpoint restarts it at 0): after a resume the
lazy-regularisation phase and g_ema's schedule shift.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import autograd, nn

import tropt
from ports import Bug, Port

NZ, D_IN = 8, 16


def _data(n: int = 64, batch: int = 16, seed: int = 0) -> list[torch.Tensor]:
    """Batches of 16-dim 'images' in [-1, 1]: one of 4 fixed patterns plus noise (no labels, as an image folder)."""
    protos = torch.randn(4, D_IN, generator=torch.Generator().manual_seed(7)).tanh()
    g = torch.Generator().manual_seed(seed)
    return [(protos[torch.randint(0, 4, (batch,), generator=g)]
             + 0.1 * torch.randn(batch, D_IN, generator=g)).clamp(-1, 1) for _ in range(n // batch)]


class GAN(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(NZ, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, D_IN), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(D_IN, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                                           nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)


def requires_grad(model: nn.Module, flag: bool) -> None:
    for p in model.parameters():
        p.requires_grad = flag


def d_logistic_loss(real_pred: torch.Tensor, fake_pred: torch.Tensor) -> torch.Tensor:
    return F.softplus(-real_pred).mean() + F.softplus(fake_pred).mean()


def d_r1_loss(real_pred: torch.Tensor, real_img: torch.Tensor) -> torch.Tensor:
    (grad_real,) = autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)
    return grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()


def g_nonsaturating_loss(fake_pred: torch.Tensor) -> torch.Tensor:
    return F.softplus(-fake_pred).mean()


@torch.no_grad()
def accumulate(model1: nn.Module, model2: nn.Module, decay: float = 0.999) -> None:
    par1, par2 = dict(model1.named_parameters()), dict(model2.named_parameters())
    for k in par1:
        par1[k].mul_(decay).add_(par2[k].data, alpha=1 - decay)


def _loss(m: GAN, real: torch.Tensor) -> torch.Tensor:
    """d_loss + g_loss without the penalties (what upstream logs as 'd' and 'g')."""
    z = torch.randn(real.shape[0], NZ, device=real.device)
    fake = m.generator(z)
    return d_logistic_loss(m.discriminator(real), m.discriminator(fake.detach())) + \
        g_nonsaturating_loss(m.discriminator(fake))


D_REG_EVERY, R1 = 4, 10.0


def _shares(micro: list) -> list[float]:
    n = [mb.shape[0] for mb in micro]
    return [k / sum(n) for k in n]


def _rosinality_step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    m, (d_optim, g_optim) = ctx.model, ctx.optimizers
    if not hasattr(ctx, "g_ema"):
        ctx.g_ema = copy.deepcopy(m.generator).eval()
        requires_grad(ctx.g_ema, False)
    i = getattr(ctx, "it", 0)
    shares = _shares(micro)
    # D main
    requires_grad(m.generator, False)
    requires_grad(m.discriminator, True)
    m.discriminator.zero_grad()
    total = torch.zeros(())
    for real, w in zip(micro, shares):
        fake = m.generator(torch.randn(real.shape[0], NZ))  # mixing_noise
        d_loss = d_logistic_loss(m.discriminator(real), m.discriminator(fake)) * w
        d_loss.backward()
        total = total + d_loss.detach()
    d_optim.step()
    # D lazy regularisation: a second D step on R1 alone, every d_reg_every iterations
    if i % D_REG_EVERY == 0:
        m.discriminator.zero_grad()
        for real, w in zip(micro, shares):
            real = real.detach().requires_grad_(True)
            real_pred = m.discriminator(real)
            r1_loss = d_r1_loss(real_pred, real)
            ((R1 / 2 * r1_loss * D_REG_EVERY + 0 * real_pred[0]) * w).sum().backward()
        d_optim.step()
    # G main
    requires_grad(m.generator, True)
    requires_grad(m.discriminator, False)
    m.generator.zero_grad()
    for real, w in zip(micro, shares):
        g_loss = g_nonsaturating_loss(m.discriminator(m.generator(torch.randn(real.shape[0], NZ)))) * w
        g_loss.backward()
        total = total + g_loss.detach()
    g_optim.step()
    requires_grad(m.discriminator, True)
    accumulate(ctx.g_ema, m.generator, 0.5 ** (32 / (10 * 1000)))
    ctx.it = i + 1
    return total


def _lucidrains_step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """lucidrains/stylegan2-pytorch Trainer.train: apply_gradient_penalty = steps % 4 == 0, the penalty added to the
    discriminator's loss (one D step); then the generator's; EMA every 10 steps after 20k (here: every step)."""
    m, (d_opt, g_opt) = ctx.model, ctx.optimizers
    if not hasattr(ctx, "g_ema"):
        ctx.g_ema = copy.deepcopy(m.generator).eval()
        requires_grad(ctx.g_ema, False)
    steps = getattr(ctx, "steps", 0)
    apply_gp = steps % 4 == 0
    shares = _shares(micro)
    d_opt.zero_grad()
    total = torch.zeros(())
    for real, w in zip(micro, shares):
        with torch.no_grad():
            fake = m.generator(torch.randn(real.shape[0], NZ))
        real = real.detach().requires_grad_(apply_gp)
        real_out = m.discriminator(real)
        disc_loss = (F.relu(1 + real_out) + F.relu(1 - m.discriminator(fake))).mean()  # lucidrains' hinge
        if apply_gp:
            grads = autograd.grad(real_out, real, grad_outputs=torch.ones_like(real_out), create_graph=True)[0]
            disc_loss = disc_loss + 10 * ((grads.reshape(grads.shape[0], -1).norm(2, dim=1) - 1) ** 2).mean()
        (disc_loss * w).backward()
        total = total + disc_loss.detach() * w
    d_opt.step()
    g_opt.zero_grad()
    for real, w in zip(micro, shares):
        gen_loss = m.discriminator(m.generator(torch.randn(real.shape[0], NZ))).mean()
        (gen_loss * w).backward()
        total = total + gen_loss.detach() * w
    g_opt.step()
    accumulate(ctx.g_ema, m.generator, 0.995)
    ctx.steps = steps + 1
    return total


def _checkpoint(counter: str, keep_counter: bool = True) -> dict:
    """rosinality's torch.save({'g', 'd', 'g_ema', 'g_optim', 'd_optim', 'args'}); the counter as start_iter."""
    def save(ctx):
        state = {"model": ctx.model.state_dict(), "d_optim": ctx.optimizers[0].state_dict(),
                 "g_optim": ctx.optimizers[1].state_dict()}
        if hasattr(ctx, "g_ema"):
            state["g_ema"] = ctx.g_ema.state_dict()
        if keep_counter:
            state["start_iter"] = getattr(ctx, counter, 0)
        return state

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizers[0].load_state_dict(state["d_optim"])
        ctx.optimizers[1].load_state_dict(state["g_optim"])
        if "g_ema" in state:
            ctx.g_ema = copy.deepcopy(ctx.model.generator).eval()
            requires_grad(ctx.g_ema, False)
            ctx.g_ema.load_state_dict(state["g_ema"])
        if "start_iter" in state:
            setattr(ctx, counter, state["start_iter"])
    return {"save_state": save, "load_state": load}


def build_rosinality(keep_counter: bool = True) -> tropt.Setup:
    """rosinality/stylegan2-pytorch train.py train(): D step on d_logistic_loss; every d_reg_every iterations
    d_r1_loss * r1/2 * d_reg_every (+ 0 * real_pred[0]) and a second d_optim.step()
    G step on the non-saturating
    loss
    accumulate(g_ema, g, 0.5 ** (32 / 10k)). Adam with lr * ratio, betas (0 ** ratio, 0.99 ** ratio),
    ratio = reg_every / (reg_every + 1)."""
    torch.manual_seed(0)
    ratio = D_REG_EVERY / (D_REG_EVERY + 1)
    return tropt.Setup(
        GAN(), _loss,
        {"D": lambda m: torch.optim.Adam(m.discriminator.parameters(), lr=2e-3 * ratio,
                                         betas=(0 ** ratio, 0.99 ** ratio)),
         "G": lambda m: torch.optim.Adam(m.generator.parameters(), lr=2e-3 * 4 / 5, betas=(0.0, 0.99 ** (4 / 5)))},
        _data(), step=_rosinality_step, **_checkpoint("it", keep_counter))


def build_lucidrains(keep_counter: bool = True) -> tropt.Setup:
    """lucidrains/stylegan2-pytorch stylegan2_pytorch.py Trainer.train: Adam(lr=2e-4, betas=(0.5, 0.9)) for both,
    hinge D loss, gradient penalty every 4th step added to the D loss, G loss = D(G(z)).mean()."""
    torch.manual_seed(0)
    return tropt.Setup(
        GAN(), _loss,
        {"D": lambda m: torch.optim.Adam(m.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.9)),
         "G": lambda m: torch.optim.Adam(m.generator.parameters(), lr=2e-4, betas=(0.5, 0.9))},
        _data(), step=_lucidrains_step, **_checkpoint("steps", keep_counter))


_NOTES = {"model.overfit_batch": "a GAN's loss has no zero floor: a WARN that the floor cannot be told"}
PORTS = [
    Port("stylegan2_rosinality", "gan", "rosinality/stylegan2-pytorch/train.py", build_rosinality, notes=_NOTES),
    Port("stylegan2_lucidrains_fused", "gan", "lucidrains/stylegan2-pytorch/stylegan2_pytorch/stylegan2_pytorch.py",
         build_lucidrains, notes=_NOTES, bugs=(
             Bug("counter_not_checkpointed", "loop.resume", ("steps",), lambda: build_lucidrains(keep_counter=False),
                 source="rosinality/stylegan2-pytorch takes start_iter from the checkpoint's file name: a checkpoint "
                        "renamed or saved without the iteration restarts the lazy-regularisation counter"),
         )),
]
