"""Semantic segmentation port (held-out probe "vision"). Paraphrased, never copied.

``deeplabv3_poly_ignore255``: VainF/DeepLabV3Plus-Pytorch ``main.py`` (the widely copied DeepLab training loop):
``nn.CrossEntropyLoss(ignore_index=255, reduction='mean')`` on per-pixel logits upsampled to the label size;
VOC-style labels where object boundaries and "void" regions are 255 (here ~40% of the pixels, varying per image);
SGD(momentum 0.9, wd 1e-4) with the backbone at 0.1x the head's LR (two param groups); ``utils.PolyLR`` (an
``_LRScheduler``: ``base_lr * (1 - last_epoch / max_iters) ** 0.9``, floored at min_lr) stepped after every
iteration (``scheduler.step()`` inside the batch loop)
BatchNorm in backbone and ASPP head
validation by mIoU
from a confusion matrix that skips 255.

Planted bug:
- ``seg_poly_stepped_per_epoch``: the PolyLR is sized in iterations (``total_itrs``) but stepped once per epoch
  (``scheduler.step()`` moved to the epoch loop, as in many ports of torchvision's segmentation reference whose
  ``lr_scheduler`` is stepped per iteration) -- the LR barely decays.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port

NC, HW, IGNORE = 3, 8, 255


def seg_images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 3, 8, 8) images with a bright square (class 1) and a dark square (class 2) on background 0; labels
    (n, 8, 8) long with the squares' 1-pixel borders and a random void band set to 255."""
    g = torch.Generator().manual_seed(seed)
    x = 0.3 * torch.randn(n, 3, HW, HW, generator=g)
    y = torch.zeros(n, HW, HW, dtype=torch.long)
    for i in range(n):
        for cls, shift in ((1, 1.5), (2, -1.5)):
            r, c = (int(v) for v in torch.randint(0, HW - 3, (2,), generator=g))
            x[i, :, r:r + 3, c:c + 3] += shift
            y[i, max(r - 1, 0):r + 4, max(c - 1, 0):c + 4] = IGNORE  # the boundary is void (VOC)
            y[i, r + 1, c + 1] = cls  # only the square's centre stays labelled
            y[i, r:r + 3, c:c + 3][y[i, r:r + 3, c:c + 3] == IGNORE] = IGNORE
        band = int(torch.randint(0, HW, (1,), generator=g))
        y[i, band, :] = IGNORE  # a void band: the share of ignored pixels varies per image
    return x, y


def seg_batches(n_batches: int, batch: int = 8, seed: int = 0) -> list:
    x, y = seg_images(n_batches * batch, seed)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n_batches * batch, batch)]


class TinyDeepLab(nn.Module):
    """backbone (two conv-BN-ReLU, output stride 2), an ASPP-lite head (1x1 + dilated 3x3 branches, concat,
    projection), a 1x1 classifier, bilinear upsampling to the input size (DeepLabV3's ``_SimpleSegmentationModel``)."""

    def __init__(self, w: int = 8) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                      nn.Conv2d(w, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.aspp1 = nn.Sequential(nn.Conv2d(w, w, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.aspp2 = nn.Sequential(nn.Conv2d(w, w, 3, padding=2, dilation=2, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(2 * w, w, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                     nn.Dropout(0.1))
        self.classifier = nn.Conv2d(w, NC, 1)

    def forward(self, x):
        size = x.shape[-2:]
        f = self.backbone(x)
        f = self.project(torch.cat([self.aspp1(f), self.aspp2(f)], 1))
        return F.interpolate(self.classifier(f), size=size, mode="bilinear", align_corners=False)


class PolyLR(torch.optim.lr_scheduler.LRScheduler):
    """DeepLabV3Plus-Pytorch utils/scheduler.py PolyLR, re-stated."""

    def __init__(self, optimizer, max_iters: int, power: float = 0.9, last_epoch: int = -1, min_lr: float = 1e-6):
        self.power, self.max_iters, self.min_lr = power, max_iters, min_lr
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [max(base_lr * (1 - self.last_epoch / self.max_iters) ** self.power, self.min_lr)
                for base_lr in self.base_lrs]


def miou(model: nn.Module, val_data: list) -> float:
    """main.py validate(): a confusion matrix over labelled pixels (255 skipped), mean IoU over classes."""
    hist = torch.zeros(NC, NC)
    with torch.no_grad():
        for x, y in val_data:
            pred = model(x).argmax(1)
            keep = y != IGNORE
            hist += torch.bincount(NC * y[keep] + pred[keep], minlength=NC * NC).reshape(NC, NC).float()
    iou = hist.diag() / (hist.sum(0) + hist.sum(1) - hist.diag()).clamp(min=1)
    return float(iou.mean())


TOTAL_ITRS, ITRS_PER_EPOCH = 30, 3


def deeplab_setup(*, per_epoch: bool = False) -> tropt.Setup:
    """main.py's loop: ``model.train()``; per batch ``optimizer.zero_grad()``, ``loss = criterion(model(images),
    labels)``, ``loss.backward()``, ``optimizer.step()``, ``scheduler.step()``; (no accumulation upstream)."""
    criterion = nn.CrossEntropyLoss(ignore_index=IGNORE, reduction="mean")

    def step(ctx, micro_batches):
        model, opt = ctx.model, ctx.optimizer
        model.train()
        opt.zero_grad()
        n = sum(ctx.batch_size(mb) for mb in micro_batches)
        for mb in micro_batches:
            loss = ctx.loss_fn(model, mb) * ctx.batch_size(mb) / n
            loss.backward()
        opt.step()
        ctx.cur_itrs = getattr(ctx, "cur_itrs", 0) + 1
        if not per_epoch or ctx.cur_itrs % ITRS_PER_EPOCH == 0:  # BUG when per_epoch: once per epoch
            ctx.scheduler.step()
        return loss.detach()

    def opt(m):
        return torch.optim.SGD([{"params": m.backbone.parameters(), "lr": 0.1 * 0.05},
                                {"params": [p for n_, p in m.named_parameters() if not n_.startswith("backbone")],
                                 "lr": 0.05}], lr=0.05, momentum=0.9, weight_decay=1e-4)

    torch.manual_seed(0)
    return tropt.Setup(TinyDeepLab(), lambda m, b: criterion(m(b[0]), b[1]), opt, seg_batches(3),
                       val_data=seg_batches(2, seed=1), scheduler=lambda o: PolyLR(o, TOTAL_ITRS, power=0.9),
                       step=step, num_classes=NC, metric=tropt.Metric(miou, higher_is_better=True, name="mIoU"))


DL = "VainF/DeepLabV3Plus-Pytorch/main.py"
BN_NOTES = {"loop.accumulation": "BatchNorm's batch statistics differ between micro-batches by design",
            "loop.ddp": "BatchNorm normalises each process's samples by themselves by design"}

PORTS: list[Port] = [
    Port("deeplabv3_poly_ignore255", "segmentation", DL, deeplab_setup, notes=BN_NOTES, bugs=(
        Bug("seg_poly_stepped_per_epoch", "loop.scheduler_cadence", ("per epoch",),
            lambda: deeplab_setup(per_epoch=True),
            source=f"{DL}: `scheduler.step()` sits inside the batch loop, PolyLR sized by total_itrs"),
    )),
]
