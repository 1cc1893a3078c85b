"""timm-style ViT classification port (held-out probe "vision"). Paraphrased, never copied.

``timm_vit_layerscale``: huggingface/pytorch-image-models ``train.py`` ``train_one_epoch`` driving a tiny
``timm/models/vision_transformer.py`` ``VisionTransformer``: a class token, pre-norm blocks whose attention and MLP
branches each go through ``LayerScale`` (``gamma = init_values * ones(dim)``, init_values 1e-5) and ``DropPath``
(stochastic depth rising linearly over the blocks to 0.1), attention through ``F.scaled_dot_product_attention`` with
``dropout_p = attn_drop if self.training else 0``; ``LabelSmoothingCrossEntropy(0.1)``; AdamW with timm's
``param_groups_weight_decay`` (no decay on 1-D params, the class token and position embedding)
``clip_grad_norm``;
``CosineLRScheduler(t_initial=updates, warmup_t=5, t_in_epochs=False)`` -- timm's own scheduler class (not a torch
``LRScheduler``: it writes ``param_group['lr']`` itself, ``step_update(num_updates)`` after every optimizer update and
``step(epoch)`` at the end of an epoch, and has ``state_dict``/``load_state_dict``).

Planted bugs:
- ``vit_schedule_stepped_per_epoch``: the schedule sized in updates (``t_in_epochs=False``) but only
  ``lr_scheduler.step(epoch)`` at the end of each epoch is called, no ``step_update`` -- the warm-up never ends
  inside an epoch (timm issue discussions on ``t_in_epochs`` / ``step_update``).
- ``vit_drop_path_in_eval``: ``DropPath.forward`` passes ``training=True`` instead of ``self.training`` (a port
  error): stochastic depth keeps dropping at evaluation.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port
from ports.heldout.vision_data import C, accuracy, image_batches

P, DIM = 4, 16  # patch side, width


def drop_path(x: torch.Tensor, drop_prob: float, training: bool) -> torch.Tensor:
    """timm's drop_path: zero whole samples of a residual branch with probability drop_prob, scale the kept."""
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask / keep


class DropPath(nn.Module):
    def __init__(self, p: float, ignore_mode: bool = False) -> None:
        super().__init__()
        self.drop_prob, self.ignore_mode = p, ignore_mode

    def forward(self, x):
        return drop_path(x, self.drop_prob, True if self.ignore_mode else self.training)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int = 2, attn_drop: float = 0.1) -> None:
        super().__init__()
        self.heads, self.attn_drop = heads, attn_drop
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, dpr: float, init_values: float, ignore_mode: bool) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim)
        self.ls1, self.drop_path1 = LayerScale(dim, init_values), DropPath(dpr, ignore_mode)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * dim, dim))
        self.ls2, self.drop_path2 = LayerScale(dim, init_values), DropPath(dpr, ignore_mode)

    def forward(self, x):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class TinyViT(nn.Module):
    def __init__(self, depth: int = 3, drop_path_rate: float = 0.1, init_values: float = 1e-5,
                 ignore_mode: bool = False) -> None:
        super().__init__()
        n = (8 // P) ** 2
        self.patch_embed = nn.Conv2d(3, DIM, P, P)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, DIM) * 0.02)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.Sequential(*[Block(DIM, r, init_values, ignore_mode) for r in dpr])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, C)
        nn.init.trunc_normal_(self.cls_token, std=1e-6)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class LabelSmoothingCrossEntropy(nn.Module):
    """timm.loss.LabelSmoothingCrossEntropy: (1 - s) * nll + s * mean over classes of -log p."""

    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__()
        self.smoothing = smoothing

    def forward(self, x, target):
        logprobs = F.log_softmax(x, dim=-1)
        nll = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
        smooth = -logprobs.mean(dim=-1)
        return ((1.0 - self.smoothing) * nll + self.smoothing * smooth).mean()


