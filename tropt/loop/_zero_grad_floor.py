"""``loop.zero_grad``'s noise floor (issue 27 §1): is the rerun of step t a valid reference for step t?

Run A (step t as it runs) and run B (the same step rerun from the same snapshot with every gradient cleared) start
from the same RNG state: randomness the step draws from the global generators (a diffusion step's noise and
timesteps, masks, functional dropout) is drawn alike in both, so their comparison stays exact. Two reruns measure
the floor:

- run B again on another RNG stream (:func:`tropt.core.noise_floor.reseed`), spied on: whether the step is stochastic
  at all, and what makes it so (``metrics["noise_floor_other_stream"]``, ``metrics["stochastic"]``);
- only when that differs, run B again from the same snapshot on the same stream: randomness the snapshot does not
  restore (a ``torch.Generator`` the step keeps to itself, GPU atomics) makes this replay differ. That replay floor
  is the comparison's own floor (``metrics["noise_floor"]``). Zero: A against B exactly, as before. Not zero: both
  configurations are repeated R times and judged in expectation (:func:`judge_in_expectation`): the means against
  the spread between repeats, and the leak tested as a prediction, mean(A) = mean(B) + f · leftover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.compare import compare_tensors
from ..core.noise_floor import (
    FIX_ADVICE,
    MORE_REPEATS,
    REPEATS,
    Repeats,
    floor_between,
    floor_note,
    in_expectation,
    reseed,
)
from ..result import CheckResult, Status
from ._invariance_common import STANDARD_STEP_ADVICE

CHECK = "loop.zero_grad"
LEAK_FIX = ("Call optimizer.zero_grad(set_to_none=True) once per optimizer step: right after optimizer.step() "
            "(or before the first backward of the next step).")
_REPEAT_STREAMS = 100  # repeat s of either configuration draws from stream 100 + s (streams 0 and 1 are the floor's)


def merged(records: list) -> dict[str, torch.Tensor | None]:
    """The gradients of every update of a run in one dict, keyed ``"<update index>/<parameter>"``."""
    return {f"{i}/{n}": g for i, r in enumerate(records) for n, g in r.grads.items()}


def private_generators(setup: Any, ctx: Any) -> list[str]:
    """``torch.Generator`` objects the step or the loss draws from outside the global RNGs (closure variables,
    module globals they name, attributes on ctx): no snapshot restores them, so each rerun draws other numbers."""
    found = []
    for who, fn in (("step", getattr(setup, "step", None)), ("loss_fn", getattr(setup, "loss_fn", None))):
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        cells = dict(zip(code.co_freevars, (_contents(c) for c in (getattr(fn, "__closure__", None) or ()))))
        named = {n: getattr(fn, "__globals__", {}).get(n) for n in code.co_names}
        found += [f"{who} draws from its own torch.Generator {n!r}" for n, v in {**named, **cells}.items()
                  if isinstance(v, torch.Generator)]
    found += [f"the step draws from its own torch.Generator ctx.{n}" for n, v in ctx.user_state().items()
              if isinstance(v, torch.Generator)]
    return [f"{x} (no snapshot restores it)" for x in found]


def _contents(cell: Any) -> Any:
    """A closure cell's value, None for a cell not yet assigned."""
    try:
        return cell.cell_contents
    except ValueError:
        return None


def records_floor(a: list, b: list) -> float:
    """The relative difference of two runs' updates, as one vector (1.0 when they made a different number)."""
    return floor_between(merged(a), merged(b)) if len(a) == len(b) else 1.0


class Rerun:
    """Step t again from one snapshot (:class:`tropt.core.capture.TrainingState`: every optimizer, its scheduler, the
    RNGs and the carried state), with the gradients left over before step t kept (run A's configuration) or cleared
    (run B's), on an RNG stream when given; spied on when asked, naming what in it is random (``sources``)."""

    def __init__(self, setup: Any, ctx: Any, state: Any, micro_batches: list) -> None:
        self.setup, self.ctx, self.state, self.micro_batches = setup, ctx, state, micro_batches
        self.kept = {n: None if p.grad is None else p.grad.detach().clone() for n, p in ctx.model.named_parameters()}
        self.sources: list[str] = []

    def __call__(self, keep: bool = False, stream: int | None = None, spy: bool = False) -> list:
        from ..core.capture import run_steps
        from ._stochastic import spied

        self.state.restore()
        for n, p in self.ctx.model.named_parameters():
            g = self.kept[n] if keep else None
            p.grad = None if g is None else g.clone()
        if stream is not None:
            reseed(self.setup.seed, stream)
        if not spy:
            return run_steps(self.setup, self.ctx, [self.micro_batches])[0]
        (records, _), found = spied(self.ctx.model, lambda: run_steps(self.setup, self.ctx, [self.micro_batches]))
        self.sources.extend(found + private_generators(self.setup, self.ctx))
        return records


@dataclass(frozen=True)
class Floor:
    """The two reruns' differences from run B, and what makes the step random."""

    stream: float  # run B on another RNG stream
    replay: float  # run B replayed on its own stream (0.0 when the stream rerun already matched)
    sources: list[str]
    in_expectation: bool  # randomness no snapshot restores: judge by repeats

    def metrics(self, tol: float) -> dict[str, Any]:
        out: dict[str, Any] = {"noise_floor": self.replay}
        if self.replay > tol and not self.in_expectation:
            out["rerun_reproducible"] = False  # step t rerun from the same snapshot differs from itself
        if self.stream > tol and not self.in_expectation:
            # Stochastic, but every draw comes from the RNG state both runs start from: compared exactly.
            out.update(noise_floor_other_stream=self.stream, stochastic="; ".join(self.sources),
                       judged="exactly: both runs draw the same numbers (the RNG state is restored)")
        return out


