"""Detection and segmentation fine-tuning ports (issue 28): frozen backbone stages and BatchNorm held in eval.

Each port keeps its upstream's way of freezing: torchvision's detection references build the backbone with
``FrozenBatchNorm2d`` (statistics and affine weights as buffers) and ``requires_grad=False`` on the stages below
``trainable_backbone_layers``; mmdetection's ``ResNet(frozen_stages=1, norm_eval=True)`` keeps its BatchNorm layers in
eval mode from its own ``train()`` override while their affine weights in the later stages train; torchvision's
segmentation references fine-tune an FCN whose head has dropout. Tiny models, generated images (a bright square whose
position and class the model must find).

- ``torchvision_detection_frozen_backbone``: pytorch/vision ``references/detection/train.py`` + ``engine.py``
  (``train_one_epoch``: ``model.train()``, the sum of the loss dict, ``zero_grad``/``backward``/``step``, a linear
  warm-up stepped per iteration in the first epoch; SGD over the parameters that require grad);
- ``mmdet_norm_eval_backbone``: open-mmlab/mmdetection ``mmdet/models/backbones/resnet.py`` (``frozen_stages``,
  ``norm_eval``, ``train()``) under a head with its own BatchNorm (``norm_cfg=dict(type='BN')``), trained as
  mmengine's loop does (``model.train()`` once per epoch, then ``optim_wrapper.update_params(loss)``);
- ``torchvision_segmentation_fcn``: pytorch/vision ``references/segmentation/train.py`` (``criterion``: cross entropy
  with ``ignore_index=255`` on ``out`` plus 0.5 x on ``aux``; ``PolynomialLR(power=0.9)`` stepped per iteration).

Planted bugs: the detection backbone frozen with ``requires_grad=False`` but built with ``nn.BatchNorm2d`` instead of
``FrozenBatchNorm2d`` (its running statistics keep updating in train mode); the segmentation loop that evaluates
(``model.eval()``) and never calls ``model.train()`` again (a classic of the PyTorch forums: dropout and BatchNorm
then run in eval while training); and the mmdet-style model handed over after validation without ``model.train()``:
its head's BatchNorm stays in eval.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import tropt
from ports import Bug, Port

SIDE, C = 8, 3


# ------------------------------------------------------------------ data
def _scenes(n: int = 48, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Batches of (image 3 x 8 x 8, class of the square, its box (x0, y0, x1, y1) / SIDE)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n // batch):
        img = 0.3 * torch.randn(batch, 3, SIDE, SIDE, generator=g)
        cls = torch.randint(0, C, (batch,), generator=g)
        x0 = torch.randint(0, SIDE - 3, (batch,), generator=g)
        y0 = torch.randint(0, SIDE - 3, (batch,), generator=g)
        for i in range(batch):
            img[i, int(cls[i]), y0[i]:y0[i] + 3, x0[i]:x0[i] + 3] += 2.0
        box = torch.stack([x0, y0, x0 + 3, y0 + 3], 1).float() / SIDE
        out.append((img, cls, box))
    return out


def _masks(n: int = 48, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of (image, per-pixel class: 0 background, 1 + the square's class inside it, 255 on its border)."""
    out = []
    for img, cls, box in _scenes(n, batch, seed):
        target = torch.zeros(img.shape[0], SIDE, SIDE, dtype=torch.long)
        for i in range(img.shape[0]):
            x0, y0 = int(box[i, 0] * SIDE), int(box[i, 1] * SIDE)
            target[i, y0:y0 + 3, x0:x0 + 3] = 1 + int(cls[i])
            target[i, y0 + 3:y0 + 4, x0:x0 + 3] = 255  # the references' "ignore" label on object borders
        out.append((img, target))
    return out


