"""Masked-modelling family (issue 28): masked autoencoders and stochastic depth, steps that draw masks per sample.

Tiny ViTs on generated 8x8 images (16 patches of 2x2). Every healthy port must pass every check (the noise floor,
issue 27 §1); the planted bug (the gradients cleared on every iteration instead of once per accumulation cycle) must
still be found by loop.accumulation with its cause.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port

_P, _N = 2, 16  # patch size, patches per 8x8 image


def _images(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generated 1x8x8 images and a 4-class label (which quadrant holds the bright blob)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 1, 8, 8, generator=g) * 0.3
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, 0, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 1.0
    return x, y


def patchify(imgs: torch.Tensor) -> torch.Tensor:
    """(N, 1, 8, 8) -> (N, 16, 4), as MAE's patchify."""
    n = imgs.shape[0]
    x = imgs.reshape(n, 1, 4, _P, 4, _P).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(n, _N, _P * _P)


class DropPath(nn.Module):
    """timm's DropPath (stochastic depth per sample): drop a residual branch with probability p, rescale the rest."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class Block(nn.Module):
    """A pre-norm transformer block (timm's Block): attention and MLP residual branches, each with DropPath."""

    def __init__(self, dim: int, heads: int = 2, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.drop_path(self.attn(h, h, h, need_weights=False)[0])
        return x + self.drop_path(self.mlp(self.norm2(x)))


def _pos_embed(dim: int, n: int = _N) -> torch.Tensor:
    """Fixed sin-cos position embedding (MAE's get_2d_sincos_pos_embed, flattened to 1-D here)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    omega = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    pe = torch.zeros(n, dim)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * omega), torch.cos(pos * omega)
    return pe[None]


class TinyMAE(nn.Module):
    """MaskedAutoencoderViT (paraphrased, tiny): patch embedding, per-sample random masking (noise argsort), a ViT
    encoder on the visible patches, a light decoder with mask tokens predicting every patch's pixels."""

    def __init__(self, dim: int = 16, dec_dim: int = 8, mask_ratio: float = 0.75, norm_pix_loss: bool = True) -> None:
        super().__init__()
        self.mask_ratio, self.norm_pix_loss = mask_ratio, norm_pix_loss
        self.patch_embed = nn.Linear(_P * _P, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.register_buffer("pos_embed", _pos_embed(dim), persistent=False)
        self.blocks = nn.ModuleList([Block(dim), Block(dim)])
        self.norm = nn.LayerNorm(dim)
        self.decoder_embed = nn.Linear(dim, dec_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_dim))
        self.register_buffer("dec_pos_embed", _pos_embed(dec_dim), persistent=False)
        self.decoder = Block(dec_dim)
        self.decoder_pred = nn.Linear(dec_dim, _P * _P)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)

    def random_masking(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-sample shuffling by argsort of uniform noise: keep the first (1 - ratio) patches."""
        n, length, d = x.shape
        keep = int(length * (1 - self.mask_ratio))
        noise = torch.rand(n, length, device=x.device)
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :keep]
        x_masked = torch.gather(x, 1, ids_keep[..., None].expand(-1, -1, d))
        mask = torch.ones(n, length, device=x.device)
        mask[:, :keep] = 0
        return x_masked, torch.gather(mask, 1, ids_restore), ids_restore

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(patchify(imgs)) + self.pos_embed
        x, mask, ids_restore = self.random_masking(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)
        for blk in self.blocks:
            x = blk(x)
        x = self.decoder_embed(self.norm(x))
        tokens = self.mask_token.expand(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], -1)
        y = torch.cat([x[:, 1:], tokens], 1)
        y = torch.gather(y, 1, ids_restore[..., None].expand(-1, -1, y.shape[2])) + self.dec_pos_embed
        pred = self.decoder_pred(self.decoder(y))
        target = patchify(imgs)
        if self.norm_pix_loss:
            mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mean) / (var + 1e-6) ** 0.5
        loss = ((pred - target) ** 2).mean(-1)  # per patch
        return (loss * mask).sum() / mask.sum()  # mean over the removed patches


def _half_cosine(warmup: int = 4, total: int = 40):
    """MAE's lr_sched.adjust_learning_rate: linear warmup, then a half-cycle cosine (per iteration)."""
    def f(s: int) -> float:
        return (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))
    return lambda o: torch.optim.lr_scheduler.LambdaLR(o, f)


def _mae_step(*, zero_every_iteration: bool = False):
    """engine_pretrain.train_one_epoch: loss /= accum_iter; backward every iteration; step (NativeScaler's
    update_grad) and zero_grad when (data_iter_step + 1) % accum_iter == 0; the LR adjusted per accumulation cycle."""
    def step(ctx, micro_batches):
        accum_iter = len(micro_batches)
        for it, mb in enumerate(micro_batches):
            loss = ctx.loss_fn(ctx.model, mb) / accum_iter
            loss.backward()
            if (it + 1) % accum_iter == 0:
                ctx.optimizer.step()
            if zero_every_iteration or (it + 1) % accum_iter == 0:
                ctx.optimizer.zero_grad()
        ctx.scheduler.step()
    return step


def _param_groups_weight_decay(model: nn.Module, wd: float) -> list[dict]:
    """optim_factory.param_groups_weight_decay: no decay for biases, norms and 1-d parameters (tokens)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or name.endswith(".bias") or "token" in name else decay).append(p)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": wd}]


def _mae_setup(**kw) -> tropt.Setup:
    x, _ = _images(64, seed=3)
    torch.manual_seed(0)
    return tropt.Setup(TinyMAE(), lambda m, b: m(b),
                       lambda m: torch.optim.AdamW(_param_groups_weight_decay(m, 0.05), lr=1.5e-4,
                                                   betas=(0.9, 0.95)),
                       [x[i:i + 16] for i in range(0, 64, 16)], scheduler=_half_cosine(),
                       step=_mae_step(**kw), accumulation_steps=2)


def build_mae_pretrain() -> tropt.Setup:
    """Follows facebookresearch/mae main_pretrain.py + engine_pretrain.py + models_mae.py: per-sample random masking
    (75%, argsort of uniform noise), norm_pix_loss on the removed patches, AdamW(betas=(0.9, 0.95)) with no weight
    decay on norms/biases, warmup + half-cosine LR, loss / accum_iter and one step per accumulation cycle."""
    return _mae_setup()


class TinyViT(nn.Module):
    """models_vit.VisionTransformer (paraphrased, tiny) with stochastic depth (drop_path rising over the blocks) and
    global average pooling of the patch tokens (MAE's fine-tuning default)."""

    def __init__(self, dim: int = 16, depth: int = 3, classes: int = 4, drop_path: float = 0.1) -> None:
        super().__init__()
        self.patch_embed = nn.Linear(_P * _P, dim)
        self.register_buffer("pos_embed", _pos_embed(dim), persistent=False)
        rates = [drop_path * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList([Block(dim, drop_path=r) for r in rates])
        self.fc_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(patchify(imgs)) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.fc_norm(x.mean(1)))


def _layer_decay_groups(model: TinyViT, lr: float, decay: float = 0.75) -> list[dict]:
    """lr_decay.param_groups_lrd: the embedding at layer 0, block i at i + 1, the head last; lr × decay^(L - layer)."""
    layers = len(model.blocks) + 1
    groups: dict[int, list] = {}
    for name, p in model.named_parameters():
        layer = 0 if name.startswith("patch_embed") else (int(name.split(".")[1]) + 1 if name.startswith("blocks")
                                                           else layers)
        groups.setdefault(layer, []).append(p)
    return [{"params": ps, "lr": lr * decay ** (layers - layer)} for layer, ps in sorted(groups.items())]


def _finetune_step(ctx, micro_batches):
    """engine_finetune.train_one_epoch without mixup: label-smoothed CE / accum_iter, step once per cycle."""
    for it, mb in enumerate(micro_batches):
        (ctx.loss_fn(ctx.model, mb) / len(micro_batches)).backward()
        if (it + 1) % len(micro_batches) == 0:
            torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), 1.0)
            ctx.optimizer.step()
            ctx.optimizer.zero_grad()
    ctx.scheduler.step()


