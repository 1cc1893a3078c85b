"""A declared clip must clip, for ``loop.loss_scaling``: with ``Setup(grad_clip=c)``, on a step whose raw (pre-clip)
gradient norm exceeds c, the norm that reaches ``optimizer.step()`` must be at most c.

The step runs once on a fresh copy (the GradScaler, if any, at scale 1: the scale's own effect is the scale
comparison's business). When the batch's raw norm does not exceed c, tensor hooks scale every gradient on its way
into ``.grad`` until it does (×4c/raw), and the step runs again; the step's clip sees the larger gradients as it would
see a large batch's. Calls of ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` / ``clip_grads_with_norm_``
are watched (a profile hook, so ``from torch.nn.utils import clip_grad_norm_`` is seen too): the parameters each was
given (an exhausted generator clips nothing), its bound, and the norm it measured. A cause is named only when a call
shows it; otherwise a norm above c is a WARN with that evidence.
"""

from __future__ import annotations

import inspect
import math
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..core.capture import OPTIMIZER_STEP, run_steps
from ..core.modes import quiet_randomness
from ..result import Status
from ..snapshot import preserved
from ._invariance_common import norm_of

if TYPE_CHECKING:
    from ..setup import Setup

_WATCHED = ("clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_")
_SLACK = 1e-3  # relative: clip_grad_norm_ scales to c / (norm + 1e-6), and fp32 sums round


def _codes() -> dict[types.CodeType, str]:
    out = {}
    for name in _WATCHED:
        fn = getattr(torch.nn.utils, name, None)
        code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
        if code is not None:
            out[code] = name
    return out


def _describe(params: Any) -> str:
    if isinstance(params, torch.Tensor):
        return "1 tensor"
    if isinstance(params, types.GeneratorType):
        return {inspect.GEN_CLOSED: "exhausted generator", inspect.GEN_CREATED: "generator"}.get(
            inspect.getgeneratorstate(params), "partly consumed generator")
    try:
        n = len(params)
    except TypeError:
        return type(params).__name__
    return "empty" if n == 0 else f"{n} tensors"


