"""The invariance harness: run the user's step on seeded copies and capture what reaches ``optimizer.step()``.

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

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..errors import StepError
from ..setup import Setup
from ..training import StepContext

# Relative gradient error allowed between two runs that must give the same update, by precision. fp32 differs
# only by summation order (about 1e-7 relative); half precisions round every activation.
TOLERANCE = {"fp32": 1e-5, "bf16": 3e-2, "fp16": 1e-2}
_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_BATCH_DEPENDENT = (nn.modules.batchnorm._BatchNorm,)


def tolerance_for(setup: Setup, tol: float | None = None) -> float:
    """The relative-error tolerance for the Setup's precision (or ``tol`` when given)."""
    return float(tol) if tol is not None else TOLERANCE[setup.precision]


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


@dataclass
class StepRecord:
    """What reached one ``optimizer.step()`` call, or one hand-written update (``observed_at="parameter change"``).

    ``grads`` are read at ``optimizer.step()``, after whatever the user's step did to them (unscale, clip).
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


CAPTURES = ("grads", "norm", "lr")


@dataclass
class StepRecorder:
    """Context manager recording a :class:`StepRecord` at every ``optimizer.step()`` of ``ctx``.

    ``capture`` says how much: ``"grads"`` (a copy of every gradient, and the global norm), ``"norm"`` (the global
    gradient norm only) or ``"lr"`` (learning rates and loss scale only, no pass over the gradients). Learning
    rates and the GradScaler's scale are always recorded. See :func:`run_steps` for counting steps per call.
    """

    ctx: StepContext
    capture: str = "grads"
    records: list[StepRecord] = field(default_factory=list)
    scalers: "ScalerWatch | None" = None

    def __post_init__(self) -> None:
        if self.capture not in CAPTURES:
            raise ValueError(f"capture must be one of {CAPTURES}, not {self.capture!r}")
        self._names = {id(p): n for n, p in self.ctx.model.named_parameters()}
        self._handles: list[Any] = []
        self._grad_handles: list[Any] = []
        self._pending: dict[str, torch.Tensor] = {}
        self._last: dict[str, torch.Tensor] = {}

    def _backward_hook(self, name: str) -> Any:
        """A tensor hook on one parameter: add this backward pass's gradient (unscaled) to the pending sum."""
        def hook(grad: torch.Tensor | None) -> None:
            if grad is None:  # DDP's reducer may hand over no gradient for a parameter
                return
            g = grad.detach().float()
            scale = self._scale()  # the scaler that scaled this loss: ctx.scaler or one the step owns
            if scale is not None:
                g = g / scale
            self._last[name] = g.clone()
            self._pending[name] = self._pending[name] + g if name in self._pending else g.clone()
        return hook

    def _scale(self) -> float | None:
        """The scale of the GradScaler that scaled the loss last (the step's own, or ``ctx.scaler``)."""
        scaler = self.scalers.current if self.scalers is not None and self.scalers.current is not None else self.ctx.scaler
        return float(scaler.get_scale()) if scaler is not None else None

    def _hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> tuple | None:
        """At ``optimizer.step()``: record now, or, when the step is given a closure (LBFGS and other optimizers
        that evaluate the loss themselves), hand it a wrapped closure that records after its first evaluation: the
        gradient the optimizer steps with is the closure's, computed inside ``step``."""
        # torch passes step()'s own arguments, the optimizer first: (optimizer, closure) or closure=...
        at = 1 if args and args[0] is optimizer else 0
        closure = kwargs.get("closure", args[at] if len(args) > at else None)
        if not callable(closure):
            self._record(optimizer)
            return None
        self._pending, self._last = {}, {}  # the previous step's later closure evaluations (line search)
        seen: list[StepRecord] = []

        def recording_closure() -> Any:
            loss = closure()
            if not seen:
                seen.append(self._record(optimizer))
            seen[0].closure_evaluations += 1
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": recording_closure}
        return (*args[:at], recording_closure, *args[at + 1:]), kwargs

    def _record(self, optimizer: torch.optim.Optimizer) -> StepRecord:
        scale = self._scale()
        lrs = [float(g["lr"]) for g in optimizer.param_groups]
        grads: dict[str, torch.Tensor | None] = {}
        norm = float("nan")
        if self.capture != "lr":
            present = []
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = None if p.grad is None else p.grad.detach()
                    if g is not None:
                        present.append(g.float())
                    if self.capture == "grads":
                        grads[self._names.get(id(p), f"unnamed_{len(grads)}")] = None if g is None else g.float().clone()
            norm = math.sqrt(sum(float(n) ** 2 for n in torch._foreach_norm(present))) if present else 0.0
        pre, last = self._take_backward_sums(list(grads))
        record = StepRecord(grads, lrs, scale, norm, pre, last)
        self.records.append(record)
        return record

    def __enter__(self) -> "StepRecorder":
        if self.ctx.optimizer is not None:
            self._handles = on_update(self.ctx.optimizer, self._hook)
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
        """The pending pre-clip sums and last backward shares for ``names``; then start the next update afresh."""
        pre = {n: self._pending.get(n) for n in names} if self.capture == "grads" else {}
        last = {n: self._last.get(n) for n in names} if self.capture == "grads" else {}
        self._pending, self._last = {}, {}
        return pre, last

    # ---------------------------------------------------------------- hand-written updates
    def before_call(self) -> dict[str, torch.Tensor]:
        """The parameters' values before one call of the step (to observe a hand-written update)."""
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
        if self.ctx.optimizer is not None and norm == 0.0:
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

    def __enter__(self) -> "ScalerWatch":
        cls = torch.amp.GradScaler
        self._saved = cls.__dict__["scale"]
        original, watch = self._saved, self

        def scale(scaler: Any, outputs: Any) -> Any:
            watch._saw(scaler)
            return original(scaler, outputs)

        cls.scale = scale
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.amp.GradScaler.scale = self._saved