# ------------------------------------------------------------------ torchvision detection with FrozenBatchNorm2d
class FrozenBatchNorm2d(nn.Module):
    """torchvision.ops.FrozenBatchNorm2d, paraphrased: BatchNorm2d with statistics and affine weights as buffers."""

    def __init__(self, n: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        for name, init in (("weight", torch.ones), ("bias", torch.zeros), ("running_mean", torch.zeros),
                           ("running_var", torch.ones)):
            self.register_buffer(name, init(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)


def _stage(cin: int, cout: int, norm: Any, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), norm(cout), nn.ReLU())


class TinyDetector(nn.Module):
    """A backbone (stem, layer1, layer2), a classification head and a box-regression head on pooled features; in
    train mode the loss dict, as torchvision's detection models return it, from ``(images, targets)``."""

    def __init__(self, norm: Any = FrozenBatchNorm2d, trainable_layers: int = 1, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(_stage(3, width, norm), _stage(width, width, norm), _stage(width, width, norm, 2))
        self.cls_score = nn.Linear(width, C)
        self.bbox_pred = nn.Linear(width, 4)
        # torchvision's _resnet_fpn_extractor: only the last ``trainable_layers`` stages keep requires_grad
        for stage in list(self.body)[:len(self.body) - trainable_layers]:
            for p in stage.parameters():
                p.requires_grad_(False)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feat = self.body(images).mean((2, 3))
        return self.cls_score(feat), self.bbox_pred(feat).sigmoid()


def _detection_losses(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    images, cls, box = batch
    logits, boxes = model(images)
    return {"loss_classifier": F.cross_entropy(logits, cls), "loss_box_reg": F.smooth_l1_loss(boxes, box, beta=1 / 9)}


def _detection_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """``losses = sum(loss for loss in loss_dict.values())``, as train_one_epoch reduces it."""
    return sum(_detection_losses(model, batch).values())  # type: ignore[return-value]


def _train_one_epoch_step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """engine.train_one_epoch's iteration: model.train(), then the update (zero_grad, backward, step, warm-up step);
    tropt.standard_step does that update and weights micro-batches by their size."""
    ctx.model.train()
    return tropt.standard_step(ctx, micro)


def build_torchvision_detection(norm: Any = FrozenBatchNorm2d) -> tropt.Setup:
    """pytorch/vision references/detection/train.py: the backbone's BatchNorm replaced by FrozenBatchNorm2d
    (``norm_layer=misc_nn_ops.FrozenBatchNorm2d``), stages below ``trainable_backbone_layers`` frozen
    (requires_grad=False); ``params = [p for p in model.parameters() if p.requires_grad]``, SGD(lr=0.02,
    momentum=0.9, weight_decay=1e-4) (lr scaled to the tiny model); engine.train_one_epoch: ``model.train()``, the
    sum of the loss dict, ``optimizer.zero_grad(); losses.backward(); optimizer.step()`` and, in the first epoch, a
    LinearLR warm-up (start_factor=0.001, total_iters=len(data_loader) - 1) stepped per iteration."""
    torch.manual_seed(0)
    data = _scenes()
    return tropt.Setup(
        TinyDetector(norm=norm, trainable_layers=1).train(), _detection_loss,
        lambda m: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.05, momentum=0.9,
                                  weight_decay=1e-4),
        data, scheduler=lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.001, total_iters=len(data) - 1),
        step=_train_one_epoch_step, num_classes=C)


# ------------------------------------------------------------------ mmdetection ResNet(frozen_stages, norm_eval)
class NormEvalResNet(nn.Module):
    """mmdet's ResNet backbone, paraphrased: ``frozen_stages`` stages (from the stem) in eval mode with
    requires_grad=False; with ``norm_eval``, every BatchNorm put back in eval mode by ``train()`` itself."""

    def __init__(self, frozen_stages: int = 1, norm_eval: bool = True, width: int = 16) -> None:
        super().__init__()
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval
        self.stem = _stage(3, width, nn.BatchNorm2d)
        self.layer1 = _stage(width, width, nn.BatchNorm2d)
        self.layer2 = _stage(width, width, nn.BatchNorm2d, 2)
        self._freeze_stages()

    def _freeze_stages(self) -> None:
        stages = [self.stem, self.layer1, self.layer2][:self.frozen_stages + 1]
        for stage in stages:
            stage.eval()
            for p in stage.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True) -> NormEvalResNet:
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()  # trick: eval has effect on BatchNorm only
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(self.layer1(self.stem(x)))


