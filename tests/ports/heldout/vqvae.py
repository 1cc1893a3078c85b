"""VQ-VAE with an EMA codebook (held-out probe "gen"), rosinality/vq-vae-2-pytorch vqvae.py + train_vqvae.py
paraphrased: Quantize keeps the codebook in buffers (embed, cluster_size, embed_avg) updated by exponential moving
averages inside forward in training mode (all-reduced over processes when distributed, as upstream's dist_fn), never by
the optimizer
the straight-through estimator quantize = input + (quantize - input).detach()
loss = MSE recon +
0.25 * commitment (quantize.detach() - input)^2
model.zero_grad(), backward, Adam(lr=3e-4).step().

Planted bug: the codebook's EMA update not gated by ``self.training`` (validation batches then move the codebook).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

D_IN = 16


def _data(n: int = 64, batch: int = 16, seed: int = 0) -> list[torch.Tensor]:
    protos = torch.randn(6, D_IN, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(seed)
    return [protos[torch.randint(0, 6, (batch,), generator=g)] + 0.1 * torch.randn(batch, D_IN, generator=g)
            for _ in range(n // batch)]


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """upstream distributed.all_reduce: a no-op in one process."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


class Quantize(nn.Module):
    def __init__(self, dim: int, n_embed: int, decay: float = 0.99, eps: float = 1e-5, gate: bool = True) -> None:
        super().__init__()
        self.dim, self.n_embed, self.decay, self.eps, self.gate = dim, n_embed, decay, eps, gate
        embed = torch.randn(dim, n_embed)
        self.register_buffer("embed", embed)
        self.register_buffer("cluster_size", torch.zeros(n_embed))
        self.register_buffer("embed_avg", embed.clone())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flatten = x.reshape(-1, self.dim)
        dist_ = flatten.pow(2).sum(1, keepdim=True) - 2 * flatten @ self.embed + self.embed.pow(2).sum(0, keepdim=True)
        embed_ind = (-dist_).max(1)[1]
        embed_onehot = F.one_hot(embed_ind, self.n_embed).type(flatten.dtype)
        quantize = F.embedding(embed_ind, self.embed.transpose(0, 1)).view_as(x)
        if self.training or not self.gate:
            with torch.no_grad():
                embed_onehot_sum = all_reduce(embed_onehot.sum(0))
                embed_sum = all_reduce(flatten.transpose(0, 1) @ embed_onehot)
                self.cluster_size.data.mul_(self.decay).add_(embed_onehot_sum, alpha=1 - self.decay)
                self.embed_avg.data.mul_(self.decay).add_(embed_sum, alpha=1 - self.decay)
                n = self.cluster_size.sum()
                cluster_size = (self.cluster_size + self.eps) / (n + self.n_embed * self.eps) * n
                self.embed.data.copy_(self.embed_avg / cluster_size.unsqueeze(0))
        diff = (quantize.detach() - x).pow(2).mean()
        quantize = x + (quantize - x).detach()  # straight-through
        return quantize, diff, embed_ind


class VQVAE(nn.Module):
    def __init__(self, hidden: int = 32, emb: int = 4, n_embed: int = 8, gate: bool = True) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(D_IN, hidden), nn.ReLU(), nn.Linear(hidden, 2 * emb))
        self.quantize = Quantize(emb, n_embed, gate=gate)
        self.dec = nn.Sequential(nn.Linear(2 * emb, hidden), nn.ReLU(), nn.Linear(hidden, D_IN))
        self.emb = emb

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.enc(x).view(x.shape[0], 2, self.emb)  # two code positions per sample
        q, diff, _ = self.quantize(z)
        return self.dec(q.reshape(x.shape[0], -1)), diff


def _loss(model: VQVAE, img: torch.Tensor) -> torch.Tensor:
    out, latent_loss = model(img)
    return F.mse_loss(out, img) + 0.25 * latent_loss.mean()


def _step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    ctx.model.zero_grad()
    n = [mb.shape[0] for mb in micro]
    total = torch.zeros(())
    for mb, k in zip(micro, n):
        loss = ctx.loss_fn(ctx.model, mb) * (k / sum(n))
        loss.backward()
        total = total + loss.detach()
    ctx.optimizer.step()
    return total


def build_vqvae(gate: bool = True) -> tropt.Setup:
    """rosinality/vq-vae-2-pytorch train_vqvae.py train(): model.zero_grad(); out, latent_loss = model(img);
    loss = mse(out, img) + 0.25 * latent_loss.mean(); loss.backward(); optimizer.step(); Adam(lr=3e-4)."""
    torch.manual_seed(0)
    return tropt.Setup(VQVAE(gate=gate), _loss, lambda m: torch.optim.Adam(m.parameters(), lr=3e-4), _data(),
                       val_data=_data(32, seed=1), step=_step)


PORTS = [
    Port("vqvae_ema_codebook", "vae", "rosinality/vq-vae-2-pytorch/vqvae.py (+ train_vqvae.py)", build_vqvae, bugs=(
        Bug("codebook_ema_in_eval", "loop.train_mode", ("quantize",), lambda: build_vqvae(gate=False),
            source="the EMA codebook update not gated by self.training: evaluation batches move the codebook "
                   "(rosinality/vq-vae-2-pytorch gates it with `if self.training:`)"),
    )),
]
