"""The step's own noise floor, measured before two configurations are compared (issue 27 §1).

Many healthy steps are not deterministic functions of the batch: diffusion training draws noise and timesteps per
sample, masked autoencoders and stochastic depth draw masks, functional dropout ignores ``nn.Dropout``'s switch, and
some GPU kernels use atomics. Then K=1 against K=4 (or one process against two) differs for reasons that are no bug.

The floor is measured by running the same configuration again with only the step's own randomness changed: another
RNG *stream* (torch, CUDA, numpy and python ``random`` reseeded after the fresh copy is built, so the model, the
optimizer and the batch are the same). Zero floor: compare exactly, as before. A non-zero floor: judge in
expectation, the means of R repeats of each configuration against the spread between repeats
(:func:`in_expectation`, :func:`scale_fit`): a scale bug (a missing ``/K``, a doubled loss) is far outside that spread
and still fails with its cause, a difference inside it is a PASS with a note giving the floor. The user's RNG state
is restored afterwards (:func:`streams_restored`).

Users: ``loop.accumulation`` and ``loop.ddp`` (K=1 against K micro-batches, one process against N), ``loop.zero_grad``
(a rerun from one snapshot: exact while the snapshot restores the step's randomness, in expectation otherwise),
``loop.resume`` (the resume on the straight run's streams against the one without them) and ``model.gradient_flow``
(the model's initialisation against PyTorch's default, paired on two streams): each reports ``metrics["noise_floor"]``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

from .compare import global_rel_error

T = TypeVar("T")

# How far (in standard errors) a fitted factor may lie from its prediction. Whether two means are "inside the spread
# between repeats" uses the noise's effective dimensions instead (z_limit): a high-dimensional difference of means
# concentrates near its standard error, so its limit is tighter than a one-dimensional one.
Z_INSIDE = 3.3
REPEATS = 8  # repeats per configuration when the floor is not zero
MORE_REPEATS = 24  # when the first R leave the verdict in the ambiguous band
_STREAM_STRIDE = 7919  # a prime: stream s of seed n is seed n + 7919 s

FIX_ADVICE = ("To make this check exact, draw the step's per-sample randomness from the batch (noise and timesteps "
              "stored with each sample, or derived from its index) or from a per-sample torch.Generator seeded from "
              "the sample's index: then K micro-batches (or N processes) draw the same numbers as one batch.")


def reseed(seed: int, stream: int) -> None:
    """Seed torch (CPU and CUDA), numpy's and python's global RNGs for ``stream`` of ``seed``.

    Stream 0 is the seed itself (what ``Setup.build`` already gives torch); every other stream is a different one.
    Call it after building the fresh copy, right before running the step: only the step's own draws change.
    """
    s = int(seed) + _STREAM_STRIDE * int(stream)
    torch.manual_seed(s)
    np.random.seed(s % 2**32)
    random.seed(s)


@contextmanager
def streams_restored() -> Iterator[None]:
    """Context manager: whatever the block reseeds, the caller's RNG states (torch, CUDA, numpy, python) come back."""
    from ..snapshot import RngState

    state = RngState.take()
    try:
        yield
    finally:
        state.restore()


def rng_advanced(run: Callable[[], T]) -> tuple[T, list[str]]:
    """``run()`` and which global generators it drew from ("torch CPU RNG state advanced", ...)."""
    from ..snapshot import RngState

    before = RngState.take()
    out = run()
    return out, before.diff(RngState.take())


def floor_between(a: Mapping[str, torch.Tensor | None], b: Mapping[str, torch.Tensor | None]) -> float:
    """The noise floor from two runs of one configuration on different streams: their global relative difference."""
    return float(global_rel_error(a, b))


