"""Mixup / CutMix drawn inside the training step (held-out probe "vision"). Paraphrased, never copied.

The corpus's image_classification ports mix at collate time (a fixed mixed batch); these draw lambda and the
partner permutation per batch *inside* the step, from numpy's or torch's global RNG, as the widely copied loops do:

- ``mixup_cifar10_np``: facebookresearch/mixup-cifar10 ``train.py``: ``mixup_data(x, y, alpha)``:
  ``lam = np.random.beta(alpha, alpha)``, ``index = torch.randperm(batch_size)``, ``mixed_x = lam * x + (1 - lam) *
  x[index]``
  ``mixup_criterion = lam * CE(pred, y_a) + (1 - lam) * CE(pred, y_b)``
  SGD(0.1, momentum 0.9, wd 1e-4),
  a small ResNet-ish net with BatchNorm. The mixing lives in the Setup's loss_fn (the training objective).
- ``timm_mixup_fn_soft_target``: huggingface/pytorch-image-models ``train.py`` without the prefetcher:
  ``input, target = mixup_fn(input, target)`` inside ``train_one_epoch`` with timm ``Mixup`` (mode 'batch',
  ``mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1``: lambda from ``np.random.beta``,
  cutmix box from ``np.random``, the batch mixed with its flip) and ``SoftTargetCrossEntropy``; the Setup's loss_fn
  is the soft-target CE of the batch it is given (hard labels are label-smoothed one-hots), the step mixes first.
- ``cutmix_torch_beta``: clovaai/CutMix-PyTorch ``train.py`` with lambda from ``torch.distributions.Beta``:
  ``if beta > 0 and r < cutmix_prob``: a box from ``rand_bbox``, pasted from ``input[rand_index]``, lambda
  re-computed from the box area, ``CE(output, target_a) * lam + CE(output, target_b) * (1 - lam)``
  plain CE
  otherwise.

Planted bug:
- ``mixup_target_not_mixed``: lambda mixes the inputs but the loss is CE on ``y_a`` only (the partner's label is
  dropped) -- the model is trained towards a wrong target on (1 - lam) of every input (facebookresearch/mixup-cifar10
  ``mixup_criterion``; forum reports of "mixup hurts accuracy" from this port error).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port
from ports.heldout.vision_data import HW, C, accuracy, image_batches


class SmallResNet(nn.Module):
    def __init__(self, w: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.c1 = nn.Conv2d(w, w, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(w)
        self.head = nn.Linear(w, C)

    def forward(self, x):
        h = self.stem(x)
        h = F.relu(h + self.b1(self.c1(h)))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


# ------------------------------------------------------------------ mixup-cifar10 (numpy lambda in the loss)
def mixup_cifar_loss(*, mix_target: bool = True, alpha: float = 1.0):
    def loss_fn(model, batch):
        x, y = batch
        lam = float(np.random.beta(alpha, alpha)) if alpha > 0 else 1.0
        index = torch.randperm(x.size(0))
        mixed = lam * x + (1 - lam) * x[index]
        pred = model(mixed)
        y_a, y_b = y, y[index]
        if not mix_target:  # BUG: the partner's label dropped
            return F.cross_entropy(pred, y_a)
        return lam * F.cross_entropy(pred, y_a) + (1 - lam) * F.cross_entropy(pred, y_b)
    return loss_fn


def mixup_cifar_setup(*, mix_target: bool = True) -> tropt.Setup:
    """train(): per batch ``mixup_data``, ``outputs = net(inputs)``, ``mixup_criterion``, ``optimizer.zero_grad();
    loss.backward(); optimizer.step()`` (no accumulation upstream; micro-batches weighted by size here)."""

    def step(ctx, micro_batches):
        ctx.optimizer.zero_grad()
        n = sum(ctx.batch_size(mb) for mb in micro_batches)
        for mb in micro_batches:
            loss = ctx.loss_fn(ctx.model, mb) * ctx.batch_size(mb) / n
            loss.backward()
        ctx.optimizer.step()
        return loss.detach()

    torch.manual_seed(0)
    np.random.seed(0)
    return tropt.Setup(SmallResNet(), mixup_cifar_loss(mix_target=mix_target),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4),
                       image_batches(3), val_data=image_batches(2, seed=1), step=step, num_classes=C,
                       metric=tropt.Metric(accuracy, higher_is_better=True, name="acc"))


# ------------------------------------------------------------------ timm Mixup called in the loop
def one_hot_smooth(y, smoothing: float):
    off = smoothing / C
    return torch.full((y.numel(), C), off).scatter_(1, y[:, None], 1.0 - smoothing + off)


class Mixup:
    """timm.data.mixup.Mixup, mode 'batch', re-stated: per call, with prob switch_prob cutmix (alpha 1) else mixup
    (alpha 0.8); lam from np.random.beta; the batch mixed with its flip; targets label-smoothed and mixed alike."""

    def __init__(self, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1) -> None:
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.switch_prob, self.label_smoothing = switch_prob, label_smoothing

    def __call__(self, x, target):
        x = x.clone()
        use_cutmix = np.random.rand() < self.switch_prob
        lam = float(np.random.beta(self.cutmix_alpha, self.cutmix_alpha) if use_cutmix
                    else np.random.beta(self.mixup_alpha, self.mixup_alpha))
        if use_cutmix:
            cut = int(HW * np.sqrt(1 - lam))
            cy, cx = np.random.randint(HW), np.random.randint(HW)
            y0, y1 = np.clip(cy - cut // 2, 0, HW), np.clip(cy + cut // 2, 0, HW)
            x0, x1 = np.clip(cx - cut // 2, 0, HW), np.clip(cx + cut // 2, 0, HW)
            x[:, :, y0:y1, x0:x1] = x.flip(0)[:, :, y0:y1, x0:x1]
            lam = 1.0 - (y1 - y0) * (x1 - x0) / float(HW * HW)  # correct_lam
        else:
            x.mul_(lam).add_(x.flip(0).mul_(1.0 - lam))
        y1h = one_hot_smooth(target, self.label_smoothing)
        return x, y1h * lam + y1h.flip(0) * (1.0 - lam)


def soft_target_ce(model, batch):
    x, target = batch
    if not target.is_floating_point():
        target = one_hot_smooth(target, 0.1)
    return torch.sum(-target * F.log_softmax(model(x), dim=-1), dim=-1).mean()


def timm_mixup_setup() -> tropt.Setup:
    """train_one_epoch: ``if mixup_fn is not None: input, target = mixup_fn(input, target)``, ``loss =
    loss_fn(model(input), target)``, ``loss /= accum_steps``, backward, step on the last micro-batch."""
    mixup_fn = Mixup()

    def step(ctx, micro_batches):
        k = len(micro_batches)
        for mb in micro_batches:
            x, y = mixup_fn(*mb)
            loss = ctx.loss_fn(ctx.model, (x, y)) / k
            loss.backward()
        nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad()
        return loss.detach() * k

    torch.manual_seed(0)
    np.random.seed(0)
    return tropt.Setup(SmallResNet(), soft_target_ce,
                       lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.05),
                       image_batches(3), val_data=image_batches(2, seed=1), step=step, accumulation_steps=2,
                       grad_clip=5.0, num_classes=C, metric=tropt.Metric(accuracy, higher_is_better=True, name="top1"))


# ------------------------------------------------------------------ CutMix-PyTorch with torch's Beta
def rand_bbox(size, lam: float):
    w, h = size[2], size[3]
    cut_rat = float(np.sqrt(1.0 - lam))
    cw, ch = int(w * cut_rat), int(h * cut_rat)
    cx, cy = (int(v) for v in torch.randint(0, w, (2,)))
    return (int(np.clip(cx - cw // 2, 0, w)), int(np.clip(cy - ch // 2, 0, h)),
            int(np.clip(cx + cw // 2, 0, w)), int(np.clip(cy + ch // 2, 0, h)))


def cutmix_setup(beta: float = 1.0, cutmix_prob: float = 0.5) -> tropt.Setup:
    """train(): ``r = rand(1)``; with cutmix: ``lam ~ Beta(beta, beta)``, ``rand_index = randperm``, box pasted,
    ``lam = 1 - box area / image area``, ``loss = CE(output, target_a) * lam + CE(output, target_b) * (1 - lam)``;
    else ``loss = CE(output, target)``; ``optimizer.zero_grad(); loss.backward(); optimizer.step()``."""
    dist = torch.distributions.Beta(torch.tensor(beta), torch.tensor(beta))

    def step(ctx, micro_batches):
        model = ctx.model
        ctx.optimizer.zero_grad()
        n = sum(ctx.batch_size(mb) for mb in micro_batches)
        for x, y in micro_batches:
            if beta > 0 and float(torch.rand(1)) < cutmix_prob:
                lam = float(dist.sample())
                rand_index = torch.randperm(x.size(0))
                bbx1, bby1, bbx2, bby2 = rand_bbox(x.size(), lam)
                x = x.clone()
                x[:, :, bbx1:bbx2, bby1:bby2] = x[rand_index, :, bbx1:bbx2, bby1:bby2]
                lam = 1 - ((bbx2 - bbx1) * (bby2 - bby1) / (x.size(-1) * x.size(-2)))
                out = model(x)
                loss = F.cross_entropy(out, y) * lam + F.cross_entropy(out, y[rand_index]) * (1.0 - lam)
            else:
                loss = ctx.loss_fn(model, (x, y))
            (loss * len(y) / n).backward()
        ctx.optimizer.step()
        return loss.detach()

    torch.manual_seed(0)
    return tropt.Setup(SmallResNet(), lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                                                 nesterov=True),
                       image_batches(3), val_data=image_batches(2, seed=1),
                       scheduler=lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [150, 225], 0.1), step=step,
                       num_classes=C, metric=tropt.Metric(accuracy, higher_is_better=True, name="top1"))


MIX = "facebookresearch/mixup-cifar10/train.py"
TIMM = "huggingface/pytorch-image-models/train.py"
CUT = "clovaai/CutMix-PyTorch/train.py"
BN_NOTES = {"loop.accumulation": "BatchNorm's batch statistics differ between micro-batches by design",
            "loop.ddp": "BatchNorm normalises each process's samples by themselves by design"}

PORTS: list[Port] = [
    Port("mixup_cifar10_np", "mixup", MIX, mixup_cifar_setup, notes=BN_NOTES, bugs=(
        Bug("mixup_target_not_mixed", "model.overfit_batch", ("target",),
            lambda: mixup_cifar_setup(mix_target=False),
            source=f"{MIX}: mixup_criterion = lam * criterion(pred, y_a) + (1 - lam) * criterion(pred, y_b)"),
    )),
    Port("timm_mixup_fn_soft_target", "mixup", TIMM, timm_mixup_setup,
         notes={**BN_NOTES, "model.overfit_batch": "soft (mixed, label-smoothed) targets put the floor above 0"}),
    Port("cutmix_torch_beta", "mixup", CUT, cutmix_setup,
         notes={**BN_NOTES, "loop.scheduler_cadence": "MultiStepLR is stepped once per epoch",
                "dynamics.loss_curve": "(with fix_4) noisy late: batches alternate between CutMix and plain CE"}),
]
