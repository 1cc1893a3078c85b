"""Capture at ``optimizer.step()``: run the step under test and record what reaches the optimizer.

Capture uses ``Optimizer.register_step_pre_hook`` (never monkey-patching ``step``, which confuses LR schedulers):
at each optimizer step we record every parameter's gradient (by name), each group's learning rate, the
GradScaler's scale and the global gradient norm. ``GradScaler.step`` unscales before it calls ``optimizer.step``,
so captured gradients are always the true (unscaled) ones.

A step that updates the parameters by hand (no optimizer, or an optimizer it never steps) is observed as the
parameter change around each call instead: the record then holds the update (after - before) under ``grads`` and
says ``observed_at="parameter change"``. Updates are linear in the gradient for plain SGD, so the invariance
comparisons hold for them as they do for gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..setup import Setup
from ..training import StepContext
from .own_hooks import dense, norm_view, owned_hook

OPTIMIZER_STEP = "optimizer.step"
PARAMETER_CHANGE = "parameter change"


def stepping_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """``optimizer`` and the optimizers it wraps (attributes holding a torch Optimizer: SAM's ``base_optimizer``,
    Lookahead's ``optimizer``, ZeroRedundancyOptimizer's ``optim``), outermost first."""
    out, todo, seen = [], [optimizer], set()
    while todo:
        o = todo.pop(0)
        if not isinstance(o, torch.optim.Optimizer) or id(o) in seen:
            continue
        seen.add(id(o))
        out.append(o)
        todo += [v for v in vars(o).values() if isinstance(v, torch.optim.Optimizer)]
    return out


def on_update(optimizer: Any, hook: Any) -> list[Any]:
    """Call ``hook(optimizer, args, kwargs)`` (a step pre-hook; its return value is passed on) once per update:
    at ``optimizer.step()``, or at the step of an optimizer it wraps when that one is stepped by other means (SAM's
    ``second_step`` calls ``base_optimizer.step()``; the wrapper's own ``step`` is never called). A wrapped step
    inside the wrapper's ``step`` (Lookahead) is the same update and is not reported again. Returns the handles."""
    depth = [0]

    def pre(opt: Any, args: Any, kwargs: Any) -> Any:
        depth[0] += 1
        return hook(opt, args, kwargs) if depth[0] == 1 else None

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        depth[0] = max(0, depth[0] - 1)

    handles = []
    for o in stepping_optimizers(optimizer):
        try:
            handles += [o.register_step_pre_hook(pre), o.register_step_post_hook(post)]
        except (AttributeError, TypeError):  # a wrapper without hook dicts of its own (it skipped
            continue  # Optimizer.__init__): the optimizer it wraps still reports the update
    return handles


def group_lr(optimizer: Any, group: dict) -> float:
    """The learning rate ``group`` steps with at the coming ``optimizer.step()``, as a float; NaN when unknown.

    A number (or a one-element tensor) in ``group["lr"]`` is that rate. An optimizer that schedules its own step
    size has none there: Hugging Face's ``Adafactor(relative_step=True)`` takes ``lr=None`` and applies the relative
    step ``min(1e-6 * t if warmup_init else 1e-2, 1 / sqrt(t))`` at its step ``t`` (times each parameter's RMS with
    ``scale_parameter``), which is what is returned for it. Any other value (a missing key, None, a schedule
    object) is NaN: unknown, never 0 (a rate of 0 means "never updated") and never a crash.
    """
    lr = group.get("lr")
    if isinstance(lr, torch.Tensor) and lr.numel() == 1:
        return float(lr.detach())
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return float(lr)
    if lr is None and group.get("relative_step") is True:  # Adafactor's relative step
        steps = [s.get("step", 0) for p in group.get("params", ()) if isinstance(s := optimizer.state.get(p), dict)]
        t = float(max((s for s in steps if isinstance(s, (int, float))), default=0)) + 1.0
        return min(1e-6 * t if group.get("warmup_init") else 1e-2, 1.0 / math.sqrt(t))
    return math.nan


@dataclass
class StepRecord:
    """What reached one ``optimizer.step()`` call, or one hand-written update (``observed_at="parameter change"``).

    ``grads`` are read at ``optimizer.step()``, after whatever the user's step did to them (unscale, clip).
    ``lrs`` holds each param group's learning rate as :func:`group_lr` reads it (NaN where the optimizer says none).
    For a parameter-change record ``grads`` holds each parameter's update (value after the call minus before),
    ``grad_norm`` its global norm and ``lrs`` is empty (a hand-written update has no param groups).
    ``pre_clip`` is each parameter's gradient summed over the backward passes since the previous update, taken as
    autograd hands it over (before it is accumulated into ``.grad``) and divided by the scale of the GradScaler that
    scaled the loss: what the losses asked for, whatever clipping or ``zero_grad`` did afterwards.
    ``last_backward`` is the last backward pass's share of it.
    When ``optimizer.step(closure)`` computes the loss itself, the record is taken right after the closure's first
    evaluation (the gradient its first direction uses), and ``closure_evaluations`` counts its evaluations.
    """

    grads: dict[str, torch.Tensor | None]
    lrs: list[float]
    scale: float | None
    grad_norm: float  # global norm of the gradients the optimizer stepped with (NaN when not captured)
    pre_clip: dict[str, torch.Tensor | None] = field(default_factory=dict)
    last_backward: dict[str, torch.Tensor | None] = field(default_factory=dict)
    observed_at: str = OPTIMIZER_STEP
    closure_evaluations: int = 0  # times step()'s closure computed the loss (LBFGS: several); 0 without a closure
    optimizer: str = ""  # which optimizer stepped: "optimizer", a Setup's name for it ("D"), "ctx.opt_g"; "" by hand


def updates_per_call(records: list[StepRecord]) -> int:
    """How many updates one call of the step made: the most updates any one optimizer made in it.

    A GAN's call that steps the discriminator and then the generator is one training step (1), as is an
    actor-critic call stepping two optimizers; one optimizer stepped twice in a call is 2 (the defect
    ``loop.accumulation`` owns). A hand-written update (a parameter-change record) counts 1.
    """
    counts: dict[str, int] = {}
    for r in records:
        counts[r.optimizer] = counts.get(r.optimizer, 0) + 1
    return max(counts.values(), default=0)


def inner_loop(records: list[StepRecord]) -> bool:
    """Whether the optimizers that step more than once in one call's ``records`` step each time after a fresh
    backward pass (an inner loop: a GAN's n_critic / num_D_steps discriminator steps, PPO's epochs over a rollout),
    rather than apply one gradient again: every repeated record of theirs has gradient from backward passes since
    the previous update (``pre_clip``). False when no optimizer repeats or for hand-written updates."""
    repeated = [rs for name, rs in by_optimizer(records).items() if len(rs) > 1 and name]
    return bool(repeated) and all(any(v is not None and bool(v.abs().sum() > 0) for v in r.pre_clip.values())
                                  for rs in repeated for r in rs[1:])


def by_optimizer(records: list[StepRecord]) -> dict[str, list[StepRecord]]:
    """The records of one or more calls grouped by the optimizer that stepped, in the order each first stepped."""
    out: dict[str, list[StepRecord]] = {}
    for r in records:
        out.setdefault(r.optimizer, []).append(r)
    return out


CAPTURES = ("grads", "norm", "lr")


@dataclass
class StepRecorder:
    """Context manager recording a :class:`StepRecord` at every ``optimizer.step()`` of ``ctx``.

    Every optimizer is watched: each of ``ctx.optimizers``, each one the step keeps on ``ctx`` (``ctx.opt_g``), and
    any other optimizer holding one of the model's parameters that steps while the recorder is active (one the step
    builds during the call); each record names the optimizer that stepped (:attr:`StepRecord.optimizer`).
    ``capture`` says how much: ``"grads"`` (a copy of every gradient, and the global norm), ``"norm"`` (the global
    gradient norm only) or ``"lr"`` (learning rates and loss scale only, no pass over the gradients). Learning
    rates and the GradScaler's scale are always recorded. See :func:`run_steps` for counting steps per call.
    """

    ctx: StepContext
    capture: str = "grads"
    records: list[StepRecord] = field(default_factory=list)
    scalers: ScalerWatch | None = None

    def __post_init__(self) -> None:
        if self.capture not in CAPTURES:
            raise ValueError(f"capture must be one of {CAPTURES}, not {self.capture!r}")
        self._names = {id(p): n for n, p in self.ctx.model.named_parameters()}
        self._handles: list[Any] = []
        self._grad_handles: list[Any] = []
        self._pending: dict[str, torch.Tensor] = {}
        self._last: dict[str, torch.Tensor] = {}
        self._known: set[int] = set()  # ids of the optimizers hooked by name (and those they wrap)
        self._foreign_depth = 0

    def _backward_hook(self, name: str) -> Any:
        """A tensor hook on one parameter: add this backward pass's gradient (unscaled) to the pending sum."""
        @owned_hook("step recorder (its gradient hook)")
        def hook(grad: torch.Tensor | None) -> None:
            if grad is None:  # DDP's reducer may hand over no gradient for a parameter
                return
            g = dense(grad.detach()).float()
            scale = self._scale()  # the scaler that scaled this loss: ctx.scaler or one the step owns
            if scale is not None:
                g = g / scale
            self._last[name] = g.clone()
            self._pending[name] = self._pending[name] + g if name in self._pending else g.clone()
        return hook

    def _scale(self) -> float | None:
        """The scale of the GradScaler that scaled the loss last (the step's own, or ``ctx.scaler``)."""
        watched = self.scalers.current if self.scalers is not None else None
        scaler = watched if watched is not None else self.ctx.scaler
        return float(scaler.get_scale()) if scaler is not None else None

    def _named_hook(self, name: str) -> Any:
        def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> tuple | None:
            return self._hook(optimizer, args, kwargs, name)
        return hook

    @owned_hook("step recorder (its optimizer-step hook)")
    def _foreign_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple | None:
        """A global step pre-hook: an optimizer not hooked by name that holds a model parameter (the step built it
        during this call) is recorded too; a step nested in one of them (a wrapper's) is the same update."""
        if id(optimizer) in self._known or not any(id(p) in self._names for g in optimizer.param_groups
                                                   for p in g["params"]):
            return None
        self._foreign_depth += 1
        if self._foreign_depth > 1:
            return None
        name = next((n for n, o in self.ctx.all_optimizers() if o is optimizer), "an optimizer built by the step")
        return self._hook(optimizer, args, kwargs, name)

    @owned_hook("step recorder (its optimizer-step hook)")
    def _foreign_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if id(optimizer) not in self._known and self._foreign_depth:
            self._foreign_depth -= 1

    @owned_hook("step recorder (its optimizer-step hook)")
    def _hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any, name: str = "optimizer") -> tuple | None:
        """At ``optimizer.step()``: record now, or, when the step is given a closure (LBFGS and other optimizers
        that evaluate the loss themselves), hand it a wrapped closure that records after its first evaluation: the
        gradient the optimizer steps with is the closure's, computed inside ``step``."""
        # torch passes step()'s own arguments, the optimizer first: (optimizer, closure) or closure=...
        at = 1 if args and args[0] is optimizer else 0
        closure = kwargs.get("closure", args[at] if len(args) > at else None)
        if not callable(closure):
            self._record(optimizer, name)
            return None
        self._pending, self._last = {}, {}  # the previous step's later closure evaluations (line search)
        seen: list[StepRecord] = []

        def recording_closure() -> Any:
            loss = closure()
            if not seen:
                seen.append(self._record(optimizer, name))
            seen[0].closure_evaluations += 1
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": recording_closure}
        return (*args[:at], recording_closure, *args[at + 1:]), kwargs

    def _record(self, optimizer: torch.optim.Optimizer, name: str = "optimizer") -> StepRecord:
        scale = self._scale()
        lrs = [group_lr(optimizer, g) for g in optimizer.param_groups]
        grads: dict[str, torch.Tensor | None] = {}
        norm = float("nan")
        if self.capture != "lr":
            present = []
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = None if p.grad is None else p.grad.detach()
                    if g is not None:  # a sparse gradient: its values for the norm, densified where it is kept
                        present.append(norm_view(g).float())
                    if self.capture == "grads":
                        pname = self._names.get(id(p), f"unnamed_{len(grads)}")
                        grads[pname] = None if g is None else dense(g).float().clone()
            norm = math.sqrt(sum(float(n) ** 2 for n in torch._foreach_norm(present))) if present else 0.0
        pre, last = self._take_backward_sums(list(grads))
        record = StepRecord(grads, lrs, scale, norm, pre, last, optimizer=name)
        self.records.append(record)
        return record

    def __enter__(self) -> StepRecorder:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        for name, opt in self.ctx.all_optimizers():
            reach = {id(o) for o in stepping_optimizers(opt)}
            # One that wraps or is wrapped by an optimizer already hooked (ctx.opt = accelerator.prepare_optimizer(
            # ctx.optimizer)) makes the same updates: hooking it too would record each update twice.
            if not reach & self._known:
                self._handles += on_update(opt, self._named_hook(name))
            self._known |= reach
        self._handles += [register_optimizer_step_pre_hook(self._foreign_pre),
                          register_optimizer_step_post_hook(self._foreign_post)]
        if self.capture == "grads":
            self._grad_handles = [p.register_hook(self._backward_hook(n))
                                  for n, p in self.ctx.model.named_parameters() if p.requires_grad]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for h in self._grad_handles:
            h.remove()
        self._grad_handles = []

    def _take_backward_sums(self, names: list[str]) -> tuple[dict, dict]:
        """The pending pre-clip sums and last backward shares for ``names``; those of the other parameters stay
        pending for the optimizer that holds them (a GAN's generator steps after the discriminator) until the call
        ends (:meth:`before_call` starts each call afresh)."""
        pre = {n: self._pending.get(n) for n in names} if self.capture == "grads" else {}
        last = {n: self._last.get(n) for n in names} if self.capture == "grads" else {}
        for n in names:
            self._pending.pop(n, None)
            self._last.pop(n, None)
        return pre, last

    def _start_call(self) -> None:
        self._pending, self._last = {}, {}

    # ---------------------------------------------------------------- hand-written updates
    def before_call(self) -> dict[str, torch.Tensor]:
        """The parameters' values before one call of the step (to observe a hand-written update)."""
        self._start_call()
        return {n: p.detach().clone() for n, p in self.ctx.model.named_parameters()}

    def after_call(self, before: dict[str, torch.Tensor], stepped: int) -> None:
        """Record the parameter change of a call that made no optimizer step: always without an optimizer (a zero
        change is then an update that did nothing), else only when the parameters moved."""
        if stepped:
            return
        deltas = {n: (p.detach().float() - before[n].float()) if p.shape == before[n].shape else None
                  for n, p in self.ctx.model.named_parameters() if n in before}
        present = [d for d in deltas.values() if d is not None]
        norm = math.sqrt(sum(float(n) ** 2 for n in torch._foreach_norm(present))) if present else 0.0
        if self.ctx.optimizers and norm == 0.0:
            return
        grads = deltas if self.capture == "grads" else {}
        pre, last = self._take_backward_sums(list(deltas))
        self.records.append(StepRecord(grads, [], self._scale(), norm if self.capture != "lr" else float("nan"),
                                       pre, last, PARAMETER_CHANGE))


