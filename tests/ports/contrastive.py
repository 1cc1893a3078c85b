"""Contrastive ports (issue 28): losses with in-batch negatives, self-supervised and image-text.

Each item's loss depends on the rest of its batch (the other items are its negatives), so K micro-batches of n/K
items cannot reproduce the full batch's gradient: ``loop.accumulation`` and ``loop.ddp`` say so with a WARN naming the
loss, never a FAIL. Augmented views are drawn once into the data (two noisy views of one base sample per row) so that
a rerun of a step from the same state sees the same views; the upstreams augment inside the data loader.

- ``simclr_nt_xent``: sthalles/SimCLR ``simclr.py`` (``info_nce_loss``: the 2N views' cosine similarities with the
  diagonal masked out, the positive first, divided by the temperature, cross entropy against label 0; Adam(3e-4,
  weight_decay=1e-4));
- ``open_clip_info_nce``: mlfoundations/open_clip ``src/training/train.py`` + ``src/open_clip/loss.py`` (``ClipLoss``:
  the mean of image->text and text->image cross entropy over ``logit_scale * img @ txt.T``; after each step
  ``logit_scale`` is clamped to [0, ln 100]; AdamW without weight decay on gains and biases);
- ``byol_momentum_encoder``: lucidrains/byol-pytorch ``byol_pytorch/byol_pytorch.py`` (online encoder, projector and
  predictor; a target encoder and projector that receive no gradient, updated as an exponential moving average
  after every ``opt.step()`` by ``learner.update_moving_average()``; the symmetric ``2 - 2 cos`` loss);
- ``simclr_accumulated``: the SimCLR port with ``accumulation_steps=2`` (each micro-batch's NT-Xent divided by K):
  a WARN naming the batch-dependent loss, not a FAIL.

Planted bugs: SimCLR under accumulation with each micro-batch's loss not divided by K (the gradient is K times the
right one, whatever the in-batch negatives do), and CLIP under accumulation with the same slip.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

D_IN, VOCAB, T = 16, 32, 6


# ------------------------------------------------------------------ data
def _views(n: int = 64, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of two augmented views (base sample + noise, a random per-feature gain) of distinct base samples."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        base = torch.randn(batch, D_IN, generator=g)
        views = [base * (1 + 0.1 * torch.randn(batch, D_IN, generator=g)) + 0.2 * torch.randn(batch, D_IN, generator=g)
                 for _ in range(2)]
        out.append((views[0], views[1]))
    return out


def _pairs(n: int = 64, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of (image features, caption tokens): the caption of each image is a noisy reading of it."""
    g = torch.Generator().manual_seed(seed)
    reader = torch.randn(T, D_IN, VOCAB, generator=g)
    out = []
    for _ in range(n // batch):
        img = torch.randn(batch, D_IN, generator=g)
        tokens = torch.einsum("bd,tdv->btv", img, reader).argmax(-1)
        noise = torch.randint(0, VOCAB, tokens.shape, generator=g)
        keep = torch.rand(tokens.shape, generator=g) > 0.15
        out.append((img, torch.where(keep, tokens, noise)))
    return out


def _unwrap(model: nn.Module) -> nn.Module:
    """open_clip's ``unwrap_model``: the module inside a DistributedDataParallel wrapper."""
    return getattr(model, "module", model)


def _shares(micro: list) -> list[float]:
    sizes = [mb[0].shape[0] for mb in micro]
    return [s / sum(sizes) for s in sizes]


# ------------------------------------------------------------------ SimCLR (sthalles/SimCLR)
class SimCLRNet(nn.Module):
    """The encoder (an MLP with BatchNorm, for the ResNet) and the projection head ``Linear, ReLU, Linear``."""

    def __init__(self, width: int = 64, out_dim: int = 32) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(D_IN, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, width))
        self.projector = nn.Sequential(nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))


def info_nce_loss(features: torch.Tensor, n_views: int = 2, temperature: float = 0.07) -> torch.Tensor:
    """sthalles/SimCLR's info_nce_loss, paraphrased: positives are the other view of the same sample; every other
    view in the batch is a negative."""
    b = features.shape[0] // n_views
    labels = torch.arange(b, device=features.device).repeat(n_views)
    labels = (labels[:, None] == labels[None, :]).float()
    features = F.normalize(features, dim=1)
    sim = features @ features.T
    mask = torch.eye(labels.shape[0], dtype=torch.bool, device=features.device)
    labels, sim = labels[~mask].view(labels.shape[0], -1), sim[~mask].view(sim.shape[0], -1)
    positives = sim[labels.bool()].view(labels.shape[0], -1)
    negatives = sim[~labels.bool()].view(sim.shape[0], -1)
    logits = torch.cat([positives, negatives], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=features.device))


def _simclr_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    v1, v2 = batch
    return info_nce_loss(model(torch.cat([v1, v2], 0)))