def run_steps(setup: Setup, ctx: StepContext, steps: list[list], *, capture: str = "grads",
              init_scale: float | None = None) -> tuple[list[StepRecord], list[int]]:
    """Run the step under test once per entry of ``steps`` (each a list of micro-batches).

    Returns the update records and, per call, how many updates it made: the number of ``optimizer.step()`` calls,
    or 1 for a call that made none but changed the parameters (a hand-written update; always 1 without an
    optimizer). Any ``GradScaler`` that scales a loss is watched (see :class:`ScalerWatch`; ``init_scale`` sets its
    starting scale).
    """
    calls = []
    with ScalerWatch(init_scale) as scalers, StepRecorder(ctx, capture, scalers=scalers) as rec:
        for micro_batches in steps:
            before = len(rec.records)
            values = rec.before_call()
            setup.run_step(ctx, micro_batches)
            rec.after_call(values, len(rec.records) - before)
            calls.append(len(rec.records) - before)
    return rec.records, calls


class TrainingState:
    """A restorable snapshot of a context's whole training state: model, optimizer, scheduler, scaler, the RNGs and
    the attributes the step keeps on ``ctx`` (its iteration counter, a recurrent hidden state, a scaler wrapper)."""

    def __init__(self, ctx: StepContext) -> None:
        from ..snapshot import Snapshot

        self.ctx = ctx
        # Inner optimizers first: a wrapper's state_dict may not hold theirs (SAM keeps the base optimizer's momentum
        # out of its own), and restoring the wrapper last keeps its view of the shared param groups.
        optimizers = stepping_optimizers(ctx.optimizer)[::-1] if ctx.optimizer is not None else []
        self.snapshot = Snapshot.take([ctx.model, *optimizers, ctx.scheduler, ctx.scaler])
        self.user = ctx.user_state()

    def restore(self) -> None:
        self.snapshot.restore()
        self.ctx.load_user_state(self.user)


def observed_at(records: list[StepRecord]) -> str:
    """Where the compared updates were observed: "optimizer.step", "parameter change" or both (", "-joined)."""
    seen = list(dict.fromkeys(r.observed_at for r in records))
    return ", ".join(seen) if seen else OPTIMIZER_STEP


