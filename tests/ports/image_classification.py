"""Image classification ports (issue 28): EMA weights kept beside the model, mixup / cutmix with soft targets, AMP,
label smoothing, BatchNorm ResNets. Paraphrased from their upstreams (named in each builder), never copied.

Tiny convolutional models on generated 3x8x8 images: the class is the quadrant that holds a bright blob.

The ports already in ``support`` (the native-scaler wrapper, SAM, activation checkpointing with dropout and the
spectrally normalised classifiers) are wrapped here as they are; the new ones are:

- ``timm_ema_mixup_bf16``: timm's ``train_one_epoch`` with a ``ModelEmaV3``-style EMA on ``ctx.model_ema``, mixup
  at collate time (``FastCollateMixup``: soft targets with label smoothing), bf16 autocast, accumulation with the
  loss divided by the accumulation steps, a per-update LR schedule (``step_update``);
- ``torchvision_ref_ema_warmup``: torchvision's ``references/classification/train.py``: ``CrossEntropyLoss`` with
  label smoothing, cutmix in the collate function, ``ExponentialMovingAverage`` (an ``AveragedModel``) updated every
  ``model_ema_steps`` iterations and reset while the LR warms up, a ``SequentialLR`` (``LinearLR`` warm-up, then
  cosine) stepped once per epoch, a checkpoint that holds the EMA;
- ``cifar_resnet_bn``: kuangliu/pytorch-cifar's ``main.py``: a small ResNet with BatchNorm, SGD with momentum and
  weight decay, ``CosineAnnealingLR`` stepped per epoch.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from support import family_ports as fp
from support import real_loops as rl
from torch import nn
from torch.nn import functional as F

import tropt
from ports import Bug, Port

C, HW = 4, 8  # classes, image side
TRL = "tests/loop/test_real_loops.py"


# ------------------------------------------------------------------ generated images
def images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 3, 8, 8) noise images with a bright 4x4 blob in the quadrant of the class (0..3)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    x = 0.5 * torch.randn(n, 3, HW, HW, generator=g)
    for i, c in enumerate(y.tolist()):
        r, s = 4 * (c // 2), 4 * (c % 2)
        x[i, :, r:r + 4, s:s + 4] += 1.5
    return x, y


def image_batches(n_batches: int, batch: int = 32, seed: int = 0) -> list:
    x, y = images(n_batches * batch, seed)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n_batches * batch, batch)]


def one_hot_smooth(y: torch.Tensor, smoothing: float) -> torch.Tensor:
    off = smoothing / C
    return torch.full((y.numel(), C), off).scatter_(1, y[:, None], 1.0 - smoothing + off)


def mixup_batches(n_batches: int, alpha: float = 0.8, smoothing: float = 0.1, seed: int = 0) -> list:
    """timm's ``FastCollateMixup`` (batch mode): each collated batch mixed with its own reverse by one lambda drawn
    from Beta(alpha, alpha); targets are the same mix of label-smoothed one-hots."""
    rng = np.random.default_rng(seed + 100)
    out = []
    for x, y in image_batches(n_batches, seed=seed):
        lam = float(rng.beta(alpha, alpha))  # one draw per collated batch
        soft = one_hot_smooth(y, smoothing)
        out.append((lam * x + (1 - lam) * x.flip(0), lam * soft + (1 - lam) * soft.flip(0)))
    return out


def cutmix_batches(n_batches: int, alpha: float = 1.0, seed: int = 0) -> list:
    """torchvision's ``v2.CutMix`` in the collate function: a box of the batch's rolled neighbour pasted in, the
    one-hot targets mixed by the box's area."""
    rng = np.random.default_rng(seed + 200)
    out = []
    for x, y in image_batches(n_batches, seed=seed):
        cut = int(HW * math.sqrt(1 - float(rng.beta(alpha, alpha))))
        r, s = (int(v) for v in rng.integers(0, HW - cut + 1, 2))
        x = x.clone()
        x[:, :, r:r + cut, s:s + cut] = x.roll(1, 0)[:, :, r:r + cut, s:s + cut]
        lam = 1 - cut * cut / (HW * HW)
        hot = F.one_hot(y, C).float()
        out.append((x, lam * hot + (1 - lam) * hot.roll(1, 0)))
    return out


def soft_target_ce(model: nn.Module, batch) -> torch.Tensor:
    """timm's ``SoftTargetCrossEntropy`` on mixed batches (the mean over samples of -sum(target * log_softmax)),
    its ``validate_loss_fn`` (``CrossEntropyLoss``) on hard-label validation batches."""
    x, target = batch
    logits = model(x)
    if not target.is_floating_point():
        return F.cross_entropy(logits, target)
    return torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()