@dataclass
class Repeats:
    """R runs of one configuration on different streams, as flat vectors over a common list of tensor names."""

    names: list[str]
    runs: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def of(cls, grads: Sequence[Mapping[str, torch.Tensor | None]]) -> Repeats:
        names = sorted({n for g in grads for n, t in g.items() if t is not None})
        sizes = {n: next(torch.as_tensor(g[n]).numel() for g in grads if g.get(n) is not None) for n in names}
        runs = []
        for g in grads:
            runs.append(torch.cat([torch.zeros(sizes[n], dtype=torch.float64) if g.get(n) is None
                                   else torch.as_tensor(g[n]).detach().double().reshape(-1).cpu() for n in names])
                        if names else torch.zeros(0, dtype=torch.float64))
        return cls(names, runs)

    @property
    def r(self) -> int:
        return len(self.runs)

    @property
    def mean(self) -> torch.Tensor:
        return torch.stack(self.runs).mean(0)

    @property
    def spread(self) -> float:
        """The standard deviation of one repeat around the mean, as a norm (0 with fewer than 2 repeats)."""
        if self.r < 2:
            return 0.0
        m = self.mean
        return math.sqrt(sum(float((x - m).pow(2).sum()) for x in self.runs) / (self.r - 1))

    @property
    def se(self) -> float:
        """The standard error of the mean, as a norm."""
        return self.spread / math.sqrt(max(self.r, 1))

    @property
    def floor(self) -> float:
        """The spread relative to the mean's norm: how much one repeat differs from another, relatively."""
        m = float(self.mean.norm())
        return self.spread / m if m > 0 else (0.0 if self.spread == 0 else math.inf)


_LEVEL = 0.999  # a false "outside the spread" on a healthy step once in a thousand comparisons


def effective_dims(*sets: Repeats) -> float:
    """How many independent directions the noise between repeats spans: (tr Σ)² / tr(Σ²) of the pooled centred
    repeats, from their Gram matrix. At most the pooled degrees of freedom (fewer repeats give a lower, safer value)."""
    centred = [x - s.mean for s in sets if s.r > 1 for x in s.runs]
    if len(centred) < 2:
        return 1.0
    g = torch.stack(centred) @ torch.stack(centred).T
    lam = torch.linalg.eigvalsh(g).clamp(min=0)
    den = float(lam.pow(2).sum())
    dof = sum(s.r - 1 for s in sets)
    return min(max(float(lam.sum()) ** 2 / den, 1.0), float(dof)) if den > 0 else 1.0


def z_limit(dims: float, dof: int) -> float:
    """How many standard errors the norm of a difference of means may reach by chance: the square root of the
    F(dims, dims·dof) quantile at ``_LEVEL`` (a d-dimensional noise vector's squared norm, its variance estimated
    from ``dof`` repeats)."""
    from scipy import stats

    return math.sqrt(float(stats.f.ppf(_LEVEL, dims, max(dims * dof, 1.0))))


@dataclass(frozen=True)
class Expectation:
    """Two configurations compared in expectation: the difference of their means against its standard error."""

    rel_diff: float  # |mean_a - mean_b| / max(|mean_a|, |mean_b|)
    z: float  # |mean_a - mean_b| / its standard error (the spread between repeats)
    repeats: int
    limit: float = Z_INSIDE  # the z reached by chance at most (z_limit)
    dims: float = 1.0  # the noise's effective dimensions
    scale: float = 1.0  # mean_b ≈ scale · mean_a along mean_a (a scale bug shows here first)
    scale_z: float = 0.0  # |scale - 1| in standard errors of the scale

    @property
    def inside(self) -> bool:
        """Inside the spread: as a whole (limit) and along the mean's own direction (Z_INSIDE)."""
        return self.z <= self.limit and self.scale_z <= Z_INSIDE

    @property
    def ambiguous(self) -> bool:
        """Near the limit (either side): more repeats decide. A healthy step sits near z = 1, well below it."""
        return 0.85 * self.limit < self.z < 1.6 * self.limit or 0.7 * Z_INSIDE < self.scale_z < 1.6 * Z_INSIDE