def require_steps(setup: Setup, calls: list[int], what: str) -> None:
    """Raise a clear StepError when the step under test neither reached ``optimizer.step()`` nor changed a parameter."""
    if sum(calls) == 0:
        who = "tropt.standard_step" if setup.uses_standard_step else "your step function"
        raise StepError(
            f"{who} never called optimizer.step() and changed no parameter during {what}"
            + (" (or the GradScaler skipped every step because the gradients were inf/NaN)" if setup.use_scaler else ""),
            "call ctx.optimizer.step() (or ctx.scaler.step(ctx.optimizer)) once per call of step(ctx, micro_batches), "
            "or update the parameters by hand in it",
        )


def steps_per_call_note(calls: list[int]) -> str | None:
    """None when no call of the step made more than one update; else a note with the count.

    A step must update once per call. Exactly one check owns this finding (``loop.accumulation``, which FAILs with
    the count); every other loop check attaches this note (see :func:`defer_multi_step`) instead of failing for it.
    """
    many = [c for c in calls if c > 1]
    if not many:
        return None
    return f"optimizer.step() ran {max(many)} times in one call of the step (it must run once per call)"


def defer_multi_step(result: Any, calls: list[int]) -> Any:
    """A non-owner check's result when the step updated more than once per call: PASS or FAIL becomes WARN naming
    the count (this check's comparison is not meaningful then), with ``optimizer_steps_per_call`` in metrics."""
    from ..result import Status

    note = steps_per_call_note(calls)
    if note is None or result.status not in (Status.PASS, Status.FAIL):
        return result
    was = result.status.value.upper()
    return dataclasses.replace(
        result, status=Status.WARN, summary=f"{note} (this check's own comparison: {was}: {result.summary})",
        metrics={**result.metrics, "optimizer_steps_per_call": int(max(calls)), "see_also": "loop.accumulation"},
        advice=["Call optimizer.step() exactly once per call of step(ctx, micro_batches), after the last micro-batch's "
                "backward; then rerun this check."] + list(result.advice))


def latent_when_unused(setup: Setup, result: Any) -> Any:
    """A FAIL that only shows with gradient accumulation becomes WARN for a Setup that does not accumulate.

    The loop checks still try K micro-batches when ``accumulation_steps=1`` (the step should be right for any K),
    but then the user's own updates are not affected yet: a latent defect, not a wrong update.
    """
    import dataclasses

    from ..result import Status

    if result.status is not Status.FAIL or setup.accumulation_steps > 1:
        return result
    return dataclasses.replace(
        result, status=Status.WARN,
        summary=f"latent (this Setup does not accumulate gradients, so its updates are not affected yet): {result.summary}",
        metrics={**result.metrics, "latent": True},
        advice=["Fix this before turning on gradient accumulation (accumulation_steps > 1)."] + list(result.advice))


def quiet_randomness(model: nn.Module) -> int:
    """Switch off dropout in a copy (p = 0) so randomness not under test cannot fake or mask a difference.

    Returns how many modules were changed. Works even if the user's step calls ``model.train()``.
    """
    changed = 0
    for m in model.modules():
        if isinstance(m, _DROPOUT) and m.p:
            m.p = 0.0
            changed += 1
        elif isinstance(m, (nn.MultiheadAttention, nn.RNNBase)) and m.dropout:  # dropout inside attention / between RNN layers
            m.dropout = 0.0
            changed += 1
    return changed


def batch_dependent_layers(model: nn.Module) -> list[str]:
    """Names of layers whose output for one sample depends on the rest of the batch in training (BatchNorm and friends)."""
    return [name for name, m in model.named_modules() if isinstance(m, _BATCH_DEPENDENT)]


def freeze_batch_stats(model: nn.Module) -> int:
    """Make batch-dependent layers of a copy normalise with their running statistics, whatever mode is set.

    ``model.train()`` calls ``child.train(mode)``; an instance-level override keeps these layers in eval mode.
    Layers without running statistics get fresh ones (mean 0, variance 1), which is still per-sample.
    """
    count = 0
    for m in model.modules():
        if isinstance(m, _BATCH_DEPENDENT):
            if m.running_mean is None:
                m.register_buffer("running_mean", torch.zeros(m.num_features, device=next(m.parameters(), torch.zeros(0)).device))
                m.register_buffer("running_var", torch.ones(m.num_features, device=m.running_mean.device))
                m.track_running_stats = True
            m.training = False
            m.train = (lambda self_: (lambda mode=True: self_))(m)
            count += 1
    return count