def _simclr_step(divide: bool = True) -> Any:
    """SimCLR.train's iteration (``images = torch.cat(images)``, ``features = model(images)``, NT-Xent,
    ``zero_grad``, ``backward``, ``step``), with gradient accumulation over the micro-batches: each micro-batch's
    loss divided by K (``divide``), or, the bug, not."""
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        ctx.model.train()
        ctx.optimizer.zero_grad()
        total = torch.zeros(())
        for mb in micro:
            loss = _simclr_loss(ctx.model, mb)
            (loss / len(micro) if divide else loss).backward()
            total = total + loss.detach() / len(micro)
        ctx.optimizer.step()
        return total
    return step


def build_simclr(k: int = 1, divide: bool = True) -> tropt.Setup:
    """sthalles/SimCLR run.py + simclr.py: ``Adam(model.parameters(), lr=3e-4, weight_decay=1e-4)`` (lr raised for the
    tiny model), temperature 0.07, two views per image concatenated along the batch, ``info_nce_loss`` then cross
    entropy; ``accumulation_steps=k`` micro-batches per step, each loss divided by K unless ``divide=False``."""
    torch.manual_seed(0)
    return tropt.Setup(SimCLRNet().train(), _simclr_loss,
                       lambda m: torch.optim.Adam(m.parameters(), lr=3e-3, weight_decay=1e-4), _views(),
                       step=_simclr_step(divide), accumulation_steps=k)