class ClipCalls:
    """Context manager recording the clip calls made while it is active (nothing when another profiler is set)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.watching = False
        self._codes = _codes()
        self._open: dict[int, int] = {}

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        try:
            if event == "call":
                name = self._codes.get(frame.f_code)
                if name is not None and not self._open:  # a clip inside a clip is the same call
                    self._enter(frame, name)
            elif event == "return" and id(frame) in self._open:
                call = self.calls[self._open.pop(id(frame))]
                if call["function"] == "clip_grad_norm_" and isinstance(arg, torch.Tensor) and arg.numel() == 1:
                    call["measured_norm"] = float(arg)
        except Exception:  # noqa: BLE001 - watching must never break the user's step
            return

    def _enter(self, frame: types.FrameType, name: str) -> None:
        local = frame.f_locals
        bound = local.get("clip_value" if name == "clip_grad_value_" else "max_norm")
        if isinstance(bound, torch.Tensor) and bound.numel() == 1:
            bound = float(bound)
        self._open[id(frame)] = len(self.calls)
        self.calls.append({"function": name, "parameters": _describe(local.get("parameters")),
                           "max_norm": float(bound) if isinstance(bound, (int, float)) else math.nan,
                           "measured_norm": math.nan})

    def __enter__(self) -> ClipCalls:
        self._previous = sys.getprofile()
        if self._previous is None and self._codes:
            self.watching = True
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.watching:
            sys.setprofile(None)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.calls, columns=["function", "parameters", "max_norm", "measured_norm"])


@dataclass
class ClipProbe:
    """What the declared clip did on a step whose raw norm exceeds it; ``status`` None when it could not be tested."""

    clip: float
    raw: float = math.nan
    at_step: float = math.nan
    factor: float = 1.0
    calls: pd.DataFrame = field(default_factory=pd.DataFrame)
    watched: bool = False
    status: Status | None = None
    sentence: str = ""
    advice: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, Any]:
        return {"clip_tested": self.status is not None, "clip_raw_norm": self.raw, "clip_norm_at_step": self.at_step,
                "clip_gradient_factor": self.factor, "clip_calls": len(self.calls)}

    def tables(self) -> dict[str, pd.DataFrame]:
        runs = pd.DataFrame([{"gradient_factor": self.factor, "raw_norm": self.raw,
                              "norm_at_optimizer_step": self.at_step, "grad_clip": self.clip}])
        return {"clip": runs, **({"clip_calls": self.calls} if len(self.calls) else {})}


def _one_step(setup: Setup, micro: list, factor: float) -> tuple[float, float, ClipCalls] | None:
    """(raw norm, norm at optimizer.step(), the clip calls) of one step on a fresh copy with every gradient scaled by
    ``factor``; None when the step made no optimizer step."""
    ctx = setup.build(init_scale=1.0)
    quiet_randomness(ctx.model)
    handles = ([p.register_hook(lambda g, f=factor: g * f) for p in ctx.model.parameters() if p.requires_grad]
               if factor != 1.0 else [])
    try:
        with ClipCalls() as calls:
            records, _ = run_steps(setup, ctx, [micro], init_scale=1.0)
    finally:
        for h in handles:
            h.remove()
    stepped = [r for r in records if r.observed_at == OPTIMIZER_STEP]
    if not stepped:
        return None
    return norm_of(stepped[0].pre_clip), stepped[0].grad_norm, calls


def probe_clip(setup: Setup, batch: Any) -> ClipProbe | None:
    """Run the declared clip on a step (on ``batch``) whose raw norm exceeds it and judge what reaches
    ``optimizer.step()``; None without ``grad_clip``."""
    if setup.grad_clip is None:
        return None
    c = float(setup.grad_clip)
    probe = ClipProbe(c)
    with preserved(setup.model):
        micro = setup.split(batch, setup.accumulation_steps)
        seen = _one_step(setup, micro, 1.0)
        if seen is not None and math.isfinite(seen[0]) and 0 < seen[0] <= c * 1.5:
            probe.factor = 4 * c / seen[0]
            seen = _one_step(setup, micro, probe.factor)
    if seen is None:
        probe.sentence = f"the declared grad_clip {c:g} is not checked: the step made no optimizer.step() to read"
        return probe
    probe.raw, probe.at_step, calls = seen
    probe.calls, probe.watched = calls.table(), calls.watching
    if not (math.isfinite(probe.raw) and math.isfinite(probe.at_step)) or probe.raw <= c * (1 + _SLACK):
        probe.sentence = (f"the declared grad_clip {c:g} is not checked: the raw gradient norm ({probe.raw:.3g}) "
                          "never exceeded it")
        return probe
    _judge(probe)
    return probe


def _judge(p: ClipProbe) -> None:
    c, scaled = p.clip, f" (every gradient scaled ×{p.factor:.3g} so the raw norm exceeds it)" if p.factor != 1 else ""
    seen = f"optimizer.step() receives norm {p.at_step:.3g} > grad_clip {c:g} (raw norm {p.raw:.3g}){scaled}"
    if p.at_step <= c * (1 + _SLACK):
        p.status, p.sentence = Status.PASS, (f"the declared grad_clip {c:g} holds: raw gradient norm {p.raw:.3g}, "
                                             f"{p.at_step:.3g} at optimizer.step(){scaled}")
        return
    norm_calls = [r for r in p.calls.itertuples() if r.function == "clip_grad_norm_"]
    empty = next((r for r in norm_calls if r.parameters in ("exhausted generator", "empty")), None)
    blind = next((r for r in norm_calls if r.measured_norm == 0.0), None)
    other = next((r for r in norm_calls if not math.isclose(r.max_norm, c, rel_tol=1e-6)), None)
    p.status = Status.WARN
    if empty is not None:
        what = ("an exhausted generator (a model.parameters() iterated before the call)"
                if empty.parameters.startswith("exhausted") else "an empty list of parameters")
        p.status = Status.FAIL
        p.sentence = f"the declared clip clips nothing: clip_grad_norm_ ran over {what}, so {seen}"
        p.advice = ["Give clip_grad_norm_ the parameters themselves: clip_grad_norm_(model.parameters(), c) at the "
                    "call, or keep params = list(model.parameters()); a generator is empty once anything (an "
                    "optimizer's constructor, a parameter count) has iterated it."]
    elif blind is not None:
        p.status = Status.FAIL
        p.sentence = (f"the declared clip clips nothing: clip_grad_norm_ measured norm 0 (its parameters had no "
                      f"gradient: it runs before backward(), after zero_grad(), or on another model's parameters), "
                      f"so {seen}")
        p.advice = ["Clip after the last backward() and before optimizer.step(), over the parameters the optimizer "
                    "steps (ctx.model.parameters())."]
    elif other is not None:
        p.sentence = f"clip_grad_norm_ ran with max_norm={other.max_norm:g}, not the declared grad_clip {c:g}: {seen}"
        p.advice = ["Clip with the Setup's bound, clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip), or declare "
                    "the bound your loop uses as Setup(grad_clip=...)."]
    elif not norm_calls and len(p.calls) and (p.calls["function"] == "clip_grad_value_").any():
        value = p.calls[p.calls["function"] == "clip_grad_value_"]["max_norm"].iloc[0]
        p.sentence = (f"the step clips by value (clip_grad_value_ at {value:g}), which bounds each entry, not the "
                      f"norm grad_clip={c:g} declares: {seen}")
        p.advice = ["Clip by norm, torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip), or, if "
                    "clipping by value is meant, leave grad_clip out of the Setup (it is a norm bound)."]
    elif p.watched and not len(p.calls):
        p.sentence = f"grad_clip={c:g} is declared, but the step calls no gradient-clipping function: {seen}"
        p.advice = ["Clip in the step, torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip), after "
                    "the last backward() and before optimizer.step(); or drop grad_clip from the Setup if the loop "
                    "is not meant to clip."]
    else:
        p.sentence = f"the declared clip does not hold, cause not isolated: {seen}"
        p.advice = ["Clip once, after the last backward() and before optimizer.step(), over every parameter the "
                    "optimizer steps, and change no gradient after it."]
