"""``setup_from_trainer``: a :class:`tropt.Setup` whose step is a Hugging Face ``Trainer``'s own optimizer step.

The step does for the K micro-batches it is given what ``Trainer._inner_training_loop`` does for one accumulation
cycle (transformers 4.46 - 5.x): it counts the cycle's label tokens with the trainer's own ``get_batch_samples``
(``num_items_in_batch``: shifted labels for causal LMs, gathered over processes when
``average_tokens_across_devices``), then for each micro-batch calls the trainer's own ``training_step(model, inputs,
num_items_in_batch)`` (so its ``compute_loss`` and any override of either run, with the rule that divides a loss not
normalised by ``num_items_in_batch`` by the cycle's number of micro-batches), all but the last under ``no_sync``;
then, as the Trainer does, clips to ``max_grad_norm`` (after unscaling under fp16), steps the optimizer, steps the
scheduler unless the scaler skipped the step, and zeroes the model's gradients.

The trainer is never modified: every call works on a shallow copy of it whose ``model``, ``optimizer``,
``lr_scheduler`` are tropt's copies and whose ``accelerator`` is a shallow copy that prepares nothing and scales with
tropt's ``GradScaler``. ``current_gradient_accumulation_steps`` is the K of the call, so the checks that run K = 1 and
K = 4 test the Trainer's accumulation arithmetic itself. The Trainer builds its ``Accelerator`` with
``gradient_accumulation_steps=1`` and divides by itself; that is restored around each ``training_step`` (tropt tells
accelerate each run's K for loops that use ``accelerator.accumulate``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from typing import Any, cast

import torch
from torch import nn

from ..errors import SetupError, StepError
from ..setup import Setup, optimizer_factory_from
from ._frameworks import api_changed, supported
from .accelerate import accelerate_num_steps

__all__ = ["setup_from_trainer"]

LOW, HIGH = "4.46", "6"


def _accelerator_view(accelerator: Any, scaler: Any) -> Any:
    """A shallow copy of the trainer's Accelerator that prepares nothing (so it registers nothing) and scales losses
    with ``scaler`` (tropt's GradScaler, or None)."""
    view = copy.copy(accelerator)
    view.scaler = scaler
    view.prepare = lambda *objs, **kwargs: objs[0] if len(objs) == 1 else objs
    return view


def _view(trainer: Any, *, model: nn.Module | None = None, optimizer: Any = None, scheduler: Any = None,
          scaler: Any = None, autocast: Any = None) -> Any:
    """A shallow copy of the trainer with tropt's training objects in place of its own."""
    view = copy.copy(trainer)
    view.accelerator = _accelerator_view(trainer.accelerator, scaler)
    view.__dict__.pop("_eval_dataloaders", None)
    if model is not None:
        view.model = view.model_wrapped = model
    view.optimizer, view.lr_scheduler = optimizer, scheduler
    if autocast is not None:  # the Trainer's hook for autocast (accelerate's prepared model does it otherwise)
        view.autocast_smart_context_manager = lambda cache_enabled=True: autocast()
    return view


def _num_items(view: Any, micro_batches: list, device: torch.device) -> Any:
    """The Trainer's ``num_items_in_batch`` for one accumulation cycle, by its own ``get_batch_samples``."""
    try:
        _, n = view.get_batch_samples(iter(micro_batches), len(micro_batches), device)
    except TypeError:  # transformers < 4.50: get_batch_samples(epoch_iterator, num_batches)
        _, n = view.get_batch_samples(iter(micro_batches), len(micro_batches))
    return n


def _update_steps(args: Any, batches_per_epoch: int | None) -> int:
    """The Trainer's ``max_steps`` for its scheduler (``set_initial_training_values``)."""
    if args.max_steps and args.max_steps > 0:
        return int(args.max_steps)
    if batches_per_epoch is None:
        raise SetupError("setup_from_trainer: the train dataloader has no length and TrainingArguments.max_steps is "
                         "not set, so the scheduler's number of training steps is unknown",
                         "set max_steps in TrainingArguments")
    return math.ceil(args.num_train_epochs * _steps_per_epoch(args, batches_per_epoch))


def _steps_per_epoch(args: Any, batches_per_epoch: int) -> int:
    """The Trainer's ``num_update_steps_per_epoch``: ``gradient_accumulation_steps`` loader batches per update,
    the last, shorter cycle of an epoch counted too."""
    ga = args.gradient_accumulation_steps
    return max(batches_per_epoch // ga + int(batches_per_epoch % ga > 0), 1)


def _padding_join(trainer: Any) -> Any:
    """A ``join_fn`` for the Trainer's batches: a collator that pads to the longest sequence of each batch gives
    batches of different lengths, so they are padded to the longest of the step's batches first, as the collator
    would have (``labels`` with -100, masks with 0, token ids with the tokenizer's pad id, on its padding side)."""
    from ..core.batch import join_batches, rebuild

    tok = getattr(getattr(trainer, "data_collator", None), "tokenizer", None) or getattr(trainer, "processing_class",
                                                                                         None)
    pad_id = getattr(tok, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(getattr(trainer.model, "config", None), "pad_token_id", None)
    left = getattr(tok, "padding_side", "right") == "left"

    def value(key: Any) -> int:
        name = str(key)
        return -100 if "labels" in name else 0 if "mask" in name or "type_ids" in name else int(pad_id or 0)

    def pad(batch: Any, widest: dict) -> Any:
        out = dict(batch)
        for key, shape in widest.items():
            t = out[key]
            widths = [(w - n, 0) if left else (0, w - n) for n, w in zip(t.shape[1:], shape, strict=True)]
            if any(a or b for a, b in widths):  # torch's pad lists the last dimension first
                out[key] = torch.nn.functional.pad(t, [x for ab in reversed(widths) for x in ab], value=value(key))
        return rebuild(batch, out)

    def join_padded(batches: list) -> Any:
        if not all(hasattr(b, "keys") for b in batches):
            return join_batches(batches)
        widest = {k: tuple(max(int(b[k].shape[d]) for b in batches) for d in range(1, batches[0][k].ndim))
                  for k in batches[0]
                  if all(isinstance(b.get(k), torch.Tensor) and b[k].ndim == batches[0][k].ndim > 1 for b in batches)}
        return join_batches([pad(b, widest) for b in batches])

    join_padded.__qualname__ = "pad to the longest, as the Trainer's collator"
    return join_padded


def _make_step(trainer: Any) -> Any:
    def hf_trainer_step(ctx: Any, micro_batches: list) -> torch.Tensor:
        model, k = ctx.model, len(micro_batches)
        view = _view(trainer, model=model, optimizer=ctx.optimizer, scheduler=ctx.scheduler, scaler=ctx.scaler,
                     autocast=ctx.autocast)
        view.current_gradient_accumulation_steps = k  # the number of batches in this cycle, as the Trainer sets it
        total = torch.zeros((), device=ctx.device)
        with accelerate_num_steps(1):  # the Trainer's Accelerator(gradient_accumulation_steps=1): it divides itself
            num_items = _num_items(view, micro_batches, ctx.device)
            for i, inputs in enumerate(micro_batches):
                quiet = model.no_sync() if i < k - 1 and hasattr(model, "no_sync") else contextlib.nullcontext()
                with quiet:
                    loss = view.training_step(model, inputs, num_items)
                total += loss.detach().float().reshape(())
        opt, scaler = ctx.optimizer, ctx.scaler
        if ctx.grad_clip is not None:
            if scaler is not None:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), ctx.grad_clip)
        skipped = False
        if scaler is not None:
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped = scaler.get_scale() < before  # accelerate's optimizer_step_was_skipped
        else:
            opt.step()
        if (ctx.scheduler is not None and not skipped
                and not isinstance(ctx.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)):
            ctx.scheduler.step()
        model.zero_grad()
        return total

    hf_trainer_step.__qualname__ = f"{type(trainer).__name__}.training_step"
    return hf_trainer_step


def _track_steps(opt: torch.optim.Optimizer) -> None:
    """Mark ``opt.step`` as an LR scheduler's constructor does (it saw the user's optimizer, not this copy), so torch
    does not warn that the step was overridden."""
    import functools

    if hasattr(opt.step, "_wrapped_by_lr_sched"):
        return
    func, opt_ref = type(opt).step, weakref.ref(opt)  # as torch does: no reference cycle through the optimizer

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        target: Any = opt_ref()  # the optimizer (alive: this is its step); torch's types lack _opt_called
        target._opt_called = True
        return func.__get__(target, type(target))(*args, **kwargs)

    # torch's private step-tracking marks, undeclared in its types (LRScheduler.__init__ ignores them alike)
    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    opt.step = wrapper  # type: ignore[method-assign]


def setup_from_trainer(trainer: Any, *, seed: int | None = None) -> Setup:
    """A :class:`tropt.Setup` that checks a ``transformers.Trainer``'s own training step.

    Parameters
    ----------
    trainer
        A ``transformers.Trainer`` (or subclass) with a ``train_dataset``; never modified.
    seed
        The Setup's seed (default: ``trainer.args.seed``).

    Returns
    -------
    tropt.Setup
        ``model`` is ``trainer.model``; ``loss_fn`` the trainer's ``compute_loss`` over a batch; ``optimizer`` and
        ``scheduler`` what ``create_optimizer``/``create_scheduler`` build from ``trainer.args`` (or the pair given as
        ``Trainer(optimizers=...)``); ``train_data`` the trainer's train dataloader with its collator;
        ``accumulation_steps`` ``gradient_accumulation_steps``; ``grad_clip`` ``max_grad_norm``; precision from
        ``fp16``/``bf16``; ``step`` the Trainer's optimizer step (see the module docstring).

    Raises
    ------
    tropt.errors.SetupError
        Not a Trainer, no ``train_dataset``, or a transformers version outside >=4.46,<6.
    """
    supported("transformers", LOW, HIGH, "hf")
    try:
        from transformers import Trainer
    except ImportError as exc:
        raise api_changed("transformers", LOW, HIGH, "transformers.Trainer", exc) from exc
    if not isinstance(trainer, Trainer):
        raise SetupError(f"setup_from_trainer: got a {type(trainer).__name__}, not a transformers.Trainer",
                         "pass the Trainer you would call .train() on")
    if getattr(trainer, "train_dataset", None) is None:
        raise SetupError("setup_from_trainer: the Trainer has no train_dataset, so there are no batches to check the "
                         "step on",
                         "build it with Trainer(..., train_dataset=your_dataset)")
    args = trainer.args
    for name in ("get_batch_samples", "training_step", "compute_loss", "create_optimizer", "create_scheduler",
                 "get_train_dataloader"):
        if not callable(getattr(trainer, name, None)):
            raise api_changed("transformers", LOW, HIGH, f"Trainer.{name}", AttributeError(name))
    base = _view(trainer)
    try:
        train = base.get_train_dataloader()
        val = base.get_eval_dataloader() if getattr(trainer, "eval_dataset", None) is not None else None
    except Exception as exc:
        raise StepError(f"setup_from_trainer: building the Trainer's dataloader raised {type(exc).__name__}: {exc}",
                        "check train_dataset and data_collator: trainer.get_train_dataloader() must work") from exc
    try:
        batches_per_epoch = len(train)
    except TypeError:
        batches_per_epoch = None
    total_steps = _update_steps(args, batches_per_epoch)

    given_opt, given_sched = trainer.optimizer, trainer.lr_scheduler
    # cast: transformers infers Trainer.model as Optional, but Trainer.__init__ always sets a model
    from_instance = optimizer_factory_from(given_opt, cast(nn.Module, trainer.model)) if given_opt is not None else None

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        opt = from_instance(model) if from_instance is not None else _view(trainer, model=model).create_optimizer()
        return getattr(opt, "optimizer", opt)  # an accelerate AcceleratedOptimizer: the torch optimizer inside

    # The schedule is built only when tropt asks for it (Setup.build calls this after the optimizer factory): a check
    # that runs without the scheduler (dynamics.lr_range) gets the optimizer at its base LR, not at the LR a warmup
    # from 0 sets when it is constructed.
    def scheduler(opt: torch.optim.Optimizer) -> Any:
        if given_sched is not None and given_opt is not None:
            sched = copy.deepcopy(given_sched, memo={id(given_opt): opt})  # the same schedule, on tropt's optimizer
            _track_steps(opt)
            return sched
        view = _view(trainer)
        view.optimizer = opt
        return view.create_scheduler(num_training_steps=total_steps, optimizer=opt)

    optimizer.__qualname__ = f"{type(trainer).__name__}.create_optimizer"
    scheduler.__qualname__ = f"{type(trainer).__name__}.create_scheduler"

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        loss = _view(trainer, model=model).compute_loss(model, batch)
        return loss[0] if isinstance(loss, tuple) else loss

    loss_fn.__qualname__ = f"{type(trainer).__name__}.compute_loss"
    if args.fp16:
        precision, use_scaler = "fp16", True
    elif args.bf16:
        precision, use_scaler = "bf16", False
    else:
        precision, use_scaler = "fp32", False
    clip = float(args.max_grad_norm) if args.max_grad_norm and args.max_grad_norm > 0 else None
    return Setup(cast(nn.Module, trainer.model), loss_fn, optimizer, train, val_data=val, scheduler=scheduler,
                 step=_make_step(trainer), accumulation_steps=int(args.gradient_accumulation_steps),
                 accumulation="batches",  # the Trainer's gradient_accumulation_steps: K loader batches per update
                 join_fn=_padding_join(trainer),
                 steps_per_epoch=_steps_per_epoch(args, batches_per_epoch) if batches_per_epoch else None,
                 grad_clip=clip,
                 precision=precision, use_scaler=use_scaler, device=str(args.device),
                 seed=int(args.seed if seed is None else seed))
