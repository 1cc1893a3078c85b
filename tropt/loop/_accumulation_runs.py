"""The runs of ``loop.accumulation``: one batch of the Setup, its splits, and each run on a fresh seeded copy.

A run may draw from another RNG stream (:func:`tropt.core.noise_floor.reseed`: the noise floor and the repeats of a
stochastic step) and may be spied on (:func:`._stochastic.spied`: what makes the step random). Runs of the whole batch
are cached by (split, freeze, stream), so measuring the floor costs one extra run only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pandas as pd

from ..core.capture import inner_loop, run_steps
from ..core.compare import compare_tensors, max_rel_error
from ..core.modes import batch_dependent_layers, quiet_randomness
from ..core.noise_floor import reseed
from ..errors import StepError, TroptError
from ..result import CheckResult, Status
from ..setup import Setup
from ..snapshot import preserved
from ._batch_dependence import Freeze, forward_updated_buffers, freeze_batch_dependence
from ._invariance_common import STANDARD_STEP_ADVICE, norm_of
from ._stochastic import QuietFunctionalDropout, ctx_objects, spied
from ._verdicts import nonfinite_result, require_steps, tolerance_for
from .accumulation_causes import Run


@dataclass
class Pair:
    """A 1-micro-batch run and a K-micro-batch run, compared at ``optimizer.step()`` and before clipping."""

    a: Run
    b: Run
    table: pd.DataFrame
    err: float
    pre_err: float


@dataclass
class Plan:
    """One batch of the Setup and its splits: the whole, an equal split into K and an unequal one."""

    setup: Setup
    k: int
    tol: float
    close: float  # how near a hypothesis must come to be named the cause
    batch: object
    n: int
    n_even: int
    even_batch: object
    uneven_sizes: list[int]
    uneven_micro: list
    bn_layers: list[str]
    cache: dict = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # what makes the step stochastic (from the floor's rerun)
    _buffers: list[tuple[str, str]] | None = None

    @classmethod
    def make(cls, setup: Setup, k: int | None, tol: float | None) -> Plan:
        setup.validate()
        tol = tolerance_for(setup, tol)
        close = max(10 * tol, 1e-4)
        k = int(k) if k is not None else (setup.accumulation_steps if setup.accumulation_steps > 1 else 4)
        if k < 2:
            raise TroptError(f"check_accumulation needs k >= 2 micro-batches (got {k})", "use k=4")
        with preserved(setup.model):  # reading a shuffling DataLoader draws from the global RNG
            batch = setup.sample_batch()
        n = setup.size(batch)
        if n < 2 * k:
            raise TroptError(f"the first batch holds {n} samples, too few to split into {k} and then uneven "
                             "micro-batches",
                             f"use batches of at least {2 * k} samples for this check (or pass a smaller k)")
        n_even = n - n % k
        even_batch = setup.split(batch, sizes=[n_even, n - n_even])[0] if n_even < n else batch
        # One large micro-batch and K-1 small ones: clearly unequal for every K (a loop that divides by K is off by
        # a lot).
        small = max(1, n // (2 * k))
        uneven_sizes = [n - (k - 1) * small] + [small] * (k - 1)
        return cls(setup, k, tol, close, batch, n, n_even, even_batch, uneven_sizes,
                   setup.split(batch, sizes=uneven_sizes), batch_dependent_layers(setup.model))

    @property
    def fast(self) -> bool:
        """No batch-dependent layer and a batch that splits equally: one uneven run can decide a PASS."""
        return not self.bn_layers and self.n_even == self.n

    @property
    def buffers(self) -> list[tuple[str, str]]:
        """(module, buffer) the training forward updates outside BatchNorm (found once, on the whole batch)."""
        if self._buffers is None:
            self._buffers = forward_updated_buffers(self.setup, self.batch)
        return self._buffers

    @property
    def freeze(self) -> Freeze:
        """What an isolating rerun freezes: BatchNorm, and the modules whose forward updates a buffer."""
        mods = tuple(dict.fromkeys(m for m, _ in self.buffers))
        return mods if mods else True

    def one(self, full: object, freeze: Freeze, stream: int = 0, spy: bool = False) -> Run:
        key = (id(full), freeze, stream)
        if key not in self.cache:
            self.cache[key] = observe(self, [full], 1, freeze=freeze, what="the 1-micro-batch run", stream=stream,
                                      spy=spy)
        return self.cache[key]

    def many(self, micro: list, freeze: Freeze, k: int | None = None, stream: int = 0) -> Run:
        k = self.k if k is None else k
        try:
            return observe(self, micro, k, freeze=freeze, what=f"the {k}-micro-batch run", stream=stream)
        except StepError as exc:
            exc.in_k_run = True  # type: ignore[attr-defined]  # the only run that differs from normal training: check_accumulation may call it latent
            raise

    def compare(self, a: Run, b: Run) -> Pair:
        table = compare_tensors(a.post, b.post, labels=("1x", f"{self.k}x"))
        return Pair(a, b, table, float(table["rel_error"].max()), max_rel_error(a.pre, b.pre))

    def broken(self, a: Run, b: Run, metrics: dict, tables: dict) -> CheckResult | None:
        """Non-finite gradients, or none at all: nothing to compare, and never a PASS."""
        bad = nonfinite_result("loop.accumulation", {"1x": (1, a.post), f"{self.k}x": (1, b.post)})
        if bad is not None:
            return dataclasses.replace(bad, metrics={**metrics, **bad.metrics}, tables={**tables, **bad.tables})
        if norm_of(a.post) > 0 or norm_of(b.post) > 0:  # zero equals zero: a step that clears before stepping "matches"
            return None
        return CheckResult("loop.accumulation", Status.WARN,
                           "cannot check accumulation: no gradient reaches optimizer.step() in either run (every "
                           "gradient is zero or None when the optimizer steps)",
                           {**metrics, "see_also": "loop.zero_grad"}, tables,
                           ["Call optimizer.zero_grad() after optimizer.step() (or before the first backward of the "
                            "next step), never between backward() and step(); then rerun this check.",
                            STANDARD_STEP_ADVICE])


def observe(plan: Plan, micro_batches: list, k: int, *, freeze: Freeze, what: str, stream: int = 0,
            spy: bool = False, steps: int = 1) -> Run:
    """Run the step under test once on a fresh seeded copy (configured for K=k), its own draws from ``stream``, and
    observe its first update (and the state of the objects it keeps on ctx after ``steps`` calls on the same
    micro-batches). ``spy`` names what is random in it."""
    setup = plan.setup
    ctx = setup.build(accumulation_steps=k)
    reseed(setup.seed, stream)
    quiet_randomness(ctx.model)
    freeze_batch_dependence(ctx.model, freeze)
    if spy:
        (records, calls), plan.sources = spied(ctx.model, lambda: run_steps(setup, ctx, [micro_batches] * steps))
    else:
        with QuietFunctionalDropout():
            records, calls = run_steps(setup, ctx, [micro_batches] * steps)
    require_steps(setup, calls, what)
    r = records[0]
    first_call = records[:len(records) // steps]  # every call of this run makes the same updates
    return Run(r.grads, r.pre_clip or r.grads, r.last_backward, calls[0], r.observed_at, ctx_objects(ctx),
               inner_loop(first_call))


def two_steps(plan: Plan, micro: list, freeze: Freeze) -> tuple[Run, Run]:
    """The 1-micro-batch and K-micro-batch runs for two steps on the same batch: an object on ctx updated before
    ``optimizer.step()`` on every micro-batch follows the same parameters K times in step 1 (no difference yet), but
    in step 2 it has seen the first update K times over."""
    return (observe(plan, [plan.even_batch], 1, freeze=freeze, what="the 1-micro-batch run", steps=2),
            observe(plan, micro, plan.k, freeze=freeze, what=f"the {plan.k}-micro-batch run", steps=2))


def steps_per_call_result(calls: int, metrics: dict, tables: dict, inner: bool = False) -> CheckResult:
    """FAIL for a step that runs ``optimizer.step()`` more than once per call even with one micro-batch: every
    update is applied ``calls`` times. Shown without accumulation, so never latent; the other loop checks defer here.

    ``inner``: each repeated step followed a fresh backward pass (an inner loop, as a GAN's n_critic discriminator
    steps): not a repeated update, and a WARN that the one-update-per-call comparison cannot judge it."""
    if inner:
        return CheckResult(
            "loop.accumulation", Status.WARN,
            f"an optimizer steps {calls} times per call of the step function, each time after a fresh backward pass "
            "(an inner loop: n_critic / num_D_steps discriminator steps, epochs over a rollout): not one gradient "
            "applied again; accumulation is compared on one update per call, so it is not judged for this step",
            {**metrics, "optimizer_steps_per_call": calls, "inner_loop": True, "cause": "inner_loop"}, tables,
            ["To check the accumulation of the inner loop's updates, give tropt a step that makes one of them per "
             "call (its counter on ctx picks which network steps, as the corpus's WGAN-GP port does)."])
    return CheckResult("loop.accumulation", Status.FAIL,
                       f"optimizer.step() ran {calls} times per call of the step function with a single micro-batch "
                       f"(expected once): every update is applied {calls} times",
                       {**metrics, "optimizer_steps_per_call": calls, "cause": "steps_per_call"}, tables,
                       ["Call optimizer.step() (or scaler.step(optimizer)) exactly once per call of step(ctx, "
                        "micro_batches); look for a second call in a helper, a callback or a wrapper.",
                        STANDARD_STEP_ADVICE])
