"""What a training step receives (:class:`StepContext`) and the reference step (:func:`standard_step`).

A user's own loop is checked by passing their step function as ``Setup(step=...)``; it must have the signature
``step(ctx, micro_batches)`` where ``micro_batches`` is the list of micro-batches that make up one optimizer step,
and may return the step's loss (a tensor or float) or None.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .core.accelerate import accelerate_told  # noqa: F401 - moved there; kept importable from here
from .core.batch import BatchLayout

PRECISION_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepContext:
    """Everything one optimizer step needs: the (copied) model, its optimizer, scheduler and scaler, the loss.

    Attributes
    ----------
    model, optimizer, scheduler, scaler
        Live training objects (tropt's copies when a check builds them). ``scaler`` is a
        ``torch.amp.GradScaler`` or None; ``scheduler`` may be None; ``optimizer`` is None for loops that update
        the parameters by hand (``Setup(optimizer=None)``). With several optimizers (``Setup(optimizer=(make_d,
        make_g))``, a GAN's discriminator and generator) ``optimizer`` and ``scheduler`` are the first ones.
    more_optimizers, more_schedulers, optimizer_names
        The second and later optimizers and their schedulers (None where an optimizer has none), and every
        optimizer's name (a dict key of ``Setup(optimizer={...})``, else ``optimizers[i]``). Read them through
        :attr:`optimizers` and :attr:`schedulers`.
    loss_fn
        ``loss_fn(model, batch) -> scalar tensor``.
    grad_clip
        Max global gradient norm, or None.
    accumulation_steps
        Micro-batches per optimizer step the loop is configured for.
    device
        The torch device batches are on.
    precision
        "fp32", "bf16" or "fp16"; :meth:`autocast` gives its context manager.
    layout
        Where a batch keeps its samples (:class:`tropt.batching.BatchLayout`); :meth:`batch_size` and
        :meth:`split` follow it.

    State the step carries from one call to the next (an iteration counter ``ctx.it``, a recurrent hidden state
    ``ctx.hidden``) belongs on the context as an attribute of the step's own choosing: tropt's checks copy, restore
    and checkpoint these attributes with the rest of the training state (:meth:`user_state`). An optimizer the step
    builds itself and keeps there (``ctx.opt_g``) is observed by every check like those of the Setup
    (:meth:`all_optimizers`).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    scaler: Any
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    grad_clip: float | None
    accumulation_steps: int
    device: torch.device
    precision: str = "fp32"
    layout: BatchLayout = field(default_factory=BatchLayout)
    more_optimizers: tuple[torch.optim.Optimizer, ...] = ()
    more_schedulers: tuple[Any, ...] = ()
    optimizer_names: tuple[str, ...] = ()

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """Every optimizer of the Setup, in its order (``ctx.optimizer`` first); empty without one."""
        return ((self.optimizer,) if self.optimizer is not None else ()) + tuple(self.more_optimizers)

    @property
    def schedulers(self) -> tuple[Any, ...]:
        """One entry per optimizer of :attr:`optimizers`: its scheduler, or None."""
        return ((self.scheduler,) if self.optimizer is not None else ()) + tuple(self.more_schedulers)

    def optimizer_name(self, i: int) -> str:
        """The name of ``optimizers[i]`` ("optimizer" for a Setup's only optimizer)."""
        if i < len(self.optimizer_names):
            return self.optimizer_names[i]
        return "optimizer" if len(self.optimizers) == 1 else f"optimizers[{i}]"

    def all_optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        """(name, optimizer) for every optimizer of :attr:`optimizers` and every one the step keeps among its own
        attributes (``ctx.opt_g``, or inside a list/tuple/dict attribute: ``ctx.opts[1]``), each once."""
        out = [(self.optimizer_name(i), o) for i, o in enumerate(self.optimizers)]
        seen = {id(o) for _, o in out}
        own = {f.name for f in dataclasses.fields(self)}
        for name, value in vars(self).items():
            if name in own or name.startswith("_tropt"):
                continue
            items = (value.items() if isinstance(value, dict) else enumerate(value)
                     if isinstance(value, (list, tuple)) else [(None, value)])
            for key, v in items:
                if isinstance(v, torch.optim.Optimizer) and id(v) not in seen:
                    seen.add(id(v))
                    out.append((f"ctx.{name}" if key is None else f"ctx.{name}[{key!r}]", v))
        return out

    def batch_size(self, batch: Any) -> int:
        """The number of samples in ``batch`` (along the Setup's batch dimension, or by its ``size_fn``)."""
        return self.layout.size(batch)

    def split(self, batch: Any, k: int | None = None, *, sizes: list[int] | None = None) -> list:
        """Split ``batch`` into ``k`` (or ``sizes``) micro-batches the way the Setup's layout says."""
        return self.layout.split(batch, k, sizes=sizes)

    def user_state(self) -> dict[str, Any]:
        """A copy of the attributes the step set on this context (its own state across calls), by name.

        Plain data (numbers, strings, tensors, arrays and containers of them: counters, hidden states) is copied,
        tensors as detached clones. An object with ``state_dict``/``load_state_dict`` (a scaler wrapper, an EMA
        model) keeps its identity: its state dict is copied and loaded back in place. Any other object (an
        ``accelerate.Accelerator``, a logger) is kept by reference: copying it could cut its links to the live
        training objects or to process-global state.
        """
        out: dict[str, Any] = {}
        for name, value in self._user_attrs().items():
            if user_state_is_plain(value):
                out[name] = _copy_plain(value)
            elif _stateful(value):
                out[name] = _Stateful(value, copy.deepcopy(value.state_dict()))
            else:
                out[name] = value
        return out

    def load_user_state(self, state: dict[str, Any]) -> None:
        """Put the step's own attributes back as :meth:`user_state` saw them (attributes set since are removed)."""
        for name in list(self._user_attrs()):
            if name not in state:
                delattr(self, name)
        for name, value in state.items():
            if isinstance(value, _Stateful):
                value.obj.load_state_dict(copy.deepcopy(value.state))
                setattr(self, name, value.obj)
            else:
                setattr(self, name, _copy_plain(value) if user_state_is_plain(value) else value)

    def _user_attrs(self) -> dict[str, Any]:
        own = {f.name for f in dataclasses.fields(self)}
        return {k: v for k, v in vars(self).items() if k not in own and not k.startswith("_tropt")}

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision's autocast context manager (a no-op for fp32)."""
        dtype = PRECISION_DTYPES[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)


@dataclass
class _Stateful:
    """A step attribute restored in place through its ``load_state_dict``."""

    obj: Any
    state: Any


def _stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _copy_plain(value: Any) -> Any:
    """A copy of plain step state: tensors detached and cloned, containers rebuilt, the rest deep-copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


def user_state_is_plain(value: Any) -> bool:
    """Whether a step attribute is plain data (numbers, strings, tensors, arrays and containers of them)
    that a checkpoint can hold."""
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor, np.ndarray, np.generic)):
        return True
    if isinstance(value, (list, tuple)):
        return all(user_state_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and user_state_is_plain(v) for k, v in value.items())
    return False


def needs_metric(scheduler: Any) -> bool:
    """Whether ``scheduler.step`` needs an argument (a metric, like ReduceLROnPlateau): no argument-free step."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return True
    import inspect

    try:
        params = inspect.signature(scheduler.step).parameters.values()
    except (TypeError, ValueError, AttributeError):  # no step, or a builtin without a signature: assume argument-free
        return False
    return any(p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in params)


def standard_step(ctx: StepContext, micro_batches: list) -> torch.Tensor:
    """The reference optimizer step: what a correct loop does with K micro-batches.

    Each micro-batch's (mean-reduced) loss is weighted by its share of the step's samples, so K uneven
    micro-batches give exactly the gradient of the whole batch; then unscale -> clip -> step -> update ->
    zero_grad, and the scheduler once per optimizer step (except one that steps on a metric, such as ReduceLROnPlateau:
    the user's epoch loop steps it after validation). Returns the step's loss (detached, sample-weighted).
    """
    if ctx.optimizer is None:
        from .errors import SetupError

        raise SetupError(
            "Setup: optimizer=None but no step function: tropt.standard_step needs an optimizer to step",
            "pass optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=...), or your own "
            "step=step(ctx, micro_batches) that updates the parameters by hand")
    if ctx.more_optimizers:
        from .errors import SetupError

        names = ", ".join(ctx.optimizer_name(i) for i in range(len(ctx.optimizers)))
        raise SetupError(
            f"Setup: {len(ctx.optimizers)} optimizers ({names}) but no step function: tropt.standard_step steps one "
            "optimizer on one loss, and cannot know in which order yours step or what each one's loss is",
            "pass your own step=step(ctx, micro_batches) that steps each one (opt_d, opt_g = ctx.optimizers), as in "
            "the README's 'Fitting your loop'; or, for one loss over every parameter, one optimizer with a param "
            "group per part")
    sizes = [ctx.batch_size(mb) for mb in micro_batches]
    total = sum(sizes)
    step_loss = torch.zeros((), device=ctx.device)
    no_sync = getattr(ctx.model, "no_sync", None)  # DistributedDataParallel: all-reduce once, on the last micro-batch
    for i, (mb, n) in enumerate(zip(micro_batches, sizes)):
        quiet = no_sync() if no_sync is not None and i < len(micro_batches) - 1 else contextlib.nullcontext()
        with quiet:
            with ctx.autocast():
                loss = ctx.loss_fn(ctx.model, mb)
            weighted = loss.float() * (n / total)
            (ctx.scaler.scale(weighted) if ctx.scaler is not None else weighted).backward()
        step_loss += weighted.detach()
    if ctx.scaler is not None:
        ctx.scaler.unscale_(ctx.optimizer)  # clip the true gradients, never the scaled ones
    if ctx.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
    if ctx.scaler is not None:
        ctx.scaler.step(ctx.optimizer)
        ctx.scaler.update()
    else:
        ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    # A scheduler that steps on a metric (ReduceLROnPlateau) belongs to the user's epoch loop, after validation:
    # the reference step leaves it alone (the learning rate stays as it is during tropt's short runs).
    if ctx.scheduler is not None and not needs_metric(ctx.scheduler):
        ctx.scheduler.step()
    return step_loss