def in_expectation(a: Repeats, b: Repeats) -> Expectation:
    """Compare the means of two configurations' repeats against the spread between repeats: the whole difference,
    and the factor between them along the first one's mean (where a missing /K or a doubled loss lies)."""
    d = float((a.mean - b.mean).norm())
    norm = max(float(a.mean.norm()), float(b.mean.norm()))
    se = math.sqrt(a.se ** 2 + b.se ** 2)
    z = d / se if se > 0 else (0.0 if d == 0 else math.inf)
    dims = effective_dims(a, b)
    fit = scale_fit(b, a)
    scale_z = abs(fit.c - 1) / fit.sigma if fit.sigma > 0 else (0.0 if fit.c == 1 or not math.isfinite(fit.c)
                                                                   else math.inf)
    return Expectation(d / norm if norm > 0 else 0.0, z, min(a.r, b.r), z_limit(dims, a.r + b.r - 2), dims,
                       fit.c, scale_z)


@dataclass(frozen=True)
class Fit:
    """``mean_b ≈ c · mean_ref``: the factor, its standard error, and how far the rest lies outside the spread."""

    c: float
    sigma: float  # standard error of c, from the repeats' own projections on mean_ref
    residual_z: float  # |mean_b - c·mean_ref| in standard errors
    limit: float = Z_INSIDE  # the residual_z reached by chance at most

    @property
    def fits(self) -> bool:
        """Nothing is left outside the spread once the factor is applied."""
        return self.residual_z <= self.limit

    def matches(self, predicted: float) -> bool:
        """The prediction lies within the factor's uncertainty (and the fit leaves nothing outside the spread)."""
        return self.fits and abs(self.c - predicted) <= max(Z_INSIDE * self.sigma, 1e-3 * abs(predicted))

    def excludes(self, predicted: float) -> bool:
        return abs(self.c - predicted) > max(Z_INSIDE * self.sigma, 1e-3 * abs(predicted))


def scale_fit(b: Repeats, ref: Repeats) -> Fit:
    """Fit the mean of ``b`` as c times the mean of ``ref``; c's uncertainty from each repeat's projection."""
    mr = ref.mean
    rr = float(mr.pow(2).sum())
    if rr == 0:
        return Fit(math.nan, math.inf, math.inf)
    unit = mr / math.sqrt(rr)
    # |mean_ref|² overestimates |E ref|² by the noise left in the mean (se²): take it out (bounded), so a healthy
    # factor is not pulled below 1 by the noise of the reference.
    c = float((b.mean * mr).sum()) / max(rr - ref.se ** 2, 0.25 * rr)
    # Projections of single repeats on the reference direction: their spread is the noise along it.
    pb = torch.tensor([float((x * unit).sum()) for x in b.runs], dtype=torch.float64)
    pr = torch.tensor([float((x * unit).sum()) for x in ref.runs], dtype=torch.float64)
    sb = float(pb.std()) / math.sqrt(b.r) if b.r > 1 else 0.0
    sr = float(pr.std()) / math.sqrt(ref.r) if ref.r > 1 else 0.0
    sigma = math.sqrt(sb ** 2 + (c * sr) ** 2) / math.sqrt(rr)
    resid = float((b.mean - c * mr).norm())
    se = math.sqrt(b.se ** 2 + (c * ref.se) ** 2)
    limit = z_limit(effective_dims(b, ref), b.r + ref.r - 2)
    return Fit(c, sigma, resid / se if se > 0 else (0.0 if resid == 0 else math.inf), limit)


def repeat(run: Callable[[int], T], streams: range | list[int]) -> list[T]:
    """``run(stream)`` for each stream, the caller's RNG state restored afterwards."""
    with streams_restored():
        return [run(s) for s in streams]


def floor_note(floor: float, e: Expectation, sources: list[str]) -> str:
    """The sentence a PASS in expectation carries: the floor, the repeats and what makes the step stochastic."""
    why = f" ({'; '.join(sources)})" if sources else ""
    return (f"the step is stochastic{why}: two runs of one configuration on different RNG streams differ by "
            f"{floor:.1%} (the noise floor), so it was judged in expectation: the means of {e.repeats} repeats "
            f"differ by {e.rel_diff:.1%}, {e.z:.1f} standard errors, inside the spread between repeats")

