"""Backbones whose BatchNorm layers are held in eval mode on purpose while the rest trains (issue 28), paraphrased from
their public originals, not copied:

- ``NormEvalResNet``: mmdetection's ``mmdet/models/backbones/resnet.py`` (class ``ResNet``): ``frozen_stages`` puts the
  stem and the first stages in eval mode with ``requires_grad=False``, and ``norm_eval=True`` puts every BatchNorm
  back in eval mode in the module's own ``train()`` override, on every call, while their affine weights of the later
  stages stay trainable;
- ``set_bn_eval``: the step-side variant (jwyang/faster-rcnn.pytorch's ``trainval_net.py``: ``model.train()`` then
  ``model.apply(set_bn_eval)`` each iteration), which tropt cannot tell from a forgotten ``model.eval()`` unless the
  user declares it (``options={"loop.train_mode": {"held_in_eval": [...]}}``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import tropt

CHANNELS, C = 3, 3


def conv_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class NormEvalResNet(nn.Module):
    """A tiny ResNet-style backbone with mmdet's ``frozen_stages`` and ``norm_eval`` semantics."""

    def __init__(self, frozen_stages: int = 1, norm_eval: bool = True, width: int = 8) -> None:
        super().__init__()
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval
        self.stem = conv_bn(CHANNELS, width)
        self.layer1 = conv_bn(width, width)
        self.layer2 = conv_bn(width, 2 * width)
        self._freeze_stages()

    def _freeze_stages(self) -> None:
        if self.frozen_stages >= 0:
            self.stem.eval()
            for p in self.stem.parameters():
                p.requires_grad = False
        for i in range(1, self.frozen_stages + 1):
            layer = getattr(self, f"layer{i}")
            layer.eval()
            for p in layer.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True) -> NormEvalResNet:
        """Keep the frozen stages frozen and, with ``norm_eval``, every BatchNorm in eval mode (running statistics
        kept from pre-training), whatever the mode asked for."""
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(self.layer1(self.stem(x)))


class Classifier(nn.Module):
    """A backbone, global pooling and a linear head (with dropout when ``dropout`` > 0)."""

    def __init__(self, backbone: nn.Module, features: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(features, C)) if dropout else nn.Linear(features, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x).mean((2, 3)))


def image_batches(n_batches: int = 3, batch: int = 16, size: int = 8, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, CHANNELS, size, size, generator=g)
        out.append((x, (x.mean((2, 3)) @ torch.arange(1.0, CHANNELS + 1)).gt(0).long() + (x[:, 0, 0, 0] > 1).long()))
    return out


def ce(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def step_calling_train(ctx, micro_batches):
    """torchvision's ``train_one_epoch`` / mmdet's runner: ``model.train()`` before training, then the update."""
    ctx.model.train()
    return tropt.standard_step(ctx, micro_batches)


def set_bn_eval(m: nn.Module) -> None:
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        m.eval()


def step_with_bn_eval(ctx, micro_batches):
    """faster-rcnn.pytorch: ``model.train()`` then ``model.apply(set_bn_eval)`` each iteration."""
    ctx.model.train()
    ctx.model.apply(set_bn_eval)
    return tropt.standard_step(ctx, micro_batches)


def norm_eval_setup(step=step_calling_train, dropout: float = 0.0, **backbone: object) -> tropt.Setup:
    torch.manual_seed(0)
    model = Classifier(NormEvalResNet(**backbone), dropout=dropout).train()  # type: ignore[arg-type]
    return tropt.Setup(model, ce, lambda m: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.05,
                                                            momentum=0.9), image_batches(), step=step, num_classes=C)