def _as_float(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_floating_point() and t.dtype in (torch.float32, torch.float64) else t.float()


def _nonfinite_pair(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float | None]:
    """(|x|, |y|, |x - y|) over finite entries only; the diff is None when a non-finite entry differs.

    Non-finite entries are compared by exact equality (inf == inf, NaN == NaN): a norm of inf would make any
    difference vanish relative to it, e.g. ReduceLROnPlateau's ``best`` = inf before its first step vs 1.0 after.
    """
    x, y = x.detach().double().cpu(), y.detach().double().cpu()
    if x.shape != y.shape:
        return float(x.nan_to_num(0.0, 0.0, 0.0).norm()), float(y.nan_to_num(0.0, 0.0, 0.0).norm()), None
    fx, fy = torch.isfinite(x), torch.isfinite(y)
    bad = ~(fx & fy)
    same = (x[bad] == y[bad]) | (x[bad].isnan() & y[bad].isnan())
    nx, ny = float(x.where(fx, 0.0).norm()), float(y.where(fy, 0.0).norm())
    return nx, ny, (float((x - y).where(~bad, 0.0).norm()) if bool(same.all()) else None)


def _pair_norms(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> dict[str, tuple[float, float, float | None]]:
    """Per name: (|a|, |b|, |a - b|) with batched foreach norms (one host read).

    The diff is None for a full mismatch: a tensor present on one side only, or non-finite entries that differ.
    Norms cover finite entries only (see :func:`_nonfinite_pair`), so they are always finite.
    """
    names = list(a) + [n for n in b if n not in a]
    both = [n for n in names if a.get(n) is not None and b.get(n) is not None]
    xs, ys = [_as_float(a[n]) for n in both], [_as_float(b[n]) for n in both]
    lone = [(n, a.get(n) if a.get(n) is not None else b.get(n)) for n in names if (a.get(n) is None) != (b.get(n) is None)]
    norms: list[torch.Tensor] = []
    if both:
        norms += torch._foreach_norm(xs) + torch._foreach_norm(ys) + torch._foreach_norm(torch._foreach_sub(xs, ys))
    norms += [_as_float(t).nan_to_num(0.0, 0.0, 0.0).norm() for _, t in lone]
    values = torch.stack([v.double().cpu() for v in norms]).tolist() if norms else []
    k = len(both)
    out = {}
    for i, n in enumerate(both):
        triple = (values[i], values[k + i], values[2 * k + i])
        # A non-finite norm means a non-finite entry (or an overflow): redo that pair exactly, in float64.
        out[n] = triple if all(math.isfinite(v) for v in triple) else _nonfinite_pair(a[n], b[n])
    for j, (n, _) in enumerate(lone):
        v = values[3 * k + j]
        out[n] = (v, 0.0, None) if a.get(n) is not None else (0.0, v, None)
    for n in names:
        out.setdefault(n, (0.0, 0.0, 0.0))
    return {n: out[n] for n in names}


def _rel(nx: float, ny: float, d: float | None, scale: float) -> float:
    """Relative error of one pair; a full mismatch (d None) is 1."""
    return 1.0 if d is None else d / max(nx, ny, 1e-6 * scale)


def max_rel_error(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> float:
    """The worst per-tensor relative error of :func:`compare_tensors`, without building its table."""
    norms = _pair_norms(a, b)
    scale = max([max(nx, ny) for nx, ny, _ in norms.values()] + [1e-30])
    return max([_rel(nx, ny, d, scale) for nx, ny, d in norms.values()] + [0.0])


def compare_tensors(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None], *,
                    labels: tuple[str, str] = ("a", "b")) -> pd.DataFrame:
    """Per-tensor relative error ``|a - b| / max(|a|, |b|)`` (Frobenius norms), worst first.

    A tensor present on one side only (e.g. a gradient that is None in one run) counts as error 1. The
    denominator is floored at 1e-6 of the largest norm so tensors that are zero in both runs compare as equal.
    Non-finite entries (inf, NaN) stay out of the norms and are compared exactly: any difference there is error 1.
    """
    la, lb = labels
    norms = _pair_norms(a, b)
    scale = max([max(nx, ny) for nx, ny, _ in norms.values()] + [1e-30])
    rows = []
    for name, (nx, ny, diff) in norms.items():
        rows.append({"tensor": name, f"norm_{la}": nx, f"norm_{lb}": ny, "abs_diff": max(nx, ny) if diff is None else diff,
                     "rel_error": _rel(nx, ny, diff, scale)})
    df = pd.DataFrame(rows, columns=["tensor", f"norm_{la}", f"norm_{lb}", "abs_diff", "rel_error"])
    return df.sort_values("rel_error", ascending=False, kind="stable").reset_index(drop=True)


def global_rel_error(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> float:
    """Relative error of all tensors together: ``|a - b| / max(|a|, |b|)`` over the concatenation."""
    norms = _pair_norms(a, b)
    diff2 = sum((max(nx, ny) if d is None else d) ** 2 for nx, ny, d in norms.values())
    denom = math.sqrt(max(sum(nx**2 for nx, _, _ in norms.values()), sum(ny**2 for _, ny, _ in norms.values())))
    return math.sqrt(diff2) / denom if denom > 0 else 0.0


def flatten_state(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor (and number, as a 0-d float64 tensor) in a nested state, by dotted path — for comparing states.

    Tensors are views of the live ones (no copy): compare before training goes on.
    """
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach() if obj.is_floating_point() else obj.detach().double()
    elif isinstance(obj, bool):
        out[prefix] = torch.tensor(float(obj))
    elif isinstance(obj, (int, float)):
        out[prefix] = torch.tensor(float(obj), dtype=torch.float64)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten_state(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten_state(v, f"{prefix}.{i}" if prefix else str(i)))
    return out




def nonfinite_tensors(grads: dict[str, torch.Tensor | None]) -> dict[str, int]:
    """Per tensor name, how many entries are inf or NaN (only names that have some)."""
    out = {}
    for name, g in grads.items():
        if g is not None and g.is_floating_point():
            bad = int((~torch.isfinite(g)).sum())
            if bad:
                out[name] = bad
    return out


def nonfinite_result(check: str, runs: dict[str, tuple[int, dict[str, torch.Tensor | None]]],
                     what: str = "gradients") -> Any:
    """A FAIL naming the first non-finite value among compared runs, or None when every value is finite.

    ``runs`` maps a run's label to (step number, tensors). Two NaNs are never "equal": a comparison that meets a
    non-finite value has found that, and nothing else (no cause is guessed from a broken comparison).
    """
    from ..result import CheckResult, Status

    rows = []
    for label, (t, grads) in runs.items():
        for name, count in nonfinite_tensors(grads).items():
            rows.append({"run": label, "step": t, "tensor": name, "nonfinite_entries": count,
                         "entries": int(grads[name].numel())})
    if not rows:
        return None
    first = rows[0]
    table = pd.DataFrame(rows)
    labels = sorted(set(table["run"]), key=list(runs).index)
    summary = (f"non-finite {what} at step {first['step']} ({first['tensor']}: {first['nonfinite_entries']} of "
               f"{first['entries']} entries inf/NaN, in {len(table)} tensor(s) of run{'s' if len(labels) > 1 else ''} "
               f"{', '.join(labels)}): nothing can be compared until the loss and its {what} are finite")
    metrics = {"nonfinite_step": int(first["step"]), "nonfinite_tensors": len(table), "nonfinite_runs": ", ".join(labels),
               "observed_at": "optimizer.step"}
    return CheckResult(check, Status.FAIL, summary, metrics, {"nonfinite": table}, [
        "Find where the loss goes non-finite: NaN/inf in the inputs, log(0) or division by zero in the loss, "
        "or an fp16 overflow (a .half() model: train in fp32 or bf16 autocast, or use fp16 autocast with a GradScaler).",
        "If it diverges only after some steps, lower the learning rate or clip gradients.",
    ])
