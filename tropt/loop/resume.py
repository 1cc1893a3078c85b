"""``loop.resume``: does stop-save-load-continue give exactly the run that never stopped?

Run A trains N steps, saves (``Setup.save_state`` or tropt's full checkpoint), and trains N more. Run B builds
brand-new objects (a different seed, so nothing carries over by accident), loads the saved state and trains the
same N batches. The saved state goes through ``torch.save``/``torch.load`` as a real checkpoint would, so a state
that only holds references to live tensors is caught. Randomness stays on here: RNG restoration is under test.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..core.capture import group_lr, observed_at, run_steps
from ..core.carried_state import CarriedState
from ..core.compare import compare_tensors, flatten_state, max_rel_error
from ..errors import StepError, TroptError
from ..registry import register
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import RngState, preserved
from ..training import StepContext, user_state_is_plain
from ._resume_rng import RNG_ONLY_ADVICE, RngProbe, first_divergence, order_lost, rng_draws, rng_only_kind
from ._resume_state import extra_advice, extra_components, load_extra, save_extra
from ._verdicts import defer_multi_step, nonfinite_result, require_steps, tolerance_for

COMPONENTS = ("model weights", "optimizer moments", "optimizer hyperparameters", "schedule position", "loss scale",
              "RNG", "step attributes", "wrapped optimizer state")
_ADVICE = {
    "model weights": "Restore the weights in load_state: ctx.model.load_state_dict(state['model']).",
    "optimizer moments": "Save and load ctx.optimizer.state_dict() too: it holds the moments (Adam's "
                         "exp_avg/exp_avg_sq, SGD's momentum buffers); without them the run restarts its optimizer "
                         "from zero.",
    "optimizer hyperparameters": "Restore ctx.optimizer.state_dict(), which also holds each group's lr, betas and "
                                 "weight decay.",
    "schedule position": "Save and load ctx.scheduler.state_dict(): without it the schedule (warm-up, decay) restarts "
                         "from step 0.",
    "loss scale": "Save and load ctx.scaler.state_dict(), or the GradScaler restarts from its initial scale.",
    "RNG": "Save torch.get_rng_state() (and torch.cuda.get_rng_state_all(), numpy and random states) and restore "
           "them on load, or dropout masks and data shuffling diverge after a resume.",
    "step attributes": "Save the state your step keeps on ctx (an iteration counter such as ctx.it, a recurrent hidden "
                       "state) in save_state and set it again in load_state.",
    "wrapped optimizer state": "ctx.optimizer wraps another optimizer whose state its own state_dict() leaves out "
                               "(SAM's base_optimizer keeps the momentum: davda54/sam#73): save and load that "
                               "optimizer's state_dict() too, e.g. state['base'] = "
                               "ctx.optimizer.base_optimizer.state_dict().",
}


def _plain_attrs(ctx: StepContext) -> dict[str, Any]:
    """The step's own attributes on ctx that are plain data a checkpoint can hold (counters, hidden states)."""
    return {k: v for k, v in ctx.user_state().items() if user_state_is_plain(v)}