class ScalerWatch:
    """Context manager noting which ``torch.amp.GradScaler`` objects scale a loss while it is active.

    A step may scale with ``ctx.scaler`` or with a scaler it built itself (a native-scaler wrapper owning its own
    ``GradScaler``); the loss-scaling check must read and set whichever one actually scaled the loss. ``scale`` is
    wrapped on the class for the duration only (the optimizer is never patched), and put back on exit.
    With ``init_scale``, every scaler seen starts (or restarts) at that scale.
    """

    def __init__(self, init_scale: float | None = None) -> None:
        self.init_scale = init_scale
        self.used: list[Any] = []
        self._saved: Any = None

    @property
    def current(self) -> Any:
        """The scaler that scaled a loss last, or None."""
        return self.used[-1] if self.used else None

    def _saw(self, scaler: Any) -> None:
        if any(u is scaler for u in self.used):
            if self.used[-1] is not scaler:
                self.used = [u for u in self.used if u is not scaler] + [scaler]
            return
        self.used.append(scaler)
        if self.init_scale is not None and scaler.is_enabled():
            if getattr(scaler, "_scale", None) is None:
                scaler._init_scale = float(self.init_scale)
            else:
                scaler._scale.fill_(float(self.init_scale))

    def __enter__(self) -> ScalerWatch:
        cls = torch.amp.GradScaler
        self._saved = cls.__dict__["scale"]
        original, watch = self._saved, self

        def scale(scaler: Any, outputs: Any) -> Any:
            watch._saw(scaler)
            return original(scaler, outputs)

        cls.scale = scale  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.amp.GradScaler.scale = self._saved  # type: ignore[method-assign]