def accuracy(model: nn.Module, val_data: list) -> float:
    """Top-1 accuracy on the validation batches (the EMA's and the model's validate()); soft targets by their
    largest share."""
    right = total = 0
    with torch.no_grad():
        for x, y in val_data:
            hard = y.argmax(1) if y.is_floating_point() else y
            right, total = right + int((model(x).argmax(1) == hard).sum()), total + len(hard)
    return right / total


def cutmix_collate(samples: list) -> tuple:
    """torchvision's ``collate_fn`` with ``RandomChoice([MixUp, CutMix])`` (here CutMix, alpha 1): a fresh draw per
    batch from the global RNG."""
    x = torch.stack([s[0] for s in samples])
    y = torch.stack([s[1] for s in samples])
    lam = float(torch.distributions.Beta(1.0, 1.0).sample())
    cut = int(HW * math.sqrt(1 - lam))
    r, s = (int(v) for v in torch.randint(0, HW - cut + 1, (2,)))
    x[:, :, r:r + cut, s:s + cut] = x.roll(1, 0)[:, :, r:r + cut, s:s + cut]
    lam = 1 - cut * cut / (HW * HW)
    hot = F.one_hot(y, C).float()
    return x, lam * hot + (1 - lam) * hot.roll(1, 0)


class SmallConvNet(nn.Module):
    """conv-BN-ReLU stem, one conv stage, global pooling, a linear head (a timm model's skeleton, tiny)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stage = nn.Sequential(nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False),
                                   nn.BatchNorm2d(width), nn.ReLU())
        self.head = nn.Linear(width, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage(self.stem(x)).mean((2, 3)))


# ------------------------------------------------------------------ timm: ModelEma, mixup, bf16, accumulation
class ModelEma(nn.Module):
    """timm's ``ModelEmaV3``: a deep copy of the model whose float state follows ``decay * ema + (1 - decay) * model``
    after each optimizer update (warm-up of the decay as ``min(decay, (1 + step) / (10 + step))``), buffers copied."""

    def __init__(self, model: nn.Module, decay: float = 0.998) -> None:
        super().__init__()
        self.module = copy.deepcopy(model).eval()
        self.decay = decay
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        decay = min(self.decay, (1 + step) / (10 + step))
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema_v.is_floating_point():
                ema_v.lerp_(model_v.to(ema_v.dtype), 1.0 - decay)
            else:
                ema_v.copy_(model_v)


def timm_setup(*, ema_per_micro: bool = False, divide: bool = True, k: int = 2) -> tropt.Setup:
    """timm ``train.py`` ``train_one_epoch`` (huggingface/pytorch-image-models): mixup at collate time with soft
    label-smoothed targets, ``SoftTargetCrossEntropy``, bf16 ``amp_autocast``, ``loss /= accum_steps``, the update on
    the last micro-batch, ``optimizer.zero_grad()``, ``model_ema.update(model, step=num_updates)``, then
    ``lr_scheduler.step_update(num_updates)``. Flags plant documented bugs (see the Bug records)."""

    def step(ctx, micro_batches):
        model, opt = ctx.model, ctx.optimizer
        if not hasattr(ctx, "model_ema"):
            ctx.model_ema, ctx.num_updates = ModelEma(model), 0
        steps = len(micro_batches)
        for i, mb in enumerate(micro_batches):
            with ctx.autocast():
                loss = ctx.loss_fn(model, mb)
            if divide:
                loss = loss / steps
            loss.backward()
            if ema_per_micro:  # BUG: the EMA follows every micro-batch, not every update
                ctx.model_ema.update(model, step=ctx.num_updates)
            if i == steps - 1:
                torch.nn.utils.clip_grad_norm_(model.parameters(), ctx.grad_clip)
                opt.step()
        ctx.num_updates += 1
        opt.zero_grad()
        if not ema_per_micro:
            ctx.model_ema.update(model, step=ctx.num_updates)
        ctx.scheduler.step()  # step_update: per optimizer update
        return loss.detach() * (steps if divide else 1)

    torch.manual_seed(0)
    sched = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3))  # noqa: E731
    return tropt.Setup(SmallConvNet(), soft_target_ce, lambda m: torch.optim.AdamW(m.parameters(), lr=5e-3,
                                                                                  weight_decay=0.05),
                       mixup_batches(3), val_data=image_batches(2, seed=1), scheduler=sched, step=step,
                       accumulation_steps=k, grad_clip=1.0, precision="bf16", num_classes=C,
                       metric=tropt.Metric(accuracy, higher_is_better=True, name="top1"))


# ------------------------------------------------------------------ torchvision references: EMA, warm-up, cutmix
STEPS_PER_EPOCH, WARMUP_EPOCHS, EPOCHS = 3, 2, 30


def ema_decay(batch_size: int = 32, ema_steps: int = 2, decay: float = 0.99998, world_size: int = 1) -> float:
    """The reference's decay adjustment: alpha = 1 - decay scaled by world_size * batch_size * ema_steps / epochs."""
    alpha = min(1.0, (1.0 - decay) * world_size * batch_size * ema_steps / EPOCHS)
    return 1.0 - alpha