class CosineLRScheduler:
    """timm.scheduler.CosineLRScheduler (t_in_epochs=False, warmup_prefix=False, cycle_limit=1), re-stated: the LR
    at update t is linear warm-up from warmup_lr_init over warmup_t updates, then half-cosine to lr_min at t_initial."""

    def __init__(self, optimizer, t_initial: int, lr_min: float = 1e-5, warmup_t: int = 0,
                 warmup_lr_init: float = 0.0, t_in_epochs: bool = True) -> None:
        self.optimizer = optimizer
        self.t_initial, self.lr_min, self.warmup_t, self.warmup_lr_init = t_initial, lr_min, warmup_t, warmup_lr_init
        self.t_in_epochs = t_in_epochs
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_values = [g["initial_lr"] for g in optimizer.param_groups]
        self.warmup_steps = [(v - warmup_lr_init) / warmup_t for v in self.base_values] if warmup_t else [1.0] * len(
            self.base_values)
        self._update(self._get_lr(0))

    def _get_lr(self, t: int) -> list[float]:
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * s for s in self.warmup_steps]
        if t >= self.t_initial:
            return [self.lr_min] * len(self.base_values)
        return [self.lr_min + 0.5 * (v - self.lr_min) * (1 + math.cos(math.pi * t / self.t_initial))
                for v in self.base_values]

    def _update(self, values):
        for g, v in zip(self.optimizer.param_groups, values):
            g["lr"] = v

    def step(self, epoch: int, metric=None) -> None:
        if self.t_in_epochs:
            self._update(self._get_lr(epoch))

    def step_update(self, num_updates: int, metric=None) -> None:
        if not self.t_in_epochs:
            self._update(self._get_lr(num_updates))

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        self.__dict__.update(state)


def param_groups_weight_decay(model: nn.Module, weight_decay: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or name in ("cls_token", "pos_embed") else decay).append(p)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


UPDATES_PER_EPOCH, EPOCHS = 3, 20


def vit_setup(*, per_epoch_only: bool = False, ignore_mode: bool = False) -> tropt.Setup:
    """timm train.py train_one_epoch: per batch ``loss = loss_fn(model(input), target)``, ``loss /= accum_steps``,
    backward, on the update ``clip_grad_norm_`` + ``optimizer.step()`` + ``zero_grad``, ``num_updates += 1``,
    ``lr_scheduler.step_update(num_updates=num_updates)``; after the epoch ``lr_scheduler.step(epoch + 1)``."""
    crit = LabelSmoothingCrossEntropy(0.1)

    def step(ctx, micro_batches):
        model, opt = ctx.model, ctx.optimizer
        ctx.num_updates = getattr(ctx, "num_updates", 0)
        k = len(micro_batches)
        for mb in micro_batches:
            loss = ctx.loss_fn(model, mb) / k
            loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), ctx.grad_clip)
        opt.step()
        opt.zero_grad()
        ctx.num_updates += 1
        if not per_epoch_only:
            ctx.scheduler.step_update(num_updates=ctx.num_updates)
        if ctx.num_updates % UPDATES_PER_EPOCH == 0:
            ctx.scheduler.step(ctx.num_updates // UPDATES_PER_EPOCH)  # end of epoch (a no-op with t_in_epochs=False)
        return loss.detach() * k

    def sched(o):
        return CosineLRScheduler(o, t_initial=UPDATES_PER_EPOCH * EPOCHS, lr_min=1e-5, warmup_t=5,
                                 warmup_lr_init=1e-5, t_in_epochs=False)

    torch.manual_seed(0)
    return tropt.Setup(TinyViT(ignore_mode=ignore_mode), lambda m, b: crit(m(b[0]), b[1]),
                       lambda m: torch.optim.AdamW(param_groups_weight_decay(m, 0.05), lr=2e-3),
                       image_batches(3), val_data=image_batches(2, seed=1), scheduler=sched, step=step,
                       accumulation_steps=2, grad_clip=1.0, num_classes=C,
                       metric=tropt.Metric(accuracy, higher_is_better=True, name="top1"))


TIMM = "huggingface/pytorch-image-models/train.py"

PORTS: list[Port] = [
    Port("timm_vit_layerscale", "vit", TIMM, vit_setup,
         notes={"model.overfit_batch": "label smoothing puts a floor under the loss, which tropt does not recognise",
                "dynamics.loss_curve": "a ViT overfits 96 generated images within the probe"}, bugs=(
        Bug("vit_schedule_stepped_per_epoch", "loop.scheduler_cadence", ("per epoch",),
            lambda: vit_setup(per_epoch_only=True),
            source=f"{TIMM}: `lr_scheduler.step_update(num_updates=num_updates)` dropped; only the epoch-end "
                   "`lr_scheduler.step(epoch + 1)` left, with t_in_epochs=False"),
        Bug("vit_drop_path_in_eval", "loop.train_mode", ("drop",), lambda: vit_setup(ignore_mode=True),
            source="timm/layers/drop.py: DropPath.forward passes self.training; a port hard-codes True"),
    )),
]