def measure_floor(rerun: Rerun, rec_b: list, tol: float) -> Floor:
    """Run B on another RNG stream (is the step stochastic, and why), then, when it is, run B replayed on its own
    stream (is the rerun exact: randomness outside the snapshot makes it differ).

    Judged in expectation only for randomness the snapshot cannot restore (a generator the step keeps to itself, GPU
    atomics): a replay that differs for another reason starts from state outside the snapshot, which drifts from
    rerun to rerun, and repeats would only average that drift; it is judged exactly, as before."""
    stream = records_floor(rec_b, rerun(stream=1, spy=True))
    replay = records_floor(rec_b, rerun()) if stream > tol else 0.0
    outside = (any("torch.Generator" in x for x in rerun.sources)
               or torch.device(rerun.setup.device).type != "cpu")
    return Floor(stream, replay, rerun.sources, replay > tol and outside)


def judge_in_expectation(t: int, tol: float, run: Callable[[bool, int], list], leftover: dict, fl: Floor,
                         by_hand: bool) -> CheckResult:
    """The verdict when the rerun of step t is not exact (its replay floor exceeds ``tol``).

    ``run(keep_leftover, stream)`` reruns step t from the snapshot with the leftover gradients kept (run A's
    configuration) or cleared (run B's), on ``stream``, and returns its records. R repeats of each (24 when the
    first 8 leave it near the limit) are compared by their means against the spread between repeats; a difference
    outside it is named a leak only when mean(A) - mean(B) is f times the leftover gradient (f > 0; f < 0 for a
    hand-written update) within that spread, else it is "cause not isolated" (a WARN)."""
    from ._stochastic import nondeterministic_kernels

    what = "update (parameter change)" if by_hand else "gradient"
    floor, stream_floor, sources = fl.replay, fl.stream, nondeterministic_kernels(fl.sources)
    r = REPEATS
    while True:
        runs_a = [merged(run(True, _REPEAT_STREAMS + s)) for s in range(r)]
        runs_b = [merged(run(False, _REPEAT_STREAMS + s)) for s in range(r)]
        ra, rb = Repeats.of(runs_a), Repeats.of(runs_b)
        e = in_expectation(rb, ra)
        if not e.ambiguous or r >= MORE_REPEATS:
            break
        r = MORE_REPEATS
    metrics: dict[str, Any] = {
        "t": t, "tolerance": tol, "noise_floor": floor, "noise_floor_other_stream": stream_floor,
        "stochastic": "; ".join(sources), "judged": "in expectation", "repeats": r,
        "expectation_rel_diff": e.rel_diff, "expectation_z": e.z, "max_rel_error": e.rel_diff}
    mean_a = {n: torch.stack([torch.as_tensor(x[n]).double() for x in runs_a if x.get(n) is not None]).mean(0)
              for n in ra.names}
    mean_b = {n: torch.stack([torch.as_tensor(x[n]).double() for x in runs_b if x.get(n) is not None]).mean(0)
              for n in rb.names}
    tables = {"parameters": compare_tensors(mean_a, mean_b, labels=("step_t_mean", "fresh_mean"))}
    if e.inside:
        return CheckResult(CHECK, Status.PASS, f"step {t}'s {what} equals a fresh one in expectation: "
                           + floor_note(floor, e, sources), metrics, tables)
    left = {n: _leftover_of(n, leftover, runs_a + runs_b) for n in ra.names}
    lvec = torch.cat([left[n].reshape(-1) for n in ra.names]) if ra.names else torch.zeros(0, dtype=torch.float64)
    ll = float(lvec @ lvec)
    f = float((ra.mean - rb.mean) @ lvec) / ll if ll > 0 else float("nan")
    metrics["leftover_factor"] = f
    leak = False
    if f == f and (f < 0 if by_hand else f > 0):
        shifted = Repeats.of([{n: torch.as_tensor(x[n]).double() - f * left[n] for n in ra.names
                               if x.get(n) is not None} for x in runs_a])
        leak = in_expectation(rb, shifted).inside
    metrics["leak_equals_leftover_gradient"] = leak
    how = f"{e.rel_diff:.1%} between the means of {r} repeats, {e.z:.1f} standard errors (noise floor {floor:.1%})"
    if leak:
        times = "" if abs(f - 1.0) <= 0.1 else f" times {f:.3g}"
        return CheckResult(CHECK, Status.FAIL,
                           f"step {t}'s {what} differs from a fresh one in expectation by {how}: it equals the fresh "
                           f"{what} plus the gradient left over from step {t - 1}{times}",
                           metrics, tables, [LEAK_FIX, STANDARD_STEP_ADVICE, FIX_ADVICE])
    return CheckResult(CHECK, Status.WARN,
                       f"step {t}'s {what} differs from a fresh one in expectation by {how}; cause not isolated: the "
                       f"difference is not the gradient left over from step {t - 1}",
                       {**metrics, "cause": "not_isolated"}, tables,
                       ["Rerunning the same step from the same state with gradients cleared changed it, but not by "
                        "the leftover gradient: look for state the step carries outside ctx and keep it on ctx.",
                        FIX_ADVICE, STANDARD_STEP_ADVICE])


def _leftover_of(key: str, leftover: dict, runs: list[dict]) -> torch.Tensor:
    """The leftover gradient of the parameter behind ``key`` ("<update>/<name>"), zeros where there is none."""
    name = key.split("/", 1)[1]
    like = next(torch.as_tensor(x[key]) for x in runs if x.get(key) is not None)
    g = leftover.get(name)
    return (g.double().reshape(like.shape) if g is not None and g.numel() == like.numel()
            else torch.zeros(like.shape, dtype=torch.float64))