def exponential_moving_average(model: nn.Module, decay: float) -> torch.optim.swa_utils.AveragedModel:
    """torchvision's ``ExponentialMovingAverage``: an ``AveragedModel`` with ``decay * avg + (1 - decay) * param``
    over parameters and buffers."""
    def ema_avg(avg, param, num_averaged):
        return decay * avg + (1.0 - decay) * param

    return torch.optim.swa_utils.AveragedModel(model, avg_fn=ema_avg, use_buffers=True)


def warmup_cosine(opt: torch.optim.Optimizer):
    """``SequentialLR([LinearLR(start_factor=0.01, total_iters=warmup), CosineAnnealingLR(T_max=epochs - warmup)])``,
    sized in epochs."""
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=WARMUP_EPOCHS)
    main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS - WARMUP_EPOCHS)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, main], milestones=[WARMUP_EPOCHS])


def torchvision_setup(*, checkpoint_ema: bool = True, ema_steps: int = 2, mix_eval: bool = False) -> tropt.Setup:
    """torchvision ``references/classification/train.py`` (pytorch/vision): ``train_one_epoch`` with
    ``CrossEntropyLoss(label_smoothing=0.1)`` on cutmix soft targets, ``zero_grad -> backward -> clip -> step``,
    ``model_ema.update_parameters(model)`` every ``model_ema_steps`` iterations and ``n_averaged`` reset during the
    warm-up epochs; ``lr_scheduler.step()`` once per epoch; the checkpoint holds model, optimizer, scheduler, EMA
    and the epoch. ``mix_eval`` hands the training ``collate_fn`` (cutmix) to the test loader as well."""
    crit = nn.CrossEntropyLoss(label_smoothing=0.1)

    def step(ctx, micro_batches):
        model, opt = ctx.model, ctx.optimizer
        if not hasattr(ctx, "model_ema"):
            ctx.model_ema, ctx.it = exponential_moving_average(model, ema_decay(ema_steps=ema_steps)), 0
        opt.zero_grad()
        for mb in micro_batches:  # the reference does not accumulate: one micro-batch per call
            loss = ctx.loss_fn(model, mb) / len(micro_batches)
            loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), ctx.grad_clip)
        opt.step()
        epoch, i = divmod(ctx.it, STEPS_PER_EPOCH)
        if i % ema_steps == 0:
            ctx.model_ema.update_parameters(model)
            if epoch < WARMUP_EPOCHS:
                ctx.model_ema.n_averaged.fill_(0)  # the EMA restarts from the weights while the LR warms up
        ctx.it += 1
        if ctx.it % STEPS_PER_EPOCH == 0:
            ctx.scheduler.step()  # the schedule is sized in epochs
        return loss.detach() * len(micro_batches)

    def save(ctx):
        state = {"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict(),
                 "lr_scheduler": ctx.scheduler.state_dict(), "it": getattr(ctx, "it", 0)}
        if checkpoint_ema and hasattr(ctx, "model_ema"):
            state["model_ema"] = ctx.model_ema.state_dict()
        return state

    def load(ctx, state):
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["optimizer"])
        ctx.scheduler.load_state_dict(state["lr_scheduler"])
        ctx.it = state["it"]
        if "model_ema" in state:
            if not hasattr(ctx, "model_ema"):
                ctx.model_ema = exponential_moving_average(ctx.model, ema_decay(ema_steps=ema_steps))
            ctx.model_ema.load_state_dict(state["model_ema"])

    val: Any = image_batches(2, seed=1)
    if mix_eval:  # BUG: the training collate_fn (cutmix) handed to the test loader too
        x, y = images(64, seed=1)
        val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32,
                                          collate_fn=cutmix_collate)
    torch.manual_seed(0)
    return tropt.Setup(SmallConvNet(), lambda m, b: crit(m(b[0]), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4),
                       cutmix_batches(3), val_data=val, scheduler=warmup_cosine, step=step,
                       grad_clip=1.0, num_classes=C, save_state=save, load_state=load,
                       metric=tropt.Metric(accuracy, higher_is_better=True, name="acc1"))


