"""``setup_from_lightning``: a :class:`tropt.Setup` whose step is Lightning's automatic optimization of the user's
module.

The step reproduces what ``Trainer.fit`` does for one optimizer step (Lightning 2.x, ``loops/optimization/automatic.py``
and the precision plugins), calling the module's own hooks:

for each of the K micro-batches: ``training_step(batch, batch_idx)`` under the precision's autocast, the loss divided
by K, on the first micro-batch ``on_before_zero_grad`` + ``optimizer_zero_grad`` (after the forward pass, before
backward, as Lightning does), ``on_before_backward``, ``backward`` (of the scaled loss under ``16-mixed``),
``on_after_backward``; the last micro-batch runs as the closure of the module's ``optimizer_step`` hook, whose
``optimizer.step(closure)`` runs it, then unscale -> ``on_before_optimizer_step`` -> ``configure_gradient_clipping`` ->
``optimizer.step()`` (``scaler.step`` + ``scaler.update`` under ``16-mixed``); then every scheduler whose
``interval``/``frequency`` says so, through ``lr_scheduler_step``.

Two deliberate differences, both so that tropt's invariance checks test the user's module rather than a constant:

- Lightning divides each micro-batch's loss by ``accumulate_grad_batches`` whatever number of micro-batches the cycle
  really has. tropt calls the step with K = 1 and K = 4 micro-batches; each call divides by the K it was given, which
  is what Lightning does with ``accumulate_grad_batches=K``. (Lightning's last, short cycle of an epoch, divided by
  the configured value although it holds fewer batches, is not modelled.)
- The last micro-batch's closure runs before ``torch.optim.Optimizer.step`` is entered, not inside it, so that the
  gradients tropt captures at ``optimizer.step()`` are complete (identical for every optimizer that evaluates its
  closure once, i.e. all but LBFGS).

Schedules count optimizer steps with the configured ``accumulate_grad_batches`` (an epoch is
``ceil(len(train_dataloader) / accumulate_grad_batches)`` optimizer steps; a ``step`` scheduler with ``frequency`` f
steps when the epoch's batch count is a multiple of f, as Lightning's ``batch_idx + 1`` test does), so the learning
rate at each optimizer step is the one the user's Trainer gives. ``ReduceLROnPlateau`` schedulers wait for a
monitored validation metric that only a Trainer produces: they are left out, with a warning.

Outside a Trainer the module is attached to a small stand-in (``global_step``, ``current_epoch``,
``lr_schedulers()``, ``optimizers()``, ``estimated_stepping_batches``, the clipping settings) whose ``barebones=True``
makes ``self.log`` a no-op; Lightning's warning about it is silenced for the call.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from ..errors import SetupError, StepError
from ..setup import Setup
from ._frameworks import import_from, supported
from ._lightning_trainer import HIGH, LOW, InertConfig, Schedulers, Spec, TrainerStandIn, attached, parse_optimizers

__all__ = ["setup_from_lightning"]

_PRECISION = {"32": ("fp32", False), "32-true": ("fp32", False), "bf16": ("bf16", False), "bf16-mixed": ("bf16", False),
              "16": ("fp16", True), "16-mixed": ("fp16", True)}


# ------------------------------------------------------------------ the framework behind the module
def _framework(module: Any) -> tuple[str, str]:
    """("lightning.pytorch", "lightning") or ("pytorch_lightning", "pytorch_lightning") for the module's base class."""
    for cls in type(module).__mro__:
        if cls.__name__ == "LightningModule":
            if cls.__module__.startswith("lightning.pytorch"):
                return "lightning.pytorch", "lightning"
            if cls.__module__.startswith("pytorch_lightning"):
                return "pytorch_lightning", "pytorch_lightning"
    raise SetupError(
        f"setup_from_lightning: {type(module).__name__} is not a LightningModule",
        "pass your LightningModule (a subclass of lightning.pytorch.LightningModule); for a plain nn.Module build "
        "tropt.Setup(model, loss_fn, optimizer, train_data) yourself")


