"""The sweep's stand-in for the user's schedulers (``dynamics.lr_range``).

The LR range test sets the learning rate itself at every step, so the Setup's schedule must not move it. A step
function still calls its scheduler (``ctx.scheduler.step()``, timm's and fairseq's ``step_update(num_updates)``): each
gets a stand-in that answers every method of the real scheduler as a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.capture import group_lr

if TYPE_CHECKING:
    from ..setup import Setup


class _HeldScheduler:
    """Stands in for the user's scheduler during the sweep: a step function may call any of the scheduler's methods
    (``step()``, ``step(metric)``, timm's and fairseq's ``step_update(num_updates)``, ``step_frac``...) without moving
    the swept learning rate.

    The interface is read from ``template``, the user's own scheduler built on a throwaway optimizer shaped like the
    real one (so its constructor's LR writes never reach the sweep): every public method it has answers as a no-op,
    every other public attribute reads through (``last_epoch``, ``base_lrs``, ``t_initial``). Without a template only
    ``step``/``get_last_lr``/``state_dict``/``load_state_dict`` exist."""

    def __init__(self, optimizer: Any, template: Any = None) -> None:
        self.optimizer = optimizer
        self._template = template

    def step(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return [group_lr(self.optimizer, g) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # only for names not defined above
        template = self.__dict__.get("_template")
        if name.startswith("_") or template is None or not hasattr(template, name):
            raise AttributeError(f"{type(self).__name__} (the sweep's stand-in scheduler) has no attribute {name!r}")
        value = getattr(template, name)
        if callable(value):
            return lambda *args, **kwargs: None  # held: a scheduler method must not move the swept LR
        return value


def held_schedulers(setup: Setup, ctx: Any) -> None:
    """Put a stand-in in place of every scheduler the Setup declares (``ctx.scheduler`` and, with several
    optimizers, ``ctx.more_schedulers``), each shaped like the user's own scheduler for that optimizer."""
    import copy

    import torch

    def scratch_optimizer(opt: Any) -> Any:
        """An optimizer shaped like ``opt`` (its class, its groups' hyperparameters) over one dummy parameter per
        group: cheap whatever the model's size, and nothing the sweep steps."""
        groups = [{**{k: copy.deepcopy(v) for k, v in g.items() if k != "params"},
                   "params": [torch.zeros(1, requires_grad=True)]} for g in opt.param_groups]
        try:
            return type(opt)(groups)
        except Exception:  # noqa: BLE001 - an optimizer class with required arguments of its own
            return torch.optim.SGD(groups, lr=0.0)

    def template(factory: Any, opt: Any) -> Any:
        if factory is None:
            return None
        try:
            return factory(scratch_optimizer(opt))
        except Exception:  # noqa: BLE001 - the template only widens the stand-in's interface
            return None

    declared: Any = setup.scheduler
    opts = list(getattr(ctx, "optimizers", None) or [ctx.optimizer])
    if isinstance(declared, dict):
        declared = tuple(declared.values())
    factories = list(declared) if isinstance(declared, (tuple, list)) else [declared] * len(opts)
    held = [None if f is None else _HeldScheduler(o, template(f, o)) for f, o in zip(factories, opts, strict=False)]
    ctx.scheduler = held[0] if held else None
    if len(held) > 1 and hasattr(ctx, "more_schedulers"):
        ctx.more_schedulers = tuple(held[1:])