# ------------------------------------------------------------------ kuangliu/pytorch-cifar: ResNet with BatchNorm
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """The CIFAR ResNet: a 3x3 stem, BasicBlock stages (the second strided), average pooling, a linear layer."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.linear = nn.Linear(2 * width, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer2(self.layer1(F.relu(self.bn1(self.conv1(x)))))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))


def cifar_setup(*, forget_zero_grad: bool = False, eval_in_step: bool = False) -> tropt.Setup:
    """kuangliu/pytorch-cifar ``main.py``: ``train()``: ``net.train()``, per batch ``optimizer.zero_grad()``,
    ``criterion(net(inputs), targets).backward()``, ``optimizer.step()``; SGD(lr=0.1, momentum=0.9,
    weight_decay=5e-4) and ``CosineAnnealingLR(T_max=200)`` stepped once per epoch."""

    def step(ctx, micro_batches):
        net, opt = ctx.model, ctx.optimizer
        net.eval() if eval_in_step else net.train()  # BUG when eval: test()'s net.eval() left in place
        if not forget_zero_grad:  # BUG when forgotten: gradients pile up across iterations
            opt.zero_grad()
        for mb in micro_batches:
            loss = ctx.loss_fn(net, mb) / len(micro_batches)
            loss.backward()
        opt.step()
        ctx.it = getattr(ctx, "it", 0) + 1
        if ctx.it % STEPS_PER_EPOCH == 0:
            ctx.scheduler.step()
        return loss.detach() * len(micro_batches)

    torch.manual_seed(0)
    return tropt.Setup(ResNet(), lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4),
                       image_batches(3), val_data=image_batches(2, seed=1),
                       scheduler=lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=200), step=step,
                       num_classes=C, metric=tropt.Metric(accuracy, higher_is_better=True, name="acc"))


# ------------------------------------------------------------------ the support ports, with what they follow
def native_scaler_port() -> tropt.Setup:
    """timm's ``train_one_epoch`` with its ``NativeScaler`` (timm/utils/cuda.py): a class owning its GradScaler
    whose call scales, backpropagates and, on an update, unscales, clips, steps and updates
    (``support.real_loops.native_scaler_setup``)."""
    return rl.native_scaler_setup()


def sam_port() -> tropt.Setup:
    """Sharpness-aware minimisation as davda54/sam's ``sam.py`` wrapper optimizer does it, on scikit-learn's digits:
    ``first_step`` to ``w + e(w)``, a second pass, ``second_step`` calling ``base_optimizer.step()``; the checkpoint
    holds the base optimizer too (``support.real_loops.sam_setup``)."""
    return rl.sam_setup()


def checkpointed_dropout_port() -> tropt.Setup:
    """Activation checkpointing as ``torch.utils.checkpoint`` documents it: residual feed-forward blocks with
    dropout, each recomputed in the backward pass with ``use_reentrant=False``
    (``support.family_ports.checkpointed_dropout_setup``)."""
    return fp.checkpointed_dropout_setup()


def spectral_norm_hooks_port() -> tropt.Setup:
    """An SNGAN-style classifier whose layers are wrapped in the hook-based ``torch.nn.utils.spectral_norm`` (as
    pytorch-spectral-normalization-gan's ``model_resnet.py`` does), after one forward pass with gradients enabled
    (``support.family_ports.spectral_norm_setup("hooks")``)."""
    return fp.spectral_norm_setup("hooks")


def weight_norm_hooks_port() -> tropt.Setup:
    """The same classifier with the hook-based ``torch.nn.utils.weight_norm``
    (``support.family_ports.spectral_norm_setup("weight_norm")``)."""
    return fp.spectral_norm_setup("weight_norm")


def spectral_norm_parametrization_port() -> tropt.Setup:
    """The same classifier with ``torch.nn.utils.parametrizations.spectral_norm``
    (``support.family_ports.spectral_norm_setup("parametrization")``)."""
    return fp.spectral_norm_setup("parametrization")


TIMM = "huggingface/pytorch-image-models/train.py"
TV = "pytorch/vision/references/classification/train.py"
BN_NOTES = {"loop.accumulation": "BatchNorm's batch statistics differ between micro-batches by design",
            "loop.ddp": "BatchNorm normalises each process's samples by themselves by design"}
SN_NOTES = {"model.overfit_batch": "spectral normalisation bounds the logits: the loss has a floor",
            "loop.accumulation": "the power iteration advances on every forward (latent: no accumulation)"}
SOFT_NOTES = {"model.overfit_batch": "soft (mixed, label-smoothed) targets put the floor above 0"}

PORTS: list[Port] = [
    Port("timm_ema_mixup_bf16", "image_classification", TIMM, timm_setup, notes={**BN_NOTES, **SOFT_NOTES}, bugs=(
        Bug("timm_loss_not_divided_by_accum_steps", "loop.accumulation", ("2× the full-batch one",
                                                                           "micro-batch losses are summed"),
            lambda: timm_setup(divide=False), source=f"{TIMM}: `if accum_steps > 1: loss /= accum_steps`, dropped"),
        Bug("timm_ema_updated_per_micro_batch", "loop.accumulation", ("model_ema", "once per micro-batch"),
            lambda: timm_setup(ema_per_micro=True),
            source=f"{TIMM}: `model_ema.update(model, step=num_updates)` sits after the `need_update` guard; "
                   "issue 28 (an EMA updated per micro-batch)"),
    )),
    Port("torchvision_ref_ema_warmup", "image_classification", TV, torchvision_setup,
         notes={**BN_NOTES, **SOFT_NOTES, "loop.scheduler_cadence": "the schedule is stepped once per epoch",
                "loop.resume": "the reference's checkpoint holds no RNG state"},
         bugs=(Bug("torchvision_checkpoint_without_model_ema", "loop.resume", ("model_ema",),
                   lambda: torchvision_setup(checkpoint_ema=False),
                   source=f"{TV}: `checkpoint[\"model_ema\"] = model_ema.state_dict()`, left out; issue 28"),
               Bug("torchvision_cutmix_in_the_test_loader", "data.eval_transforms",
                   ("random transforms in evaluation",),
                   lambda: torchvision_setup(mix_eval=True), checks=("data.eval_transforms",),
                   source=f"{TV}: `collate_fn` (mixup / cutmix) is given to the training DataLoader only"))),
    Port("cifar_resnet_bn", "image_classification", "kuangliu/pytorch-cifar/main.py", cifar_setup,
         notes={**BN_NOTES, "loop.scheduler_cadence": "CosineAnnealingLR is stepped once per epoch",
                "dynamics.lr_range": "inconclusive on a few quick steps of a BatchNorm ResNet"}, bugs=(
             Bug("cifar_without_zero_grad", "loop.zero_grad", ("plus the gradient left over from step 1",),
                 lambda: cifar_setup(forget_zero_grad=True),
                 source="pytorch/tutorials/recipes_source/recipes/zeroing_out_gradients.py"),
             Bug("cifar_left_in_eval_mode", "loop.train_mode", ("model.eval() inside the step",),
                 lambda: cifar_setup(eval_in_step=True),
                 source="kuangliu/pytorch-cifar/main.py: test() calls net.eval(); train() must call net.train()"),
         )),
    # support.real_loops and support.family_ports (issue 28's first ports), wrapped as they are
    Port("native_scaler_wrapper", "image_classification", "huggingface/pytorch-image-models/timm/utils/cuda.py",
         native_scaler_port, bugs=(
             Bug("native_scaler_clip_before_unscale", "loop.loss_scaling",
                 ("clip_grad_norm_ ran on still-scaled gradients",),
                 lambda: rl.native_scaler_setup(clip_before_unscale=True),
                 source=f"{TRL}; torch.amp docs: unscale_ before clipping (gradient clipping with a GradScaler)"),
         )),
    Port("sam_two_passes", "image_classification", "davda54/sam/sam.py", sam_port,
         notes={"data.eval_transforms": "the digits' held-out rows differ in a few border pixels (another population)"},
         bugs=(
        Bug("sam_checkpoint_without_base_optimizer", "loop.resume",
            ("first divergence: wrapped optimizer state", "base_optimizer"),
            lambda: rl.sam_setup(checkpoint_base=False), source=f"davda54/sam#73; {TRL}"),
    )),
    Port("checkpointed_dropout_mlp", "image_classification", "pytorch/pytorch/torch/utils/checkpoint.py",
         checkpointed_dropout_port),
    Port("spectral_norm_hooks", "image_classification", "christiancosgrove/pytorch-spectral-normalization-gan/"
         "model_resnet.py", spectral_norm_hooks_port,
         notes=SN_NOTES),
    Port("weight_norm_hooks", "image_classification", "pytorch/pytorch/torch/nn/utils/weight_norm.py",
         weight_norm_hooks_port),
    Port("spectral_norm_parametrization", "image_classification",
         "pytorch/pytorch/torch/nn/utils/parametrizations.py", spectral_norm_parametrization_port,
         notes=SN_NOTES),
]