def run_steps(setup: Setup, ctx: StepContext, steps: list[list], *, capture: str = "grads",
              init_scale: float | None = None) -> tuple[list[StepRecord], list[int]]:
    """Run the step under test once per entry of ``steps`` (each a list of micro-batches).

    Returns the update records and, per call, how many updates it made (:func:`updates_per_call`): the number of
    ``optimizer.step()`` calls of the optimizer that stepped most (a call stepping a GAN's discriminator and then
    its generator made 1 training step, in 2 records), or 1 for a call that made none but changed the parameters
    (a hand-written update; always 1 without an optimizer). Any ``GradScaler`` that scales a loss is watched (see
    :class:`ScalerWatch`; ``init_scale`` sets its starting scale).
    """
    calls = []
    with ScalerWatch(init_scale) as scalers, StepRecorder(ctx, capture, scalers=scalers) as rec:
        for micro_batches in steps:
            before = len(rec.records)
            values = rec.before_call()
            setup.run_step(ctx, micro_batches)
            rec.after_call(values, len(rec.records) - before)
            calls.append(updates_per_call(rec.records[before:]))
    return rec.records, calls


class TrainingState:
    """A restorable snapshot of a context's whole training state: model, every optimizer (``ctx.optimizers`` and
    the optimizers they wrap), scheduler(s), scaler, the RNGs, the attributes the step keeps on ``ctx`` (its
    iteration counter, a recurrent hidden state, a scaler wrapper, an EMA model) and the state it carries elsewhere
    (:class:`tropt.core.carried_state.CarriedState`: tensor attributes of the model's modules that are neither
    parameters nor buffers, of objects on ``ctx``, and of the step function's closure when ``step`` is given).

    ``carried`` holds that last snapshot; ``carried.changed()`` names what a step changed since (``model.hidden``).
    """

    def __init__(self, ctx: StepContext, step: Any = None) -> None:
        from ..snapshot import Snapshot
        from .carried_state import CarriedState

        self.ctx = ctx
        optimizers = getattr(ctx, "optimizers", None) or ([ctx.optimizer] if ctx.optimizer is not None else [])
        # Inner optimizers first: a wrapper's state_dict may not hold theirs (SAM keeps the base optimizer's momentum
        # out of its own), and restoring the wrapper last keeps its view of the shared param groups.
        inner: list[Any] = []
        for optimizer in optimizers:
            inner += [o for o in stepping_optimizers(optimizer)[::-1] if all(o is not x for x in inner)]
        schedulers = getattr(ctx, "schedulers", None) or [ctx.scheduler]
        self.snapshot = Snapshot.take([ctx.model, *inner, *schedulers, ctx.scaler])
        self.user = ctx.user_state()
        self.carried = CarriedState.take(ctx, step)

    def restore(self) -> None:
        self.snapshot.restore()
        self.ctx.load_user_state(self.user)
        self.carried.restore()


def observed_at(records: list[StepRecord]) -> str:
    """Where the compared updates were observed: "optimizer.step", "parameter change" or both (", "-joined)."""
    seen = list(dict.fromkeys(r.observed_at for r in records))
    return ", ".join(seen) if seen else OPTIMIZER_STEP