def build_mae_finetune() -> tropt.Setup:
    """Follows facebookresearch/mae main_finetune.py + engine_finetune.py + models_vit.py: a ViT with stochastic
    depth (drop_path 0.1), global pooling, layer-wise LR decay 0.75, label smoothing 0.1, AdamW, clip, warmup +
    half-cosine LR, loss / accum_iter."""
    x, y = _images(64, seed=4)
    torch.manual_seed(0)
    return tropt.Setup(TinyViT(), lambda m, b: F.cross_entropy(m(b[0]), b[1], label_smoothing=0.1),
                       lambda m: torch.optim.AdamW(_layer_decay_groups(m, 1e-3), weight_decay=0.05),
                       [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)], scheduler=_half_cosine(),
                       step=_finetune_step, accumulation_steps=2, grad_clip=1.0, num_classes=4)


PORTS = [
    Port("mae_pretrain", "masked", "facebookresearch/mae/engine_pretrain.py", build_mae_pretrain, bugs=(
        Bug("zero_grad_every_iteration", "loop.accumulation", ("cleared inside the micro-batch loop",),
            lambda: _mae_setup(zero_every_iteration=True),
            "engine_pretrain.py zeroes only when (data_iter_step + 1) % accum_iter == 0; dropping that condition "
            "keeps only the last micro-batch (a common port error)"),
    )),
    Port("mae_finetune_stochastic_depth", "masked", "facebookresearch/mae/engine_finetune.py", build_mae_finetune),
]
