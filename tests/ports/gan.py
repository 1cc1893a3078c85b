"""GAN-family ports (issue 28): two or more optimizers stepped in one training step.

Each port keeps the upstream loop's order of updates (the discriminator or critic first, then the generator, or
the critic then the actor), with tiny models and generated data. The latent noise each step draws is part of the
batch (one column of generated data per sample) so that a rerun of a step from the same state sees the same noise;
the upstream draws it inside the loop (the step's own randomness is the noise-floor issue's subject, not this one).

- ``dcgan``: pytorch/examples' DCGAN (BCE, D on real then on detached fake, then G), optimizers given to the Setup
  as a dict ``{"D": ..., "G": ...}``;
- ``wgan_gp``: eriklindernoren/PyTorch-GAN's WGAN-GP (a gradient penalty through ``autograd.grad(create_graph=True)``;
  the generator steps every ``n_critic``-th batch); the critic's output bias gets an exactly-zero gradient by design;
- ``wgan_gp_toy``: igul222's improved-WGAN toy loop as caogang/wgan-gp ports it (separate ``backward(mone)`` /
  ``backward(one)`` calls, the critic frozen with ``requires_grad=False`` during the generator's update);
- ``ddpg``: OpenAI Spinning Up's DDPG update (the Q-function's optimizer, then the policy's with Q frozen, then
  Polyak averaging of target networks), optimizers given as a tuple;
- ``dcgan_step_built_g``: DCGAN with the generator's optimizer built by the step on its first call and kept on
  ``ctx`` (``ctx.opt_g``), the pattern of loops that build optimizers where they use them.

Planted bugs: a missing ``netD.zero_grad()`` (the discriminator's gradients then accumulate across
iterations), the generator's optimizer built over the discriminator's parameters (a copy-paste slip reported on the
PyTorch forums: "generator not learning"), and the same missing ``zero_grad`` in the critic of the WGAN-GP port.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

NZ = 8  # latent size
IMG = 8  # image side: 1 x 8 x 8 images


# ------------------------------------------------------------------ data
def _images(n: int = 64, batch: int = 16, seed: int = 0, side: int = IMG) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of (image in [-1, 1], latent noise): blurred blobs at random places, and one z per sample."""
    g = torch.Generator().manual_seed(seed)
    out = []
    yy, xx = torch.meshgrid(torch.arange(side).float(), torch.arange(side).float(), indexing="ij")
    for _ in range(n // batch):
        cy, cx = torch.rand(batch, 1, 1, generator=g) * side, torch.rand(batch, 1, 1, generator=g) * side
        img = torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 4.0) * 2 - 1
        out.append((img.unsqueeze(1), torch.randn(batch, NZ, generator=g)))
    return out