# ------------------------------------------------------------------ CLIP (mlfoundations/open_clip)
class TinyCLIP(nn.Module):
    """An image tower (MLP on features), a text tower (token embedding, positional embedding, a LayerNorm'd MLP,
    mean pooling) and ``logit_scale`` initialised to ln(1/0.07), as open_clip's CLIP."""

    def __init__(self, width: int = 32, embed: int = 16) -> None:
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(D_IN, width), nn.GELU(), nn.Linear(width, embed))
        self.token_embedding = nn.Embedding(VOCAB, width)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(T, width))
        self.text = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
        self.text_projection = nn.Linear(width, embed, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        img = F.normalize(self.visual(image), dim=-1)
        h = self.text(self.token_embedding(text) + self.positional_embedding).mean(1)
        txt = F.normalize(self.text_projection(h), dim=-1)
        return img, txt, self.logit_scale.exp()


def clip_loss(img: torch.Tensor, txt: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """open_clip's ClipLoss on one process: the mean of both directions' cross entropy."""
    logits = scale * img @ txt.T
    labels = torch.arange(img.shape[0], device=img.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _clip_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return clip_loss(*model(*batch))


def _clip_step(divide: bool = True) -> Any:
    """train_one_epoch's iteration: ``model.train()``, ``optimizer.zero_grad()``, ClipLoss, ``backward``,
    ``optimizer.step()``, then ``with torch.no_grad(): unwrap_model(model).logit_scale.clamp_(0, math.log(100))``.
    Micro-batches accumulate their gradients, each loss divided by K (``divide``), or, the bug, not."""
    def step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
        ctx.model.train()
        ctx.optimizer.zero_grad()
        total = torch.zeros(())
        for mb, share in zip(micro, _shares(micro)):
            loss = _clip_loss(ctx.model, mb)
            (loss * share if divide else loss).backward()
            total = total + loss.detach() * share
        ctx.optimizer.step()
        with torch.no_grad():
            _unwrap(ctx.model).logit_scale.clamp_(0, math.log(100))
        return total
    return step


def _clip_adamw(model: nn.Module) -> torch.optim.Optimizer:
    """open_clip's main.py: no weight decay on gains, biases, embeddings and logit_scale (``exclude``)."""
    named = list(model.named_parameters())

    def exclude(n: str, p: torch.Tensor) -> bool:
        return p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n or "embedding" in n

    decay = [p for n, p in named if not exclude(n, p)]
    no_decay = [p for n, p in named if exclude(n, p)]
    return torch.optim.AdamW([{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.2}],
                             lr=3e-3, betas=(0.9, 0.98), eps=1e-6)


def build_clip(k: int = 1, divide: bool = True) -> tropt.Setup:
    """mlfoundations/open_clip src/training/train.py (train_one_epoch, accum_freq=1) and src/open_clip/loss.py
    (ClipLoss); AdamW(betas=(0.9, 0.98), eps=1e-6) with weight decay 0.2 on weights only, as main.py builds it
    (lr raised for the tiny model); ``logit_scale`` clamped to [0, ln 100] after every step."""
    torch.manual_seed(0)
    return tropt.Setup(TinyCLIP().train(), _clip_loss, _clip_adamw, _pairs(), step=_clip_step(divide),
                       accumulation_steps=k)


# ------------------------------------------------------------------ BYOL (lucidrains/byol-pytorch)
class BYOL(nn.Module):
    """Online encoder + projector + predictor; a target encoder + projector (a copy, requires_grad=False) that
    ``update_moving_average`` moves towards the online one (beta 0.99)."""

    def __init__(self, width: int = 64, proj: int = 32, beta: float = 0.99) -> None:
        super().__init__()
        self.beta = beta
        self.online_encoder = nn.Sequential(nn.Linear(D_IN, width), nn.BatchNorm1d(width), nn.ReLU(),
                                            nn.Linear(width, width))
        self.online_projector = nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(),
                                              nn.Linear(width, proj))
        self.online_predictor = nn.Sequential(nn.Linear(proj, width), nn.BatchNorm1d(width), nn.ReLU(),
                                              nn.Linear(width, proj))
        self.target_encoder = copy.deepcopy(self.online_encoder)
        self.target_projector = copy.deepcopy(self.online_projector)
        for p in [*self.target_encoder.parameters(), *self.target_projector.parameters()]:
            p.requires_grad = False

    @torch.no_grad()
    def update_moving_average(self) -> None:
        for online, target in ((self.online_encoder, self.target_encoder),
                               (self.online_projector, self.target_projector)):
            for po, pt in zip(online.parameters(), target.parameters()):
                pt.mul_(self.beta).add_(po.detach(), alpha=1 - self.beta)

    def forward(self, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        views = torch.cat([v1, v2], 0)
        pred = self.online_predictor(self.online_projector(self.online_encoder(views)))
        with torch.no_grad():
            target = self.target_projector(self.target_encoder(views)).detach()
        p1, p2 = pred.chunk(2)
        t1, t2 = target.chunk(2)

        def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return 2 - 2 * (F.normalize(x, dim=-1) * F.normalize(y, dim=-1)).sum(-1)

        return (loss_fn(p1, t2) + loss_fn(p2, t1)).mean()


def _byol_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(*batch)


def _byol_step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """The README's loop: ``loss = learner(images); opt.zero_grad(); loss.backward(); opt.step();
    learner.update_moving_average()`` (micro-batches weighted by their size)."""
    ctx.model.train()
    ctx.optimizer.zero_grad()
    total = torch.zeros(())
    for mb, share in zip(micro, _shares(micro)):
        loss = _byol_loss(ctx.model, mb)
        (loss * share).backward()
        total = total + loss.detach() * share
    ctx.optimizer.step()
    _unwrap(ctx.model).update_moving_average()
    return total


def build_byol() -> tropt.Setup:
    """lucidrains/byol-pytorch byol_pytorch/byol_pytorch.py: BYOL(net, ...) with a target network updated by an
    exponential moving average (beta 0.99) after every optimizer step, the symmetric normalised-MSE loss;
    ``torch.optim.Adam(learner.parameters(), lr=3e-4)`` as the README (lr raised for the tiny model)."""
    torch.manual_seed(0)
    return tropt.Setup(BYOL().train(), _byol_loss,
                       lambda m: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=3e-3),
                       _views(), step=_byol_step)


SIMCLR = "sthalles/SimCLR/simclr.py"
CLIP = "mlfoundations/open_clip/src/training/train.py"
BYOL_SRC = "lucidrains/byol-pytorch/byol_pytorch/byol_pytorch.py"
_K_BUG = ("accumulation", "the loss is batch-dependent")

def build_simclr_accumulated() -> tropt.Setup:
    """The SimCLR port with two micro-batches per step, each NT-Xent loss divided by K (a batch-dependent loss under
    accumulation: loop.accumulation WARNs naming it)."""
    return build_simclr(k=2)


PORTS = [
    Port("simclr_nt_xent", "contrastive", SIMCLR, build_simclr),
    Port("simclr_accumulated", "contrastive", SIMCLR, build_simclr_accumulated, bugs=(
        Bug("simclr_loss_not_divided_by_k", "loop.accumulation", ("summed", "batch-dependent"),
            lambda: build_simclr(k=2, divide=False),
            source="sthalles/SimCLR has no accumulation; the slip is the one the PyTorch forums' 'gradient "
                   "accumulation' threads warn of: loss.backward() per micro-batch without loss / accumulation_steps",
            checks=("loop.accumulation",)),)),
    Port("open_clip_info_nce", "contrastive", CLIP, build_clip, bugs=(
        Bug("clip_loss_not_divided_by_k", "loop.accumulation", ("summed", "batch-dependent"),
            lambda: build_clip(k=2, divide=False),
            source="open_clip's accum_freq path divides nothing by K only because it recomputes the whole "
                   "batch's loss per micro-batch; a hand-written accumulation must divide",
            checks=("loop.accumulation",)),)),
    Port("byol_momentum_encoder", "contrastive", BYOL_SRC, build_byol),
]