def _base(pkg: str) -> type:
    import importlib

    return importlib.import_module(pkg).LightningModule


def _overrides(obj: Any, base: type, name: str) -> bool:
    return getattr(type(obj), name, None) is not getattr(base, name, None)


# ------------------------------------------------------------------ training_step and its loss
def _unwrap(model: nn.Module) -> nn.Module:
    """The LightningModule inside DistributedDataParallel (loop.ddp), or the model itself."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _call_training_step(model: nn.Module, module: Any, batch: Any, batch_idx: int, pass_idx: bool) -> Any:
    args = (batch, batch_idx) if pass_idx else (batch,)
    if model is module:  # (cast: narrowed to nn.Module, whose __getattr__ stub types training_step as a Tensor)
        return cast(Any, module).training_step(*args)
    # Under DDP the forward pass must go through the wrapper (it prepares the gradient all-reduce), as Lightning's
    # strategy wrapper routes forward() to training_step. The route is taken once: it removes itself before
    # training_step runs, so a training_step that calls self(x) reaches the module's own forward.
    def routed(*a: Any) -> Any:
        module.__dict__.pop("forward", None)
        return module.training_step(*a)

    module.forward = routed
    try:
        return model(*args)
    finally:
        module.__dict__.pop("forward", None)


def _loss_of(out: Any, name: str) -> torch.Tensor:
    if out is None:
        raise StepError(
            f"{name}.training_step returned None for a batch (Lightning skips such a step); tropt needs a loss from "
            "every batch to compare updates",
            "return the loss (a tensor, or a dict with a 'loss' key) from training_step for the batches tropt checks, "
            "or build tropt.Setup yourself with a step that skips explicitly")
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        if "loss" not in out:
            raise StepError(f"{name}.training_step returned a dict without a 'loss' key (keys: {sorted(out)[:8]})",
                            "return {'loss': loss, ...} as Lightning's automatic optimization requires")
        return out["loss"]
    raise StepError(f"{name}.training_step returned a {type(out).__name__}; Lightning's automatic optimization needs "
                    "a tensor, a dict with a 'loss' key, or None", "return the loss tensor")


# ------------------------------------------------------------------ the step
class _StepOptimizer:
    """What the module's ``optimizer_step`` hook receives: ``step(closure)`` runs the closure (the last micro-batch's
    training_step + backward), then unscale -> on_before_optimizer_step -> clip -> step (-> scaler.update)."""

    def __init__(self, ctx: Any, module: Any, spec: Spec) -> None:
        self._ctx, self._module, self._spec = ctx, module, spec
        self.optimizer = ctx.optimizer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        ctx, module, opt = self._ctx, self._module, self._ctx.optimizer
        out = closure() if closure is not None else None
        if ctx.scaler is not None:
            ctx.scaler.unscale_(opt)
        module.on_before_optimizer_step(opt)
        trainer = module.trainer  # the stand-in: Lightning passes the Trainer's own settings to the hook
        module.configure_gradient_clipping(opt, gradient_clip_val=trainer.gradient_clip_val,
                                           gradient_clip_algorithm=trainer.gradient_clip_algorithm)
        if ctx.scaler is not None:
            ctx.scaler.step(opt, **kwargs)
            ctx.scaler.update()
        else:
            opt.step(**kwargs)
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._ctx.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)


def _make_step(spec: Spec, pass_idx: bool) -> Callable:
    def lightning_step(ctx: Any, micro_batches: list) -> torch.Tensor:
        module: Any  # the LightningModule: nn.Module's __getattr__ stub does not know its hooks
        model, module, opt = ctx.model, _unwrap(ctx.model), ctx.optimizer
        name = type(module).__name__
        k = len(micro_batches)
        if not hasattr(ctx, "lightning_global_step"):  # kept on ctx: tropt copies and checkpoints it with the state
            ctx.lightning_global_step, ctx.lightning_epoch, ctx.lightning_epoch_step = 0, 0, 0
        configs = spec.configs.get(opt, [])
        world = torch.distributed.get_world_size() if model is not module and torch.distributed.is_initialized() else 1
        clip_val = ctx.grad_clip if spec.clip_algorithm == "norm" else spec.clip_val
        stand_in = TrainerStandIn(spec, global_step=ctx.lightning_global_step, epoch=ctx.lightning_epoch, optimizer=opt,
                                   configs=configs, clip_val=clip_val, world_size=world)
        first_idx = ctx.lightning_epoch_step * spec.accumulate
        total = torch.zeros((), device=ctx.device)
        with attached(module, stand_in):
            if not module.training:  # Trainer.fit trains in train mode (and restores it after validation)
                module.train()
            for i, mb in enumerate(micro_batches):
                batch_idx = first_idx + i

                def closure(mb: Any = mb, i: int = i, batch_idx: int = batch_idx) -> torch.Tensor:
                    with ctx.autocast():
                        out = _call_training_step(model, module, mb, batch_idx, pass_idx)
                    loss = _loss_of(out, name) / k  # Lightning: loss / accumulate_grad_batches (here the K given)
                    if i == 0:  # Lightning zeroes on the first batch of a cycle, after the forward pass
                        module.on_before_zero_grad(opt)
                        module.optimizer_zero_grad(ctx.lightning_epoch, batch_idx, opt)
                    scaled = ctx.scaler.scale(loss) if ctx.scaler is not None else loss
                    module.on_before_backward(scaled)
                    module.backward(scaled)
                    module.on_after_backward()
                    return loss.detach()

                if i < k - 1:
                    quiet = model.no_sync() if model is not module else contextlib.nullcontext()
                    with quiet:  # Lightning blocks the all-reduce of accumulating batches
                        total += closure()
                else:
                    holder: list = []

                    def run_closure() -> torch.Tensor:
                        holder.append(closure())  # noqa: B023 - optimizer_step calls it now, within this iteration
                        return holder[-1]  # noqa: B023

                    module.optimizer_step(ctx.lightning_epoch, batch_idx, _StepOptimizer(ctx, module, spec),
                                          run_closure)
                    if not holder:
                        raise StepError(f"{name}.optimizer_step did not run the optimizer closure",
                                        "call optimizer.step(closure=optimizer_closure) in your optimizer_step "
                                        "override")
                    total += holder[-1]
            _advance_schedule(ctx, module, spec, configs)
        return total

    lightning_step.__qualname__ = "lightning_automatic_optimization"
    return lightning_step


def _held(ctx: Any, cfg: Any) -> Any:
    """The scheduler to step for ``cfg``: its own, unless a check put something else on ``ctx.scheduler`` (the LR
    sweep's stand-in that must not move the swept rate, or None when the check's Setup has no scheduler). The
    configured schedulers are built by the optimizer factory, so a check can only reach them through ctx."""
    held = ctx.scheduler
    inner = held.schedulers if isinstance(held, Schedulers) else [held]
    if any(s is cfg.scheduler for s in inner):
        return cfg.scheduler
    return held  # a stand-in (stepped as the user's hook steps a scheduler) or None (nothing to step)


def _advance_schedule(ctx: Any, module: Any, spec: Spec, configs: list) -> None:
    """After one optimizer step: step the schedulers whose interval and frequency say so (Lightning's rules)."""
    ctx.lightning_global_step += 1
    ctx.lightning_epoch_step += 1
    batches_in_epoch = ctx.lightning_epoch_step * spec.accumulate  # Lightning's batch_idx + 1 at this optimizer step
    for cfg in configs:
        if cfg.interval == "step" and batches_in_epoch % cfg.frequency == 0 and (sched := _held(ctx, cfg)) is not None:
            module.lr_scheduler_step(sched, None)
    if spec.steps_per_epoch is not None and ctx.lightning_epoch_step >= spec.steps_per_epoch:
        ctx.lightning_epoch += 1
        ctx.lightning_epoch_step = 0
        for cfg in configs:
            if (cfg.interval == "epoch" and ctx.lightning_epoch % cfg.frequency == 0
                    and (sched := _held(ctx, cfg)) is not None):
                module.lr_scheduler_step(sched, None)


# ------------------------------------------------------------------ data
def _data(module: Any, datamodule: Any, train: Any, val: Any, pkg: str) -> tuple[Any, Any]:
    """Train and validation loaders: explicit loaders, else the datamodule's (prepare_data + setup('fit') on a deep
    copy, as Trainer.fit does, so the user's datamodule keeps its state), else the module's own hooks."""
    import importlib

    core = importlib.import_module(pkg)
    source, name = None, None
    if train is None and datamodule is not None:
        source = copy.deepcopy(datamodule)  # setup() assigns attributes and may append to shared containers
        name = type(datamodule).__name__
        try:
            source.prepare_data()
            source.setup("fit")
        except Exception as exc:
            raise StepError(f"{name}.prepare_data/setup('fit') raised {type(exc).__name__}: {exc}",
                            "make the datamodule's setup('fit') work outside a Trainer, "
                            "or pass train_dataloaders=...") from exc
    elif train is None and _overrides(module, core.LightningModule, "train_dataloader"):
        source, name = module, type(module).__name__
    if train is None and source is not None:
        base = core.LightningDataModule if source is not module else core.LightningModule
        if _overrides(source, base, "train_dataloader"):
            train = source.train_dataloader()
        if val is None and _overrides(source, base, "val_dataloader"):
            try:
                val = source.val_dataloader()
            except Exception:  # noqa: BLE001 - validation data is optional for the checks
                val = None
    if train is None:
        raise SetupError(
            "setup_from_lightning: no training data: no train_dataloaders, no datamodule with train_dataloader(), and "
            "the module defines no train_dataloader()",
            "pass datamodule=YourDataModule(...) or train_dataloaders=DataLoader(...)")
    if isinstance(val, (list, tuple)):
        val = val[0] if len(val) == 1 and isinstance(val[0], torch.utils.data.DataLoader) else val
    if (isinstance(train, (list, tuple, dict)) and not isinstance(train, torch.utils.data.Dataset)
            and not (isinstance(train, (list, tuple)) and train
                     and not isinstance(train[0], torch.utils.data.DataLoader))):
        raise SetupError("setup_from_lightning: several train dataloaders (a list or dict of DataLoaders) are not "
                         "supported",
                         "pass the one DataLoader whose batches training_step receives")
    return train, val


def _steps_per_epoch(train: Any, accumulate: int) -> int | None:
    try:
        n = len(train)
    except TypeError:
        return None
    return max(1, math.ceil(n / accumulate))


# ------------------------------------------------------------------ trainer_kwargs
def _read_kwargs(kwargs: dict[str, Any]) -> tuple[int, float | None, str, str, bool, int | None, int, str]:
    acc = kwargs.get("accumulate_grad_batches", 1)
    if isinstance(acc, bool) or not isinstance(acc, int) or acc < 1:
        raise SetupError(f"setup_from_lightning: accumulate_grad_batches={acc!r}; it must be an integer >= 1",
                         "e.g. trainer_kwargs={'accumulate_grad_batches': 4}")
    clip = kwargs.get("gradient_clip_val")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        raise SetupError(f"setup_from_lightning: gradient_clip_val={clip!r}; it must be a number >= 0 or None",
                         "e.g. trainer_kwargs={'gradient_clip_val': 1.0}")
    clip = float(clip) if clip else None  # Lightning: 0 (or None) means no clipping
    algo = str(kwargs.get("gradient_clip_algorithm") or "norm").lower()
    if algo not in ("norm", "value"):
        raise SetupError(f"setup_from_lightning: gradient_clip_algorithm={algo!r}; Lightning accepts 'norm' or 'value'",
                         "use gradient_clip_algorithm='norm' (or 'value')")
    raw = kwargs.get("precision")
    key = "32" if raw is None else str(raw)
    if key not in _PRECISION:
        raise SetupError(
            f"setup_from_lightning: precision={raw!r} is not supported; tropt reproduces '32-true', 'bf16-mixed' "
            "and '16-mixed'",
            "check with one of those precisions ('true' half precision casts the weights, which tropt's copies do "
            "not do)")
    precision, scaler = _PRECISION[key]
    accelerator = str(kwargs.get("accelerator") or "cpu").lower()
    if accelerator not in ("cpu", "auto", "gpu", "cuda"):
        raise SetupError(f"setup_from_lightning: accelerator={accelerator!r} is not supported; tropt runs the step "
                         "on 'cpu' or 'cuda'", "pass trainer_kwargs={'accelerator': 'cpu'} (or 'gpu')")
    device = "cuda" if accelerator in ("gpu", "cuda") else "cpu"  # "auto" stays on CPU, where every check can run
    max_epochs = kwargs.get("max_epochs")
    max_steps = kwargs.get("max_steps", -1)
    if max_epochs is None and max_steps == -1:
        max_epochs = 1000  # Lightning's default when neither is given
    return acc, clip, algo, precision, scaler, max_epochs, max_steps, device


# ------------------------------------------------------------------ the builder
def _check_module(module: Any, pkg: str, dist: str) -> bool:
    """Raise when the module has no training step or optimizer tropt can run; whether training_step takes batch_idx."""
    base = _base(pkg)
    name = type(module).__name__
    if not _overrides(module, base, "training_step"):
        raise SetupError(f"setup_from_lightning: {name} does not define training_step, so there is no loss to check",
                         "define training_step(self, batch, batch_idx) returning the loss")
    if not _overrides(module, base, "configure_optimizers"):
        raise SetupError(f"setup_from_lightning: {name} does not define configure_optimizers, so there is no "
                         "optimizer to check",
                         "define configure_optimizers(self) returning an optimizer (and optionally an lr_scheduler)")
    if not module.automatic_optimization:
        raise SetupError(
            f"setup_from_lightning: {name} uses manual optimization (automatic_optimization=False): its training_step "
            "drives the optimizers itself through the Trainer (self.optimizers(), self.manual_backward), which tropt "
            "cannot stand in for",
            "write the body of your training_step as a tropt step(ctx, micro_batches) using ctx.optimizer and "
            "loss.backward(), and pass it as tropt.Setup(module, loss_fn, optimizer, data, step=step)")
    (signature_check,) = import_from(dist, LOW, HIGH, f"{pkg}.utilities.signature_utils", "is_param_in_hook_signature")
    if signature_check(module.training_step, "dataloader_iter", explicit=True):
        raise SetupError(f"setup_from_lightning: {name}.training_step takes a dataloader_iter; "
                         "tropt hands the step batches",
                         "use training_step(self, batch, batch_idx)")
    return signature_check(module.training_step, "batch_idx", min_args=2)


def setup_from_lightning(module: Any, datamodule: Any = None, *, train_dataloaders: Any = None,
                         val_dataloaders: Any = None, trainer_kwargs: dict[str, Any] | None = None,
                         seed: int = 0) -> Setup:
    """A :class:`tropt.Setup` that checks the module's own training step as ``Trainer.fit`` runs it.

    Parameters
    ----------
    module
        The ``LightningModule`` (never modified: tropt works on copies).
    datamodule
        A ``LightningDataModule``; ``prepare_data()`` and ``setup("fit")`` run on a deep copy, then
        ``train_dataloader()`` / ``val_dataloader()``.
    train_dataloaders, val_dataloaders
        Loaders as given to ``Trainer.fit`` (instead of a datamodule). Without either, the module's own
        ``train_dataloader()`` is used.
    trainer_kwargs
        The ``Trainer`` arguments that shape the update: ``accumulate_grad_batches``, ``gradient_clip_val``,
        ``gradient_clip_algorithm`` ("norm" or "value"), ``precision`` ("32-true", "bf16-mixed", "16-mixed"), and
        ``max_epochs``/``max_steps`` (for ``trainer.estimated_stepping_batches``), ``accelerator`` ("gpu"/"cuda" puts
        the Setup on CUDA; "auto" or none keeps it on CPU, where every check runs). Other keys are ignored.
    seed
        The Setup's seed.

    Returns
    -------
    tropt.Setup
        ``model`` is the module, ``loss_fn`` its ``training_step`` loss, ``optimizer``/``scheduler`` from
        ``configure_optimizers``, ``step`` Lightning's automatic optimization (see the module docstring).

    Raises
    ------
    tropt.errors.SetupError
        Not a LightningModule, no ``training_step``/``configure_optimizers``, several optimizers, manual optimization,
        an unsupported precision, no training data, or a Lightning version outside >=2.2,<3.
    """
    pkg, dist = _framework(module)
    supported(dist, LOW, HIGH, "lightning")
    name = type(module).__name__
    pass_idx = _check_module(module, pkg, dist)
    kwargs = dict(trainer_kwargs or {})
    acc, clip, algo, precision, use_scaler, max_epochs, max_steps, device = _read_kwargs(kwargs)
    train, val = _data(module, datamodule, train_dataloaders, val_dataloaders, pkg)
    given_algo = None
    if kwargs.get("gradient_clip_algorithm") is not None:
        (kind,) = import_from(dist, LOW, HIGH, f"{pkg}.utilities", "GradClipAlgorithmType")
        given_algo = kind(algo)
    spec = Spec(pkg, dist, acc, clip, algo, _steps_per_epoch(train, acc), max_epochs, max_steps,
                 clip_given=(kwargs.get("gradient_clip_val"), given_algo))

    # Validate configure_optimizers once now (on a copy), so a bad shape fails here and not inside a check.
    _, configs = parse_optimizers(copy.deepcopy(module), spec)
    plateau = [c for c in configs if c.reduce_on_plateau]
    if plateau:
        warnings.warn(f"setup_from_lightning: {name}'s ReduceLROnPlateau scheduler steps on a monitored metric "
                      f"({plateau[0].monitor!r}) that only a Trainer's validation loop produces; the checks run "
                      "without it",
                      stacklevel=2)
    has_scheduler = len(plateau) < len(configs)

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        opt, cfgs = parse_optimizers(_unwrap(model), spec)
        spec.configs[opt] = [c for c in cfgs if not c.reduce_on_plateau]
        return opt

    def scheduler(opt: torch.optim.Optimizer) -> Any:
        scheds = [c.scheduler for c in spec.configs.get(opt, [])]
        return scheds[0] if len(scheds) == 1 else Schedulers(scheds)

    optimizer.__qualname__ = f"{name}.configure_optimizers"
    scheduler.__qualname__ = f"{name}.configure_optimizers (lr_scheduler)"

    # loss_fn measures a batch's loss: a scheduler training_step steps by hand (self.lr_schedulers().step()) must not
    # advance there, so it reads inert ones.
    inert = [InertConfig() for c in configs if not c.reduce_on_plateau]

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        inner = _unwrap(model)
        with attached(inner, TrainerStandIn(spec, configs=inert)):
            return _loss_of(_call_training_step(model, inner, batch, 0, pass_idx), type(inner).__name__)

    loss_fn.__qualname__ = f"{name}.training_step"
    return Setup(module, loss_fn, optimizer, train, val_data=val, scheduler=scheduler if has_scheduler else None,
                 step=_make_step(spec, pass_idx), accumulation_steps=acc,
                 accumulation="batches",  # accumulate_grad_batches: K loader batches per optimizer step
                 steps_per_epoch=spec.steps_per_epoch, grad_clip=clip if algo == "norm" else None,
                 precision=precision, use_scaler=use_scaler, device=device, seed=seed)
