"""VAE family (held-out probe "gen"): a stochastic forward (reparameterisation with randn_like inside forward) and a
sum-reduced loss (BCE sum + KL sum), as pytorch/examples' vae/main.py.

- ``vae``: the upstream loop with the user's own step; K micro-batches' summed losses are simply added (the sum over
  the batch is the upstream objective, so no division);
- ``vae_standard_step``: the same model and loss given with no step (tropt.standard_step), accumulation_steps=1.

Planted bug: the reconstruction term switched to reduction='mean' (per pixel) while the KL stays summed over the batch
and latent dims -- the KL then dominates ~784x (here 64x) and the decoder collapses to the mean image (posterior
collapse); a widely reported slip (PyTorch forums "VAE loss reduction mean vs sum", pytorch/examples issue #395
discussion).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

SIDE = 8
D = SIDE * SIDE


def _images(n: int = 64, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(image in [0, 1] as 1x8x8, label) batches, like MNIST's ToTensor(): a blob at one of 4 quadrant centres."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(SIDE).float(), torch.arange(SIDE).float(), indexing="ij")
    centres = torch.tensor([[2.0, 2.0], [2.0, 5.0], [5.0, 2.0], [5.0, 5.0]])
    out = []
    for _ in range(n // batch):
        y = torch.randint(0, 4, (batch,), generator=g)
        c = centres[y] + 0.5 * torch.randn(batch, 2, generator=g)
        img = torch.exp(-((yy - c[:, 0, None, None]) ** 2 + (xx - c[:, 1, None, None]) ** 2) / 3.0)
        out.append((img.clamp(0, 1).unsqueeze(1), y))
    return out


class VAE(nn.Module):
    """fc1 -> (fc21 mu, fc22 logvar) -> reparameterize -> fc3 -> fc4 -> sigmoid, as upstream (784-400-20 -> 64-16-4)."""

    def __init__(self, hidden: int = 16, latent: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, hidden)
        self.fc21 = nn.Linear(hidden, latent)
        self.fc22 = nn.Linear(hidden, latent)
        self.fc3 = nn.Linear(latent, hidden)
        self.fc4 = nn.Linear(hidden, D)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)  # the step's own randomness, from the global RNG, inside forward (as upstream)
        return mu + eps * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x.view(-1, D))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def _loss_function(recon_x, x, mu, logvar, mean_bce: bool = False) -> torch.Tensor:
    """Reconstruction + KL divergence summed over all elements and the batch (Kingma & Welling, appendix B)."""
    bce = F.binary_cross_entropy(recon_x, x.view(-1, D), reduction="mean" if mean_bce else "sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def _make_loss(mean_bce: bool = False):
    def loss_fn(model: VAE, batch: Any) -> torch.Tensor:
        data, _ = batch
        recon, mu, logvar = model(data)
        return _loss_function(recon, data, mu, logvar, mean_bce)
    return loss_fn


def _vae_step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """upstream train(): optimizer.zero_grad(); loss = loss_function(model(data)); loss.backward(); optimizer.step().
    With K micro-batches the per-micro-batch sums add up to the batch's sum: no division."""
    ctx.optimizer.zero_grad()
    total = torch.zeros(())
    for mb in micro:
        loss = ctx.loss_fn(ctx.model, mb)
        loss.backward()
        total = total + loss.detach()
    ctx.optimizer.step()
    return total


def build_vae(mean_bce: bool = False) -> tropt.Setup:
    """pytorch/examples/vae/main.py: Adam(lr=1e-3); per batch optimizer.zero_grad(), recon, mu, logvar = model(data),
    loss = BCE(recon, x, reduction='sum') + KLD, loss.backward(), optimizer.step()."""
    torch.manual_seed(0)
    return tropt.Setup(VAE(), _make_loss(mean_bce), lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
                       _images(), val_data=_images(32, seed=1), step=_vae_step)


def build_vae_standard_step() -> tropt.Setup:
    """The same VAE given with no step: tropt.standard_step weights each micro-batch's loss by its share."""
    torch.manual_seed(0)
    return tropt.Setup(VAE(), _make_loss(), lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), _images(),
                       val_data=_images(32, seed=1))


_UP = "pytorch/examples/vae/main.py"
PORTS = [
    Port("vae", "vae", _UP, build_vae, bugs=(
        Bug("bce_mean_kl_sum", "model.init_loss", ("KL",), lambda: build_vae(mean_bce=True),
            source="reconstruction loss mean-reduced per pixel while the KL term is summed over batch and latent "
                   "dims: the KL dominates and the decoder collapses (PyTorch forums 'VAE: reduction mean vs sum')"),
    )),
    Port("vae_standard_step", "vae", _UP, build_vae_standard_step),
]