def _leaves_kept(ctx: StepContext, attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` with each trainable tensor the step keeps on ctx (a learnable temperature with its own optimizer)
    saved as what it is, a leaf that requires grad (a Parameter stays one), not as a detached copy."""
    out = dict(attrs)
    for name, live in ctx._user_attrs().items():
        if isinstance(live, torch.Tensor) and live.is_leaf and live.requires_grad:
            copy_ = live.detach().clone()
            out[name] = nn.Parameter(copy_) if isinstance(live, nn.Parameter) else copy_.requires_grad_(True)
    return out


def default_save_state(ctx: StepContext, step: Any = None,
                       templates: dict[str, torch.nn.Module] | None = None) -> dict[str, Any]:
    """tropt's full checkpoint: model, every optimizer and scheduler, scaler, every RNG state, the objects the step
    keeps on ctx (an EMA model) and the state it carries outside ctx's fields (``model.hidden``, a closure variable of
    ``step``)."""
    return {
        "extra": save_extra(ctx, step, templates),
        "model": ctx.model.state_dict(),
        "optimizer": ctx.optimizer.state_dict() if ctx.optimizer is not None else None,
        "step_attributes": _leaves_kept(ctx, _plain_attrs(ctx)),
        "scheduler": ctx.scheduler.state_dict() if ctx.scheduler is not None else None,
        "scaler": ctx.scaler.state_dict() if ctx.scaler is not None else None,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }


def default_load_state(ctx: StepContext, state: dict[str, Any], step: Any = None,
                       templates: dict[str, torch.nn.Module] | None = None) -> None:
    """Load a checkpoint written by :func:`default_save_state` into fresh objects (``templates``: the modules kept
    on ctx that the fresh context has not built yet, as :func:`default_save_state` copied them)."""
    ctx.model.load_state_dict(state["model"])
    for name, value in state.get("step_attributes", {}).items():
        setattr(ctx, name, value)
    load_extra(ctx, state.get("extra", {}), step, templates)
    if ctx.optimizer is not None and state["optimizer"] is not None:
        ctx.optimizer.load_state_dict(state["optimizer"])
    if ctx.scheduler is not None and state["scheduler"] is not None:
        ctx.scheduler.load_state_dict(state["scheduler"])
    if ctx.scaler is not None and state["scaler"] is not None:
        ctx.scaler.load_state_dict(state["scaler"])
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])


def _state_of(ctx: StepContext, rng: RngState, carried: CarriedState) -> dict[str, dict[str, torch.Tensor]]:
    """Every resumable component of a run as flat tensors (views of the live state; copies for the extra ones:
    :func:`tropt.loop._resume_state.extra_components`), for comparison."""
    opt = ctx.optimizer.state_dict() if ctx.optimizer is not None else {"state": {}, "param_groups": []}
    if not (isinstance(opt, dict) and "state" in opt and "param_groups" in opt):
        opt = {"state": opt, "param_groups": []}  # a wrapper's own format (Lookahead's): all of it compared as state
    return {
        "model weights": flatten_state(ctx.model.state_dict()),
        "optimizer moments": flatten_state(opt["state"]),
        "optimizer hyperparameters": flatten_state([{k: v for k, v in g.items() if k != "params"}
                                                    for g in opt["param_groups"]]),
        "schedule position": flatten_state(ctx.scheduler.state_dict()) if ctx.scheduler is not None else {},
        "loss scale": flatten_state(ctx.scaler.state_dict()) if ctx.scaler is not None else {},
        "RNG": {
            "torch": rng.torch_cpu.double(),
            "numpy": torch.from_numpy(rng.numpy[1].astype(np.float64)),
            "numpy_pos": torch.tensor(float(rng.numpy[2]), dtype=torch.float64),
            "python": torch.tensor(rng.python[1], dtype=torch.float64),
            **({f"cuda{i}": t.double() for i, t in enumerate(rng.cuda)} if rng.cuda else {}),
        },
        "step attributes": flatten_state(_plain_attrs(ctx)),
        "wrapped optimizer state": _wrapped_state(ctx.optimizer),
        **extra_components(ctx, carried),
    }


def _wrapped_state(optimizer: Any) -> dict[str, torch.Tensor]:
    """The state of the optimizers ``optimizer`` wraps (SAM's ``base_optimizer``), by attribute name: a wrapper's
    state_dict may leave it out. (When it holds it, a resume restores both alike.)"""
    if optimizer is None:
        return {}
    out = {}
    for name, value in vars(optimizer).items():
        if isinstance(value, torch.optim.Optimizer) and value is not optimizer:
            inner_state = value.state_dict()
            inner_state = inner_state.get("state", inner_state) if isinstance(inner_state, dict) else inner_state
            out.update({f"{name}.{k}": v for k, v in flatten_state(inner_state).items()})
    return out


def _position(ctx: StepContext) -> float | None:
    """The scheduler's position (``last_epoch``), when it reports one."""
    pos = getattr(ctx.scheduler, "last_epoch", None)
    return float(pos) if isinstance(pos, (int, float)) else None


def _call_user(fn: Callable, who: str, *args: Any) -> Any:
    try:
        return fn(*args)
    except TroptError:
        raise
    except Exception as exc:
        raise StepError(f"{who} raised {type(exc).__name__}: {exc}",
                        f"fix {who}; it is called as {who}(ctx{', state' if len(args) > 1 else ''})") from exc


def _through_disk(state: Any) -> tuple[Any, bytes]:
    """What a checkpoint file would give back: torch.save then torch.load (so live references are cut), and the
    file's bytes."""
    buf = io.BytesIO()
    try:
        torch.save(state, buf)
    except Exception as exc:
        raise StepError(f"save_state returned something torch.save cannot write ({type(exc).__name__}: {exc})",
                        "return plain containers of tensors and numbers, e.g. state_dict()s") from exc
    buf.seek(0)
    return torch.load(buf, weights_only=False), buf.getvalue()


def _rng_probe(setup: Setup, load: Callable, state_file: bytes, initial: CarriedState, rng_save: RngState,
               batches: list, final_a: dict, final_b: dict, loaded: dict[str, float],
               tol: float) -> tuple[RngProbe | None, list]:
    """Resume once more from the same checkpoint, now with the straight run's RNG streams at the save point: the
    RNG alone explains the divergence when this run matches the straight one, and matters at all when it differs
    from the resumed one (a step without randomness changes nothing). None when the RNG was restored or nothing
    diverged."""
    compared = [c for c in loaded if c != "RNG" and c in final_a]
    if loaded["RNG"] <= 0 or all(max_rel_error(final_a[c], final_b.get(c, {})) <= tol for c in compared):
        return None, []
    ctx_c = setup.build(seed=setup.seed + 1)
    initial.restore(prefix="step.")
    _call_user(load, "load_state", ctx_c, torch.load(io.BytesIO(state_file), weights_only=False))
    loaded_c = CarriedState.take(ctx_c, setup.step)
    rng_save.restore()
    loaded_c.restore(prefix="step.")
    _, calls_c = run_steps(setup, ctx_c, batches, capture="lr")
    final_c = _state_of(ctx_c, RngState.take(), CarriedState.take(ctx_c, setup.step))
    fixed = {c: max_rel_error(final_a[c], final_c.get(c, {})) for c in compared}
    changed = {c: max_rel_error(final_b.get(c, {}), final_c.get(c, {})) for c in compared}
    return RngProbe(fixes=all(e <= tol for e in fixed.values()), matters=any(e > tol for e in changed.values()),
                    param_error=fixed.get("model weights", 0.0), floor=changed.get("model weights", 0.0)), calls_c


@register(
    "loop.resume",
    title="Exact resume",
    description="N steps, save, fresh objects, load, N steps equals 2N steps straight",
    budgets={'thorough': {'steps': 2}},
    plot="tropt.plots.loop",
)
def check_resume(setup: Setup, *, steps: int = 1, tol: float | None = None, progress: bool = True) -> CheckResult:
    """FAIL when stopping, saving and resuming changes training; names what diverged first.

    Uses ``setup.save_state``/``setup.load_state`` when given, else tropt's full checkpoint
    (:func:`default_save_state`). Compares, right after loading, every component (weights, optimizer moments and
    hyperparameters, schedule position, loss scale, RNG) with the straight run at the save point, and after N more
    steps the parameters and learning rates. Batches are fed by tropt in the same order to both runs.
    """
    if steps < 1:
        raise TroptError(f"check_resume needs steps >= 1 (got {steps})", "use steps=1")
    setup.validate()
    tol = tolerance_for(setup, tol)
    custom = setup.save_state is not None
    templates: dict[str, torch.nn.Module] = {}  # modules the step keeps on ctx (an EMA), rebuilt before loading
    save = setup.save_state or (lambda ctx: default_save_state(ctx, setup.step, templates))
    load = setup.load_state or (lambda ctx, state: default_load_state(ctx, state, setup.step, templates))
    with preserved(setup.model):
        batches = [setup.split(b, setup.accumulation_steps) for b in setup.batches(2 * steps)]
        ctx_a = setup.build()
        # State in the step's closure is shared by both runs: run B starts it as a fresh process would.
        initial = CarriedState.take(ctx_a, setup.step)
        _, calls = run_steps(setup, ctx_a, batches[:steps], capture="lr")
        require_steps(setup, calls, f"the first {steps} step(s)")
        saved_a = CarriedState.take(ctx_a, setup.step)
        state = _call_user(save, "save_state", ctx_a)
        if state is None and custom:
            raise StepError("save_state returned None, so there is nothing to resume from",
                            "return the state to save (a dict of state_dicts)")
        state, state_file = _through_disk(state)
        # Leftover gradients are in no checkpoint; clearing them isolates what the checkpoint covers
        # (leaking gradients are loop.zero_grad's finding, not this check's).
        for p in ctx_a.model.parameters():
            p.grad = None
        rng_a = rng_save = RngState.take()
        ctx_b = setup.build(seed=setup.seed + 1)
        initial.restore(prefix="step.")
        _call_user(load, "load_state", ctx_b, state)
        rng_b = RngState.take()
        loaded_b = CarriedState.take(ctx_b, setup.step)
        # Compare right after loading, while run A still stands at the save point: no copies needed.
        at_load_a, at_load_b = _state_of(ctx_a, rng_a, saved_a), _state_of(ctx_b, rng_b, loaded_b)
        loaded = {c: max_rel_error(x, at_load_b.get(c, {})) for c, x in at_load_a.items()}
        # An object the step builds lazily on ctx (absent from the fresh run until its first step) is judged after
        # the continuation instead.
        later = [c for c in at_load_a if c.startswith("ctx.") and c not in at_load_b]
        # The RNGs are global: give each continuation the state its own run would have (and its closure state).
        rng_a.restore()
        saved_a.restore(prefix="step.")
        rec_a, calls_a = run_steps(setup, ctx_a, batches[steps:], capture="lr")
        rng_a, end_carried_a = RngState.take(), CarriedState.take(ctx_a, setup.step)
        rng_b.restore()
        loaded_b.restore(prefix="step.")
        rec_b, calls_b = run_steps(setup, ctx_b, batches[steps:], capture="lr")
        final_a = _state_of(ctx_a, rng_a, end_carried_a)
        final_b = _state_of(ctx_b, RngState.take(), CarriedState.take(ctx_b, setup.step))
        loaded.update({c: max_rel_error(final_a[c], final_b.get(c, {})) for c in later if c in final_a})
        # tropt's own checkpoint cannot rebuild a wrapper of the live objects (accelerate's AcceleratedOptimizer):
        # what the step rebuilds then is not the user's finding.
        skipped = [] if custom else [c for c in later if c not in templates]
        for c in skipped:
            loaded.pop(c, None)
        # The RNG not restored and the runs diverge: does restoring it alone explain the divergence?
        probe, calls_c = _rng_probe(setup, load, state_file, initial, rng_save, batches[steps:], final_a, final_b,
                                    loaded, tol)
        # Where each schedule stands after the continuation: the learning rate the next step would use, and position.
        end_a = (_lrs(ctx_a), _position(ctx_a))
        end_b = (_lrs(ctx_b), _position(ctx_b))
    # Parameters that went non-finite compare NaN with NaN: that is the finding, never a reproduced run.
    bad = nonfinite_result("loop.resume", {"straight": (2 * steps, final_a["model weights"]),
                                           "resumed": (2 * steps, final_b["model weights"])}, what="parameters")
    if bad is not None:
        return bad
    result = _resume_verdict(setup, steps, tol, custom, loaded, final_a, final_b, rec_a, rec_b, end_a, end_b, probe)
    if skipped:
        result.metrics["not_compared"] = (f"{', '.join(skipped)}: built by the step on ctx and not rebuilt by "
                                          "tropt's checkpoint (a wrapper of the live training objects)")
    return defer_multi_step(result, calls + calls_a + calls_b + calls_c)


def _lrs(ctx: StepContext) -> list[float]:
    """Each group's learning rate (NaN for a hand-written update without an optimizer)."""
    opt = ctx.optimizer
    return [group_lr(opt, g) for g in opt.param_groups] if opt is not None else [float("nan")]


def _component_rows(tol: float, loaded: dict, final_a: dict, final_b: dict) -> list[dict]:
    """One row per component: the fixed ones, then the extra ones (``optimizers[1]``, ``ctx.ema``, ``model.hidden``)
    in the order the straight run holds them."""
    rows = []
    for comp in [*COMPONENTS, *(c for c in loaded if c not in COMPONENTS)]:
        final = max_rel_error(final_a.get(comp, {}), final_b.get(comp, {}))
        limit = 0.0 if comp == "RNG" else tol
        rows.append({"component": comp, "after_load_rel_error": loaded[comp], "final_rel_error": final,
                     "restored": loaded[comp] <= limit, "matches_at_end": final <= limit})
    return rows


def _resume_verdict(setup: Setup, steps: int, tol: float, custom: bool, loaded: dict, final_a: dict, final_b: dict,
                    rec_a: list, rec_b: list, end_a: tuple, end_b: tuple, probe: RngProbe | None) -> CheckResult:
    rows = _component_rows(tol, loaded, final_a, final_b)
    components = pd.DataFrame(rows)
    params = compare_tensors(final_a["model weights"], final_b["model weights"], labels=("straight", "resumed"))
    lr_a = np.array([r.lrs[0] if r.lrs else np.nan for r in rec_a])
    lr_b = np.array([r.lrs[0] if r.lrs else np.nan for r in rec_b])
    final_err = float(params["rel_error"].max()) if len(params) else 0.0
    lost = order_lost([r["component"] for r in rows if not r["restored"]], probe)
    metrics = {"steps_before_save": steps, "steps_after_load": steps,
               "checkpoint": "user save_state/load_state" if custom else "tropt full checkpoint",
               "final_param_max_rel_error": final_err, "tolerance": tol, "not_restored": ", ".join(lost) or "none",
               "observed_at": observed_at(rec_a + rec_b),
               # How exact the comparison is: 0.0 when both runs draw from the same RNG streams (restored, or nothing
               # random reached training); else the same resume on the straight run's streams against this one.
               "noise_floor": probe.floor if probe is not None else 0.0}
    if probe is not None:
        metrics["with_rng_restored_param_max_rel_error"] = probe.param_error
        metrics["rng_reaches_training"] = probe.matters
    tables = {"components": components, "parameters": params}
    series = {"lr_straight": lr_a, "lr_resumed": lr_b}
    lr_same = len(lr_a) == len(lr_b) and np.allclose(lr_a, lr_b, rtol=1e-6, equal_nan=True)
    if final_err <= tol and lr_same and not lost:
        return CheckResult("loop.resume", Status.PASS,
                           f"resuming after {steps} step(s) reproduces the straight run (parameter error "
                           f"{final_err:.1e}; every component restored)",
                           metrics, tables, series=series)
    rng_only = rng_only_kind(setup, lost, probe)
    if rng_only is not None and final_err > tol:
        return _rng_only_result(rng_only, steps, final_err, probe, metrics, tables, series, rng_draws(setup))
    advice = [_ADVICE.get(c) or extra_advice(c) for c in lost] or [
        "Something outside the checkpoint carries state: a module attribute that is not in state_dict(), or state "
        "kept by loss_fn or the step function. Save it too."]
    metrics.update(lr_after_straight=end_a[0][0], lr_after_resumed=end_b[0][0])
    if end_a[1] is not None and end_b[1] is not None:
        metrics.update(schedule_position_straight=end_a[1], schedule_position_resumed=end_b[1])
    position_lost = ("schedule position" in lost
                     and not components.set_index("component").loc["schedule position", "matches_at_end"])
    schedule_differs = position_lost or not np.allclose(end_a[0], end_b[0], rtol=1e-6, equal_nan=True)
    if final_err <= tol and lr_same and schedule_differs:
        # The updates so far agree, but the two schedules now stand at different places: every later step diverges.
        where = (f"position {end_a[1]:g} vs {end_b[1]:g}, " if end_a[1] is not None and end_b[1] is not None else "")
        return CheckResult("loop.resume", Status.FAIL,
                           f"resuming changes the schedule: after {steps} more step(s) the resumed run's schedule "
                           f"differs from the straight run's (straight vs resumed: {where}next learning rate "
                           f"{end_a[0][0]:.3g} vs {end_b[0][0]:.3g}); first divergence: "
                           f"{_first(lost, probe) if lost else 'schedule position'}",
                           metrics, tables, advice, series)
    diverged = [r for r in rows if r["component"] not in COMPONENTS and not r["restored"] and not r["matches_at_end"]]
    if final_err <= tol and lr_same and diverged:
        # The parameters agree, but state the run keeps beside them (an EMA model: what gets evaluated) does not.
        return CheckResult("loop.resume", Status.FAIL,
                           f"resuming changes {diverged[0]['component']}: after {steps} more step(s) it differs from "
                           f"the straight run's by {diverged[0]['final_rel_error']:.1%} (max relative error) while the "
                           f"parameters match; first divergence: {_first(lost, probe)}",
                           metrics, tables, advice, series)
    if final_err <= tol and lr_same:
        return CheckResult("loop.resume", Status.WARN,
                           f"the resumed run matches here, but {', '.join(lost)} "
                           f"{'is' if len(lost) == 1 else 'are'} not restored and would make longer runs diverge",
                           metrics, tables, advice, series)
    return CheckResult("loop.resume", Status.FAIL,
                       f"resuming changes training (parameter error {final_err:.1e} after {steps} step(s)); first "
                       f"divergence: {_first(lost, probe)}",
                       metrics, tables, advice, series)


def _first(lost: list[str], probe: RngProbe | None) -> str:
    """``X (also not restored: Y, Z)``: the component that explains the divergence first."""
    first, others = first_divergence(lost, probe)
    return first + (f" (also not restored: {', '.join(others)})" if others else "")


def _rng_only_result(kind: str, steps: int, final_err: float, probe: RngProbe | None, metrics: dict, tables: dict,
                     series: dict, draws: str = "the step's own random draws differ after the resume") -> CheckResult:
    """Only the RNG streams are lost, and restoring them alone reproduces the straight run. A WARN when what they
    change is only randomness drawn while training (noise, dropout masks: the same run in expectation), a FAIL when
    a shuffling DataLoader draws from them too (the data order changes)."""
    with_rng = f"with the straight run's RNG streams the resumed run matches it (parameter error " \
               f"{probe.param_error:.1e})" if probe is not None else ""
    if kind == "warn":
        return CheckResult("loop.resume", Status.WARN,
                           f"resume is exact except for the RNG streams: not bit-exact ({draws}: parameter error "
                           f"{final_err:.1e} after {steps} step(s); {with_rng}); save torch/numpy/python RNG states "
                           "for bit-exact resume",
                           metrics, tables, [RNG_ONLY_ADVICE], series)
    also = ("; the data order also draws from the global RNG (the DataLoader's sampler has no generator of its own): "
            "a resume without it changes which samples come next" if kind == "data order" else "")
    return CheckResult("loop.resume", Status.FAIL,
                       f"resuming changes training (parameter error {final_err:.1e} after {steps} step(s)); first "
                       f"divergence: RNG ({with_rng}){also}",
                       metrics, tables, [_ADVICE["RNG"]], series)
