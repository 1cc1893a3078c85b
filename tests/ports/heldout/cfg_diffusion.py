"""Class-conditional diffusion with classifier-free-guidance label dropout (held-out probe "gen"), facebookresearch/DiT
train.py + models.py paraphrased: LabelEmbedder.token_drop replaces each sample's label by the null class
(index num_classes) with probability class_dropout_prob when the model is in training mode
a timestep and noise per
sample (diffusion.training_losses: MSE on the noise)
AdamW(lr=1e-4, weight_decay=0)
the EMA copy kept on ctx
(deepcopy, requires_grad False, update_ema(ema, model, decay=0) at start, update_ema after every opt.step())
the
checkpoint holds model, ema and opt.

Planted bugs: the EMA updated *before* opt.step() (it then trails by one step: the averaged weights miss the latest
update)
a checkpoint without the EMA (a resume restarts it from the live model).
"""
from __future__ import annotations

import copy
import math
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

NC, D_IN, T = 4, 16, 100


def _data(n: int = 64, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    protos = torch.randn(NC, D_IN, generator=torch.Generator().manual_seed(11)).tanh()
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        y = torch.randint(0, NC, (batch,), generator=g)
        out.append((protos[y] + 0.1 * torch.randn(batch, D_IN, generator=g), y))
    return out


class LabelEmbedder(nn.Module):
    """DiT's LabelEmbedder: an embedding table with one extra row (the null class) when dropout is on."""

    def __init__(self, num_classes: int, hidden: int, dropout_prob: float) -> None:
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden)
        self.num_classes, self.dropout_prob = num_classes, dropout_prob

    def token_drop(self, labels: torch.Tensor) -> torch.Tensor:
        drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        return torch.where(drop_ids, self.num_classes, labels)

    def forward(self, labels: torch.Tensor, train: bool) -> torch.Tensor:
        if train and self.dropout_prob > 0:
            labels = self.token_drop(labels)
        return self.embedding_table(labels)


class TinyDiT(nn.Module):
    """x + timestep embedding + label embedding -> MLP with adaLN-style modulation -> predicted noise."""

    def __init__(self, hidden: int = 32, class_dropout_prob: float = 0.1) -> None:
        super().__init__()
        self.hidden = hidden
        self.x_embedder = nn.Linear(D_IN, hidden)
        self.t_embedder = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.y_embedder = LabelEmbedder(NC, hidden, class_dropout_prob)
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False)
        self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, D_IN))

    def timestep_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.hidden // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], -1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = self.t_embedder(self.timestep_embedding(t)) + self.y_embedder(y, self.training)
        shift, scale = self.adaLN(c).chunk(2, 1)
        h = self.norm(self.x_embedder(x)) * (1 + scale) + shift
        return self.mlp(h)


_BETAS = torch.linspace(1e-4, 0.02, T)
_ALPHAS = torch.cumprod(1 - _BETAS, 0)


def _loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """diffusion.training_losses(model, x, t, dict(y=y))['loss'].mean() with t ~ U{0..T-1} and noise per sample."""
    x, y = batch
    t = torch.randint(0, T, (x.shape[0],), device=x.device)
    noise = torch.randn_like(x)
    a = _ALPHAS[t].view(-1, 1)
    x_t = a.sqrt() * x + (1 - a).sqrt() * noise
    return F.mse_loss(model(x_t, t, y), noise)


@torch.no_grad()
def update_ema(ema_model: nn.Module, model: nn.Module, decay: float = 0.9999) -> None:
    ema_params = OrderedDict(ema_model.named_parameters())
    for name, param in model.named_parameters():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def requires_grad(model: nn.Module, flag: bool = True) -> None:
    for p in model.parameters():
        p.requires_grad = flag


def _make_ema(model: nn.Module) -> nn.Module:
    ema = copy.deepcopy(model)
    requires_grad(ema, False)
    update_ema(ema, model, decay=0)
    return ema.eval()


def _step(ema_before_step: bool = False):
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        if not hasattr(ctx, "ema"):
            ctx.ema = _make_ema(ctx.model)
        n = [mb[0].shape[0] for mb in micro]
        total = torch.zeros(())
        for mb, k in zip(micro, n):
            loss = ctx.loss_fn(ctx.model, mb) * (k / sum(n))
            loss.backward()
            total = total + loss.detach()
        if ema_before_step:
            update_ema(ctx.ema, ctx.model)  # BUG: averages the weights before this step's update
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
        if not ema_before_step:
            update_ema(ctx.ema, ctx.model)
        return total
    return step


def _checkpoint(keep_ema: bool = True) -> dict:
    def save(ctx):
        state = {"model": ctx.model.state_dict(), "opt": ctx.optimizer.state_dict()}
        if keep_ema and hasattr(ctx, "ema"):
            state["ema"] = ctx.ema.state_dict()
        return state

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["opt"])
        ctx.ema = _make_ema(ctx.model)  # DiT: ema = deepcopy(model) before loading
        if "ema" in state:
            ctx.ema.load_state_dict(state["ema"])
    return {"save_state": save, "load_state": load}


def build_dit_cfg(ema_before_step: bool = False, keep_ema: bool = True, k: int = 1) -> tropt.Setup:
    """facebookresearch/DiT train.py: per batch t = randint(0, T), loss = training_losses(model, x, t, y).mean(),
    opt.zero_grad()
    loss.backward()
    opt.step()
    update_ema(ema, model.module)
    AdamW(lr=1e-4, wd=0);
    LabelEmbedder.token_drop with class_dropout_prob=0.1 in training mode. lr 1e-3 here: upstream's 1e-4 is for a
    600M-parameter DiT
    this 3k-parameter one does not move within the 150-step probe at it (dynamics.loss_curve
    FAILs flat, a fair finding about the scaled-down port)."""
    torch.manual_seed(0)
    return tropt.Setup(TinyDiT(), _loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0),
                       _data(), val_data=_data(32, seed=1), step=_step(ema_before_step), accumulation_steps=k,
                       **_checkpoint(keep_ema))


_UP = "facebookresearch/DiT/train.py (+ models.py LabelEmbedder)"


def build_dit_cfg_k2() -> tropt.Setup:
    """The DiT port with two micro-batches per optimizer step (gradient accumulation)."""
    return build_dit_cfg(k=2)


PORTS = [
    Port("dit_cfg_label_dropout_ema", "diffusion", _UP, build_dit_cfg, bugs=(
        Bug("ema_before_opt_step", "loop.accumulation", ("ctx.ema",), lambda: build_dit_cfg(ema_before_step=True),
            source="update_ema called before opt.step(): the EMA trails the model by one update (a recurring slip "
                   "in EMA helpers; DiT, timm ModelEmaV2 docs: update after the optimizer step)"),
        Bug("ema_not_checkpointed", "loop.resume", ("ctx.ema",), lambda: build_dit_cfg(keep_ema=False),
            source="a checkpoint without the EMA (DiT saves {'model', 'ema', 'opt', 'args'}): after a resume the EMA "
                   "restarts from the live weights"),
    )),
    Port("dit_cfg_label_dropout_ema_k2", "diffusion", _UP, build_dit_cfg_k2),
]
