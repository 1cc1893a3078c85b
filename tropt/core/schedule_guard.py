"""A schedule held at its end while a probe trains longer than the schedule was sized for.

``model.overfit_batch`` (through :func:`tropt.model.fixed_batch.train_on_batch`) runs the user's own step on one
batch for up to a few hundred steps, and the step steps the Setup's scheduler. A schedule sized for a short run
(a fine-tuning run of a few hundred iterations; DeepLab's ``PolyLR(max_iters)``, Hugging Face's linear decay to 0,
``OneCycleLR(total_steps)``) then runs past its end: it raises (OneCycleLR), gives a complex or non-finite rate
(``(1 - t / T) ** 0.9`` for t > T) or decays to 0, and the probe fails for the schedule, not for the model.

:class:`HeldAtEnd` stands in for such a scheduler: every call is forwarded while the schedule is inside its range;
the first call that raises, writes a learning rate that is not a finite real number, or (``hold_at_zero``) brings a
group's rate to 0 after it was above (a decay to its end: HF's linear schedule, PolyLR at ``max_iters``) ends the
schedule: each group is held at the highest rate the schedule
gave it (the probe asks whether the model can learn at the rates the schedule trains with, not at its tail), and every
later method call of the scheduler is a no-op. A schedule that stays inside its range in the probe (every
healthy long schedule) is never touched, and neither is one that only decays (a rate 4x too fast is the user's
schedule, which ``loop.scheduler_cadence`` judges, not an end). Attribute reads go to the user's scheduler.
"""

from __future__ import annotations

import math
from typing import Any


def _real_lr(value: Any) -> float | None:
    try:
        f = float(value)  # a complex number raises TypeError; a one-element tensor converts
    except (TypeError, ValueError, RuntimeError):
        return None
    return f if math.isfinite(f) else None


class HeldAtEnd:
    def __init__(self, scheduler: Any, optimizer: Any, hold_at_zero: bool = True) -> None:
        self.__dict__.update(_inner=scheduler, _optimizer=optimizer, _at_zero=hold_at_zero, held_at=None, calls=0,
                             _peak=[_real_lr(g.get("lr")) for g in optimizer.param_groups])

    def _lrs(self) -> list[Any]:
        return [g.get("lr") for g in self._optimizer.param_groups]

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.held_at is not None:
            return None
        before = self._lrs()
        try:
            out = getattr(self._inner, name)(*args, **kwargs)
        except Exception:  # noqa: BLE001 - past its end (OneCycleLR raises): hold the last rates
            out, ended = None, True
        else:
            now = [_real_lr(v) for v in self._lrs()]
            peak = [max(p, n) if p is not None and n is not None else (p if n is None else n)
                    for p, n in zip(self._peak, now)]
            ended = any(n is None for n, b in zip(now, before) if _real_lr(b) is not None) or any(
                self._at_zero and n is not None and p is not None and p > 0 and n == 0 for n, p in zip(now, peak))
            self.__dict__["_peak"] = peak
        self.__dict__["calls"] = self.calls + 1
        if ended:  # hold every group at the highest rate the schedule gave it (its last one when none is known)
            for g, v, p in zip(self._optimizer.param_groups, before, self._peak):
                g["lr"] = type(v)(p) if p is not None and isinstance(v, (int, float)) else v
            self.__dict__["held_at"] = self.calls
        return out

    def step(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("step", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__dict__["_inner"], name)
        if callable(value) and not name.startswith("_") and name not in ("state_dict", "get_last_lr", "get_lr"):
            return lambda *args, **kwargs: self._call(name, *args, **kwargs)  # timm's step_update, ...
        return value


def hold_schedules_at_end(ctx: Any, hold_at_zero: bool = True) -> list[HeldAtEnd]:
    """Wrap ``ctx.scheduler`` (and ``ctx.more_schedulers``) in :class:`HeldAtEnd`, in place; the guards returned say
    whether and when each schedule was held (``held_at``)."""
    guards: list[HeldAtEnd] = []
    opts = list(getattr(ctx, "optimizers", None) or ([ctx.optimizer] if ctx.optimizer is not None else []))
    scheds = list(getattr(ctx, "schedulers", None) or [])
    wrapped = []
    for sched, opt in zip(scheds, opts):
        if sched is None or opt is None:
            wrapped.append(sched)
            continue
        g = HeldAtEnd(sched, opt, hold_at_zero)
        guards.append(g)
        wrapped.append(g)
    if wrapped:
        ctx.scheduler = wrapped[0]
        if len(wrapped) > 1 and hasattr(ctx, "more_schedulers"):
            ctx.more_schedulers = tuple(wrapped[1:])
    return guards
