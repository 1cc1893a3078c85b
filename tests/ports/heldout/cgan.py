"""Conditional hinge GAN (held-out probe "gen"), BigGAN-PyTorch's training function paraphrased: a class-conditional
generator and a projection discriminator with spectral norm, hinge loss, two Adam optimizers with different learning
rates (TTUR: D 4e-4, G 1e-4, betas (0, 0.999)), num_D_steps discriminator steps per generator step *inside one
iteration* (the batch is split in num_D_steps chunks, one per D step), latent z and fake labels sampled inside the
step (BigGAN's z_.sample_() / y_.sample_()), D frozen with requires_grad=False during G's update (toggle_grad).

Planted bug: G's gradients cleared once at the start of the iteration, and the D step feeding G(z) to D without
detach / no_grad: D's loss backpropagates into G, and those gradients are still there at G.optim.step()
(PyTorch forums "Why do we need to detach the fake in the discriminator step?"; the DCGAN tutorial's comment).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import spectral_norm

import tropt
from ports import Bug, Port

NZ, NC, D_IN = 8, 4, 16  # latent, classes, data dim (4x4 images flattened)


def _data(n: int = 64, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x in [-1, 1] of 16 dims, class label) batches: each class a different 4x4 pattern plus noise."""
    protos = torch.randn(NC, D_IN, generator=torch.Generator().manual_seed(123)).tanh()  # one task for every split
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        y = torch.randint(0, NC, (batch,), generator=g)
        out.append(((protos[y] + 0.1 * torch.randn(batch, D_IN, generator=g)).clamp(-1, 1), y))
    return out