def _points(n: int = 64, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of (2-D point from 8 Gaussians on a circle, latent noise), the improved-WGAN toy data."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        k = torch.randint(0, 8, (batch,), generator=g).float() * (2 * torch.pi / 8)
        x = torch.stack([k.cos(), k.sin()], 1) * 2 + 0.02 * torch.randn(batch, 2, generator=g)
        out.append((x, torch.randn(batch, NZ, generator=g)))
    return out


def _shares(micro: list) -> list[float]:
    sizes = [mb[0].shape[0] for mb in micro]
    return [n / sum(sizes) for n in sizes]


# ------------------------------------------------------------------ DCGAN (pytorch/examples/dcgan/main.py)
class DCGAN(nn.Module):
    """netG: transposed convolutions with BatchNorm and ReLU to a tanh image; netD: strided convolutions with
    BatchNorm and LeakyReLU to a sigmoid probability (both as upstream, at 8 x 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.netG = nn.Sequential(
            nn.ConvTranspose2d(NZ, 8, 4, 1, 0, bias=False), nn.BatchNorm2d(8), nn.ReLU(True),
            nn.ConvTranspose2d(8, 1, 4, 2, 1, bias=False), nn.Tanh())
        self.netD = nn.Sequential(
            nn.Conv2d(1, 4, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(4, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(8, 1, 4, 1, 0, bias=False), nn.Sigmoid())
        for m in self.modules():  # upstream's weights_init
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.normal_(m.weight, 1.0, 0.02)
                nn.init.zeros_(m.bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.netG(z.view(-1, NZ, 1, 1))


def _dcgan_loss(m: DCGAN, batch: Any) -> torch.Tensor:
    """Loss_D + Loss_G, the two numbers upstream prints each iteration."""
    real, z = batch
    fake = m.netG(z.view(-1, NZ, 1, 1))
    p_real, p_fake = m.netD(real).view(-1), m.netD(fake.detach()).view(-1)
    err_d = F.binary_cross_entropy(p_real, torch.ones_like(p_real)) + F.binary_cross_entropy(p_fake,
                                                                                            torch.zeros_like(p_fake))
    p_gen = m.netD(fake).view(-1)
    return err_d + F.binary_cross_entropy(p_gen, torch.ones_like(p_gen))


def _dcgan_step(zero_d: bool = True, opts: Any = None) -> Any:
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        m = ctx.model
        opt_d, opt_g = ctx.optimizers if opts is None else opts(ctx)
        shares = _shares(micro)
        # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
        if zero_d:
            m.netD.zero_grad()
        fakes, err_d = [], torch.zeros(())
        for (real, z), w in zip(micro, shares):
            out = m.netD(real).view(-1)
            err_real = F.binary_cross_entropy(out, torch.ones_like(out)) * w
            err_real.backward()
            fake = m.netG(z.view(-1, NZ, 1, 1))
            out = m.netD(fake.detach()).view(-1)
            err_fake = F.binary_cross_entropy(out, torch.zeros_like(out)) * w
            err_fake.backward()
            fakes.append(fake)
            err_d = err_d + (err_real + err_fake).detach()
        opt_d.step()
        # (2) Update G: maximize log(D(G(z)))
        m.netG.zero_grad()
        err_g = torch.zeros(())
        for fake, w in zip(fakes, shares):
            out = m.netD(fake).view(-1)
            loss = F.binary_cross_entropy(out, torch.ones_like(out)) * w
            loss.backward()
            err_g = err_g + loss.detach()
        opt_g.step()
        return err_d + err_g
    return step


def _adam_d(m: DCGAN) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.netD.parameters(), lr=2e-4, betas=(0.5, 0.999))


def _adam_g(m: DCGAN) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.netG.parameters(), lr=2e-4, betas=(0.5, 0.999))


def build_dcgan(zero_d: bool = True, make_g: Any = _adam_g) -> tropt.Setup:
    """pytorch/examples/dcgan/main.py: per iteration netD.zero_grad(), errD_real = BCE(D(x), 1) backward,
    fake = G(z), errD_fake = BCE(D(fake.detach()), 0) backward, optimizerD.step(); netG.zero_grad(), errG =
    BCE(D(fake), 1) backward, optimizerG.step(); Adam(lr=2e-4, betas=(0.5, 0.999)) for both; N(0, 0.02) init."""
    torch.manual_seed(0)
    return tropt.Setup(DCGAN(), _dcgan_loss, {"D": _adam_d, "G": make_g}, _images(), step=_dcgan_step(zero_d))


def build_dcgan_step_built_g() -> tropt.Setup:
    """pytorch/examples/dcgan/main.py, with optimizerG built by the step on its first call and kept on ctx
    (ctx.opt_g); the Setup is given optimizerD only."""
    def opts(ctx: tropt.StepContext) -> tuple:
        if getattr(ctx, "opt_g", None) is None:
            ctx.opt_g = _adam_g(ctx.model)
        return ctx.optimizer, ctx.opt_g

    torch.manual_seed(0)
    return tropt.Setup(DCGAN(), _dcgan_loss, _adam_d, _images(), step=_dcgan_step(opts=opts))


# ------------------------------------------------------------------ WGAN-GP (eriklindernoren/PyTorch-GAN)
class WGAN(nn.Module):
    """Generator and critic MLPs (upstream's blocks, smaller): the critic ends in a Linear to one score."""

    def __init__(self, data_dim: int = IMG * IMG, hidden: int = 32) -> None:
        super().__init__()
        self.data_dim = data_dim
        self.generator = nn.Sequential(nn.Linear(NZ, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                                       nn.LeakyReLU(0.2), nn.Linear(hidden, data_dim), nn.Tanh())
        self.critic = nn.Sequential(nn.Linear(data_dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden // 2),
                                    nn.LeakyReLU(0.2), nn.Linear(hidden // 2, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)


def _gradient_penalty(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """(||grad_x D(x_hat)||_2 - 1)^2 at random interpolates x_hat of real and fake samples (create_graph=True)."""
    alpha = torch.rand(real.shape[0], 1)
    x_hat = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    out = critic(x_hat)
    grads = torch.autograd.grad(out, x_hat, grad_outputs=torch.ones_like(out), create_graph=True, retain_graph=True,
                                only_inputs=True)[0]
    return ((grads.view(grads.shape[0], -1).norm(2, dim=1) - 1) ** 2).mean()


def _wgan_critic_loss(m: WGAN, batch: Any) -> torch.Tensor:
    """The critic's loss without its penalty: the negated Wasserstein estimate -D(x) + D(G(z)) (upstream logs it)."""
    real, z = batch
    real = real.reshape(real.shape[0], -1)
    return -m.critic(real).mean() + m.critic(m.generator(z).detach()).mean()


def _wgan_gp_step(n_critic: int = 5, lambda_gp: float = 10.0, zero_d: bool = True) -> Any:
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        m = ctx.model
        opt_d, opt_g = ctx.optimizers
        i = getattr(ctx, "it", 0)
        shares = _shares(micro)
        if zero_d:
            opt_d.zero_grad()
        d_total = torch.zeros(())
        for (real, z), w in zip(micro, shares):
            real = real.reshape(real.shape[0], -1)
            fake = m.generator(z)  # upstream does not detach: G's gradients from here are cleared before its step
            gp = _gradient_penalty(m.critic, real, fake.detach())
            d_loss = (-m.critic(real).mean() + m.critic(fake).mean() + lambda_gp * gp) * w
            d_loss.backward()
            d_total = d_total + d_loss.detach()
        opt_d.step()
        opt_g.zero_grad()
        if i % n_critic == 0:  # train the generator every n_critic steps
            for (_, z), w in zip(micro, shares):
                g_loss = -m.critic(m.generator(z)).mean() * w
                g_loss.backward()
            opt_g.step()
        ctx.it = i + 1
        return d_total
    return step


def build_wgan_gp(zero_d: bool = True) -> tropt.Setup:
    """eriklindernoren/PyTorch-GAN implementations/wgan_gp/wgan_gp.py: per batch optimizer_D.zero_grad(), d_loss =
    -mean(D(real)) + mean(D(G(z))) + lambda_gp * gradient_penalty (autograd.grad with create_graph=True),
    optimizer_D.step(); optimizer_G.zero_grad(); every n_critic-th batch g_loss = -mean(D(G(z))),
    optimizer_G.step(); Adam(lr=2e-4, betas=(0.5, 0.999)), lambda_gp = 10, n_critic = 5."""
    torch.manual_seed(0)
    return tropt.Setup(
        WGAN(), _wgan_critic_loss,
        (lambda m: torch.optim.Adam(m.critic.parameters(), lr=2e-4, betas=(0.5, 0.999)),
         lambda m: torch.optim.Adam(m.generator.parameters(), lr=2e-4, betas=(0.5, 0.999))),
        _images(), step=_wgan_gp_step(zero_d=zero_d))


def _toy_step(critic_iters: int = 5, lam: float = 0.1) -> Any:
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        m = ctx.model
        opt_d, opt_g = ctx.optimizers
        i = getattr(ctx, "it", 0)
        one, mone = torch.tensor(1.0), torch.tensor(-1.0)
        for p in m.critic.parameters():  # reset requires_grad (set to False in the generator's update)
            p.requires_grad = True
        m.critic.zero_grad()
        shares = _shares(micro)
        cost = torch.zeros(())
        for (real, z), w in zip(micro, shares):
            d_real = m.critic(real).mean() * w
            d_real.backward(mone)
            with torch.no_grad():
                fake = m.generator(z)
            d_fake = m.critic(fake).mean() * w
            d_fake.backward(one)
            gp = _gradient_penalty(m.critic, real, fake) * lam * w
            gp.backward()
            cost = cost + (d_fake - d_real + gp).detach()
        opt_d.step()
        if (i + 1) % critic_iters == 0:  # every CRITIC_ITERS-th critic update ends the generator iteration
            for p in m.critic.parameters():
                p.requires_grad = False  # to avoid computation
            m.generator.zero_grad()
            for (_, z), w in zip(micro, shares):
                g = m.critic(m.generator(z)).mean() * w
                g.backward(mone)
            opt_g.step()
            for p in m.critic.parameters():
                p.requires_grad = True
        ctx.it = i + 1
        return cost
    return step


def build_wgan_gp_toy() -> tropt.Setup:
    """caogang/wgan-gp gan_toy.py (igul222's improved WGAN, 8 Gaussians): each critic iteration resets the critic's
    requires_grad, netD.zero_grad(), D_real.backward(mone), D_fake (generator under no_grad).backward(one),
    gradient_penalty.backward(), optimizerD.step(); after CRITIC_ITERS of them the critic is frozen
    (requires_grad=False), netG.zero_grad(), G = D(G(z)).mean(), G.backward(mone), optimizerG.step();
    Adam(lr=1e-4, betas=(0.5, 0.9)), LAMBDA = 0.1."""
    torch.manual_seed(0)
    return tropt.Setup(
        WGAN(data_dim=2), _wgan_critic_loss,
        {"D": lambda m: torch.optim.Adam(m.critic.parameters(), lr=1e-4, betas=(0.5, 0.9)),
         "G": lambda m: torch.optim.Adam(m.generator.parameters(), lr=1e-4, betas=(0.5, 0.9))},
        _points(), step=_toy_step())


# ------------------------------------------------------------------ DDPG (openai/spinningup ddpg.py)
class ActorCritic(nn.Module):
    """MLPActorCritic (pi: tanh-squashed deterministic policy scaled to act_limit; q: Q(o, a)) and its target copy
    (requires_grad=False: updated only by Polyak averaging)."""

    def __init__(self, obs: int = 4, act: int = 2, hidden: int = 16) -> None:
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(obs, hidden), nn.ReLU(), nn.Linear(hidden, act), nn.Tanh())
        self.q = nn.Sequential(nn.Linear(obs + act, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.pi_targ = nn.Sequential(nn.Linear(obs, hidden), nn.ReLU(), nn.Linear(hidden, act), nn.Tanh())
        self.q_targ = nn.Sequential(nn.Linear(obs + act, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.pi_targ.load_state_dict(self.pi.state_dict())
        self.q_targ.load_state_dict(self.q.state_dict())
        for p in [*self.pi_targ.parameters(), *self.q_targ.parameters()]:
            p.requires_grad = False

    def forward(self, o: torch.Tensor) -> torch.Tensor:
        return self.pi(o)


def _replay(n: int = 64, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """Replay-buffer samples (o, a, r, o2, d) of a small linear system."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        o = torch.randn(batch, 4, generator=g)
        a = torch.rand(batch, 2, generator=g) * 2 - 1
        o2 = 0.9 * o + 0.1 * torch.cat([a, a], 1)
        r = -(o2 ** 2).sum(1)
        d = (torch.rand(batch, generator=g) < 0.05).float()
        out.append((o, a, r, o2, d))
    return out


def _loss_q(m: ActorCritic, batch: Any, gamma: float = 0.99) -> torch.Tensor:
    o, a, r, o2, d = batch
    q = m.q(torch.cat([o, a], -1)).squeeze(-1)
    with torch.no_grad():  # Bellman backup for Q function
        q_pi_targ = m.q_targ(torch.cat([o2, m.pi_targ(o2)], -1)).squeeze(-1)
        backup = r + gamma * (1 - d) * q_pi_targ
    return ((q - backup) ** 2).mean()


def _loss_pi(m: ActorCritic, batch: Any) -> torch.Tensor:
    o = batch[0]
    return -m.q(torch.cat([o, m.pi(o)], -1)).mean()


def _ddpg_step(polyak: float = 0.995) -> Any:
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        m = ctx.model
        q_opt, pi_opt = ctx.optimizers
        shares = _shares(micro)
        # First run one gradient descent step for Q.
        q_opt.zero_grad()
        total = torch.zeros(())
        for mb, w in zip(micro, shares):
            loss_q = _loss_q(m, mb) * w
            loss_q.backward()
            total = total + loss_q.detach()
        q_opt.step()
        # Freeze Q-network so you don't waste computational effort computing gradients for it during the policy
        # learning step.
        for p in m.q.parameters():
            p.requires_grad = False
        pi_opt.zero_grad()
        for mb, w in zip(micro, shares):
            (_loss_pi(m, mb) * w).backward()
        pi_opt.step()
        for p in m.q.parameters():
            p.requires_grad = True
        with torch.no_grad():  # Finally, update target networks by polyak averaging.
            for src, targ in ((m.pi, m.pi_targ), (m.q, m.q_targ)):
                for p, p_targ in zip(src.parameters(), targ.parameters()):
                    p_targ.data.mul_(polyak)
                    p_targ.data.add_((1 - polyak) * p.data)
        return total
    return step


def build_ddpg() -> tropt.Setup:
    """openai/spinningup spinup/algos/pytorch/ddpg/ddpg.py update(): q_optimizer.zero_grad(), loss_q (Bellman
    backup from the target networks under no_grad) backward, q_optimizer.step(); Q frozen (requires_grad=False),
    pi_optimizer.zero_grad(), loss_pi = -Q(o, pi(o)).mean() backward, pi_optimizer.step(); Q unfrozen; Polyak
    averaging of the targets (polyak=0.995); Adam(pi_lr=1e-3), Adam(q_lr=1e-3)."""
    torch.manual_seed(0)
    return tropt.Setup(
        ActorCritic(), _loss_q,
        (lambda m: torch.optim.Adam(m.q.parameters(), lr=1e-3), lambda m: torch.optim.Adam(m.pi.parameters(), lr=1e-3)),
        _replay(), step=_ddpg_step())


_GAN_NOTES = {
    "model.overfit_batch": "a GAN's loss (D's + G's) has no zero floor: it plateaus well below the zeroed-input "
                           "baseline, a WARN that the floor cannot be told",
    "loop.accumulation": "BatchNorm in D (as upstream): exact once its batch statistics are frozen, a WARN naming it",
}

PORTS = [
    Port("dcgan", "gan", "pytorch/examples/dcgan/main.py", build_dcgan, bugs=(
        Bug("missing_netD_zero_grad", "loop.zero_grad", ("D.step()", "netD.*", "left over from step 1"),
            lambda: build_dcgan(zero_d=False),
            source="pytorch/examples/dcgan/main.py calls netD.zero_grad() first in every iteration; without it the "
                   "discriminator's gradients accumulate across iterations (PyTorch forums, 'Why do we need to call "
                   "zero_grad() in PyTorch?')"),
        Bug("optimizer_g_over_netD", "model.gradient_flow", ("never updated", "netG."),
            lambda: build_dcgan(make_g=lambda m: torch.optim.Adam(m.netD.parameters(), lr=2e-4,
                                                                  betas=(0.5, 0.999))),
            source="optimizerG = optim.Adam(netD.parameters(), ...): the copy-paste slip behind PyTorch forum threads "
                   "'Generator not learning / generator loss not changing'"),
    ), notes=_GAN_NOTES),
    Port("dcgan_step_built_g", "gan", "pytorch/examples/dcgan/main.py", build_dcgan_step_built_g, notes=_GAN_NOTES),
    Port("wgan_gp", "gan", "eriklindernoren/PyTorch-GAN/implementations/wgan_gp/wgan_gp.py", build_wgan_gp, bugs=(
        Bug("missing_critic_zero_grad", "loop.zero_grad", ("optimizers[0].step()", "critic.*", "left over"),
            lambda: build_wgan_gp(zero_d=False),
            source="eriklindernoren/PyTorch-GAN wgan_gp.py calls optimizer_D.zero_grad() first in every batch"),
    ), notes={"model.gradient_flow": "the critic's output bias gets an exactly-zero gradient by design (D(real) and "
                                     "D(fake) terms cancel it): noted in a PASS, not failed"}),
    Port("wgan_gp_toy", "gan", "caogang/wgan-gp/gan_toy.py", build_wgan_gp_toy,
         notes={"dynamics.lr_range": "a critic's loss does not fall in a two-step sweep: no range to read, a WARN"}),
    Port("ddpg", "rl", "openai/spinningup/spinup/algos/pytorch/ddpg/ddpg.py", build_ddpg),
]