class MMDetStyle(nn.Module):
    """The backbone under a shared conv head with its own BatchNorm (``norm_cfg=dict(type='BN')``, not covered by the
    backbone's norm_eval), then classification and box branches."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.backbone = NormEvalResNet(width=width)
        self.shared = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.fc_cls = nn.Linear(width, C)
        self.fc_reg = nn.Linear(width, 4)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feat = self.shared(self.backbone(images)).mean((2, 3))
        return self.fc_cls(feat), self.fc_reg(feat).sigmoid()


def _mmengine_step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """mmengine's EpochBasedTrainLoop: ``model.train()`` at the start of the epoch, then per iteration
    ``optim_wrapper.update_params(loss)`` (backward, step, zero_grad) on the summed loss dict."""
    ctx.model.train()
    return tropt.standard_step(ctx, micro)


def _mmengine_step_after_val(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """The bug: a hand-written loop that ran validation (model.eval()) and goes on updating without model.train()."""
    return tropt.standard_step(ctx, micro)


def build_mmdet(step: Any = _mmengine_step, handed_eval: bool = False) -> tropt.Setup:
    """open-mmlab/mmdetection mmdet/models/backbones/resnet.py: ``ResNet(frozen_stages=1, norm_eval=True)``, whose
    ``train()`` calls ``_freeze_stages()`` and then puts every BatchNorm of the backbone in eval mode, while the affine
    weights of the unfrozen stages train; a head with its own BatchNorm; SGD(lr=0.02, momentum=0.9,
    weight_decay=1e-4) as the configs' ``optim_wrapper`` (lr scaled to the tiny model); mmengine's loop calls
    ``model.train()`` each epoch."""
    torch.manual_seed(0)
    model = MMDetStyle()
    model.eval() if handed_eval else model.train()
    return tropt.Setup(model, _detection_loss,
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4),
                       _scenes(), step=step, num_classes=C)


# ------------------------------------------------------------------ torchvision segmentation (FCN)
class TinyFCN(nn.Module):
    """An FCN: a BatchNorm backbone, torchvision's FCNHead (conv, BN, ReLU, Dropout(0.1), 1x1 conv) on ``out`` and an
    auxiliary head; logits upsampled (bilinear) to the input size; a dict like torchvision's segmentation models."""

    def __init__(self, width: int = 16, classes: int = C + 1) -> None:
        super().__init__()
        self.layer1 = _stage(3, width, nn.BatchNorm2d)
        self.layer2 = _stage(width, width, nn.BatchNorm2d, 2)

        def head(cin: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, width // 2, 3, padding=1, bias=False), nn.BatchNorm2d(width // 2),
                                 nn.ReLU(), nn.Dropout(0.1), nn.Conv2d(width // 2, classes, 1))

        self.classifier, self.aux_classifier = head(width), head(width)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        aux_in = self.layer1(x)
        feat = self.layer2(aux_in)
        size = x.shape[-2:]
        return {"out": F.interpolate(self.classifier(feat), size=size, mode="bilinear", align_corners=False),
                "aux": F.interpolate(self.aux_classifier(aux_in), size=size, mode="bilinear", align_corners=False)}


def _seg_criterion(model: nn.Module, batch: Any) -> torch.Tensor:
    """references/segmentation/train.py's criterion: CE(ignore_index=255) on ``out`` + 0.5 x CE on ``aux``."""
    image, target = batch
    out = model(image)
    losses = {k: F.cross_entropy(v, target, ignore_index=255) for k, v in out.items()}
    return losses["out"] + 0.5 * losses["aux"]


def _seg_step(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """train_one_epoch: model.train(), then per iteration zero_grad, backward, step and lr_scheduler.step()."""
    ctx.model.train()
    return tropt.standard_step(ctx, micro)


def _seg_step_after_eval(ctx: tropt.StepContext, micro: list) -> torch.Tensor:
    """The bug: ``evaluate(model, ...)`` called ``model.eval()`` and the training loop never switches back."""
    return tropt.standard_step(ctx, micro)


def build_segmentation(step: Any = _seg_step, handed_eval: bool = False) -> tropt.Setup:
    """pytorch/vision references/segmentation/train.py: ``params_to_optimize`` (backbone, classifier and aux
    classifier parameters), SGD(lr=0.01, momentum=0.9, weight_decay=1e-4) (lr scaled to the tiny model),
    ``PolynomialLR(total_iters=iters_per_epoch * epochs, power=0.9)`` stepped per iteration; train_one_epoch calls
    ``model.train()``; ``criterion`` sums CE(ignore_index=255) on ``out`` and 0.5 x on ``aux``."""
    torch.manual_seed(0)
    model = TinyFCN()
    model.eval() if handed_eval else model.train()
    data = _masks()
    return tropt.Setup(model, _seg_criterion,
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4), data,
                       scheduler=lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=len(data) * 30,
                                                                                 power=0.9),
                       step=step)


VISION = "pytorch/vision/references/detection/engine.py"
MMDET = "open-mmlab/mmdetection/mmdet/models/backbones/resnet.py"
SEG = "pytorch/vision/references/segmentation/train.py"

PORTS = [
    Port("torchvision_detection_frozen_backbone", "detection", VISION, build_torchvision_detection, bugs=(
        Bug("frozen_stages_with_live_batchnorm", "loop.train_mode", ("body.0.1", "running statistics still update"),
            lambda: build_torchvision_detection(norm=nn.BatchNorm2d),
            source="torchvision's detection models use FrozenBatchNorm2d because a backbone frozen with "
                   "requires_grad=False but built with nn.BatchNorm2d keeps updating its running statistics in "
                   "train mode (references/detection, torchvision.ops.misc.FrozenBatchNorm2d)",
            checks=("loop.train_mode",)),)),
    Port("mmdet_norm_eval_backbone", "detection", MMDET, build_mmdet, bugs=(
        Bug("mmdet_head_bn_left_in_eval", "loop.train_mode", ("shared.1", "handed over in eval mode"),
            lambda: build_mmdet(_mmengine_step_after_val, handed_eval=True),
            source="mmengine runs model.train() at every epoch start (EpochBasedTrainLoop.run_epoch); a hand-written "
                   "loop that validates first must do the same", checks=("loop.train_mode",)),)),
    Port("torchvision_segmentation_fcn", "detection", SEG, build_segmentation, bugs=(
        Bug("fcn_never_back_to_train", "loop.train_mode", ("classifier.3", "handed over in eval mode"),
            lambda: build_segmentation(_seg_step_after_eval, handed_eval=True),
            source="PyTorch forums, 'model.eval() vs model.train()': evaluation before training leaves dropout and "
                   "BatchNorm in eval mode unless model.train() is called again", checks=("loop.train_mode",)),)),
]