class CGAN(nn.Module):
    """G: z and a shared class embedding -> MLP -> tanh; D: SN-Linear trunk, SN output + projection <embed(y), h>."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.G_embed = nn.Embedding(NC, NZ)
        self.G = nn.Sequential(nn.Linear(2 * NZ, hidden), nn.ReLU(), nn.Linear(hidden, D_IN), nn.Tanh())
        self.D_trunk = nn.Sequential(spectral_norm(nn.Linear(D_IN, hidden)), nn.ReLU(),
                                     spectral_norm(nn.Linear(hidden, hidden)), nn.ReLU())
        self.D_out = spectral_norm(nn.Linear(hidden, 1))
        self.D_embed = spectral_norm(nn.Embedding(NC, hidden))

    def g_params(self):
        return list(self.G_embed.parameters()) + list(self.G.parameters())

    def d_params(self):
        return list(self.D_trunk.parameters()) + list(self.D_out.parameters()) + list(self.D_embed.parameters())

    def generate(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.G(torch.cat([z, self.G_embed(y)], 1))

    def discriminate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.D_trunk(x)
        return self.D_out(h).squeeze(1) + (self.D_embed(y) * h).sum(1)  # projection discriminator

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.generate(z, y)


def loss_hinge_dis(d_fake: torch.Tensor, d_real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return F.relu(1.0 - d_real).mean(), F.relu(1.0 + d_fake).mean()


def loss_hinge_gen(d_fake: torch.Tensor) -> torch.Tensor:
    return -d_fake.mean()


def _loss(m: CGAN, batch: Any) -> torch.Tensor:
    """D's hinge loss (real + fake, fake detached) + G's hinge loss, the numbers BigGAN logs per iteration."""
    x, y = batch
    z = torch.randn(x.shape[0], NZ, device=x.device)
    y_ = torch.randint(0, NC, (x.shape[0],), device=x.device)
    fake = m.generate(z, y_)
    lr_, lf = loss_hinge_dis(m.discriminate(fake.detach(), y_), m.discriminate(x, y))
    return lr_ + lf + loss_hinge_gen(m.discriminate(fake, y_))


def toggle_grad(module_params, on: bool) -> None:
    for p in module_params:
        p.requires_grad = on


def _step(num_d_steps: int = 2, bug: bool = False):
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        m = ctx.model
        opt_d, opt_g = ctx.optimizers
        x = torch.cat([mb[0] for mb in micro])
        y = torch.cat([mb[1] for mb in micro])
        k = len(micro)  # num_D_accumulations / num_G_accumulations
        xs, ys = x.chunk(num_d_steps), y.chunk(num_d_steps)
        if bug:
            opt_g.zero_grad()  # BUG: cleared once, before D's steps leave their gradients in G
        toggle_grad(m.d_params(), True)
        toggle_grad(m.g_params(), bug)  # upstream: toggle_grad(G, False) for the D steps
        total = torch.zeros(())
        for i in range(num_d_steps):
            opt_d.zero_grad()
            for xa, ya in zip(xs[i].tensor_split(k), ys[i].tensor_split(k)):
                w = xa.shape[0] / xs[i].shape[0]
                z = torch.randn(xa.shape[0], NZ)  # z_.sample_()
                y_ = torch.randint(0, NC, (xa.shape[0],))  # y_.sample_()
                if bug:
                    fake = m.generate(z, y_)  # BUG: not detached, G's grads kept
                else:
                    with torch.no_grad():
                        fake = m.generate(z, y_)
                d_real, d_fake = loss_hinge_dis(m.discriminate(fake, y_), m.discriminate(xa, ya))
                d_loss = (d_real + d_fake) * w
                d_loss.backward()
                total = total + d_loss.detach() / num_d_steps
            opt_d.step()
        toggle_grad(m.d_params(), False)
        toggle_grad(m.g_params(), True)
        if not bug:
            opt_g.zero_grad()
        n = x.shape[0]
        for piece in torch.arange(n).tensor_split(k):  # G's batch as many samples as the D chunks together
            z = torch.randn(len(piece), NZ)
            y_ = torch.randint(0, NC, (len(piece),))
            g_loss = loss_hinge_gen(m.discriminate(m.generate(z, y_), y_)) * (len(piece) / n)
            g_loss.backward()
            total = total + g_loss.detach()
        opt_g.step()
        toggle_grad(m.d_params(), True)
        return total
    return step


def build_cgan_hinge(num_d_steps: int = 2, bug: bool = False) -> tropt.Setup:
    """ajbrock/BigGAN-PyTorch train_fns.py GAN_training_function: for each of num_D_steps: D.optim.zero_grad(), for
    each accumulation: sample z_ and y_, D_fake/D_real from G(z_) under no_grad and the real chunk x[counter],
    hinge loss / num_D_accumulations backward
    D.optim.step(). Then toggle D off, G.optim.zero_grad(), G loss
    -mean(D(G(z_), y_)) / num_G_accumulations backward, G.optim.step(). Adam G 1e-4, D 4e-4, betas (0, 0.999);
    spectral norm on every D layer, projection discriminator."""
    torch.manual_seed(0)
    return tropt.Setup(
        CGAN(), _loss,
        {"D": lambda m: torch.optim.Adam(m.d_params(), lr=4e-4, betas=(0.0, 0.999)),
         "G": lambda m: torch.optim.Adam(m.g_params(), lr=1e-4, betas=(0.0, 0.999))},
        _data(), val_data=_data(32, seed=1), step=_step(num_d_steps, bug))


def build_cgan_hinge_one_d_step() -> tropt.Setup:
    """The same loop with num_D_steps=1 (BigGAN's default for its ImageNet configs at large batch is 2; SAGAN's 1)."""
    return build_cgan_hinge(num_d_steps=1)


_UP = "ajbrock/BigGAN-PyTorch/train_fns.py"
_NOTES = {"model.overfit_batch": "a GAN's loss (D's + G's) has no zero floor: a WARN that the floor cannot be told"}
PORTS = [
    Port("cgan_hinge_sn_ttur", "gan", _UP, build_cgan_hinge, notes=_NOTES),
    Port("cgan_hinge_sn_ttur_1d", "gan", _UP, build_cgan_hinge_one_d_step, notes=_NOTES, bugs=(
        Bug("d_loss_into_g_not_detached", "loop.zero_grad", ("G.step()", "G."),
            lambda: build_cgan_hinge(num_d_steps=1, bug=True),
            source="fake not detached in D's step and G.zero_grad() only at the start of the iteration: D's loss "
                   "gradient reaches G's step (PyTorch forums, 'detach() in the DCGAN discriminator step')"),
    )),
]
