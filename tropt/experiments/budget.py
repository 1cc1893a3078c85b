"""The rules every run of a comparison shares: :class:`Budget`, :class:`EarlyStopping` and :class:`Guardrails`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import TroptError


def _positive(name: str, value: Any, *, integer: bool, owner: str, example: str) -> None:
    """Raise unless ``value`` is None or a positive (integer) number."""
    if value is None:
        return
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
        need = "a positive integer" if integer else "a positive number"
        raise TroptError(f"{owner}: {name}={value!r}; it must be {need} or None", f"e.g. {owner}({example})")


@dataclass(frozen=True)
class Budget:
    """The same budget for every run of a comparison.

    Parameters
    ----------
    steps
        Optimizer steps per run (exact: every run takes exactly this many, unless it fails or stops early).
    samples
        Training samples per run (exact: the last batch is cut so the count is met to the sample). With both
        ``steps`` and ``samples``, a run ends at whichever comes first.
    seconds
        A wall-clock cap per run. It is a cap, not a target: times depend on the machine, so each run reports
        what it used, and a run the cap cut short did not meet its steps/samples budget (``escalate``).
    cost_per_hour
        Price of the machine per hour; every table then shows the cost of each run (seconds / 3600 × this).
    """

    steps: int | None = None
    samples: int | None = None
    seconds: float | None = None
    cost_per_hour: float | None = None

    def __post_init__(self) -> None:
        _positive("steps", self.steps, integer=True, owner="Budget", example="steps=300")
        _positive("samples", self.samples, integer=True, owner="Budget", example="samples=20_000")
        _positive("seconds", self.seconds, integer=False, owner="Budget", example="steps=300, seconds=60")
        if self.cost_per_hour is not None and (isinstance(self.cost_per_hour, bool)
                                               or not isinstance(self.cost_per_hour, (int, float))
                                               or not math.isfinite(self.cost_per_hour) or self.cost_per_hour < 0):
            raise TroptError(f"Budget: cost_per_hour={self.cost_per_hour!r}; it must be a number >= 0 or None",
                             "e.g. Budget(steps=300, cost_per_hour=2.5)")
        if self.steps is None and self.samples is None and self.seconds is None:
            raise TroptError("Budget: no limit given, so runs would never end",
                             "give steps=, samples= or seconds= (steps or samples make runs comparable exactly)")

    def cost(self, seconds: float) -> float | None:
        """The cost of ``seconds`` of machine time, or None without a price."""
        return None if self.cost_per_hour is None else seconds / 3600.0 * self.cost_per_hour

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EarlyStopping:
    """Stop a run when the selection metric has not improved by more than ``min_delta`` for ``patience``
    consecutive evaluations. The same rule is applied to every run; the steps it saves are reported.

    Parameters
    ----------
    patience
        Evaluations without improvement before stopping (>= 1).
    min_delta
        An improvement must beat the best value so far by more than this (in the metric's units).
    """

    patience: int = 3
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        _positive("patience", self.patience, integer=True, owner="EarlyStopping", example="patience=3")
        if (isinstance(self.min_delta, bool) or not isinstance(self.min_delta, (int, float))
                or not math.isfinite(self.min_delta) or self.min_delta < 0):
            raise TroptError(f"EarlyStopping: min_delta={self.min_delta!r}; it must be a number >= 0",
                             "e.g. EarlyStopping(patience=3, min_delta=1e-4)")

    @classmethod
    def coerce(cls, value: Any) -> EarlyStopping | None:
        """None, an EarlyStopping, a patience (int) or a dict of its fields."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(patience=value)
        if isinstance(value, dict):
            return cls(**value)
        raise TroptError(f"early_stopping={value!r} is not understood",
                         "pass a patience (e.g. early_stopping=3), "
                         "tropt.experiments.EarlyStopping(patience=3, min_delta=1e-4) or None")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The default minimum effect: 0.5% of the baseline's mean. Smaller, consistent differences are what incidental changes
# produce (a 1% higher learning rate moved an under-trained MLP's validation loss by 0.34% on every seed): real, but
# not a reason to change a recipe. State your own with Guardrails(min_effect=...).
MIN_EFFECT = 5e-3


@dataclass(frozen=True)
class Guardrails:
    """When a candidate must not be adopted, whatever its gain.

    Parameters
    ----------
    max_quality_drop
        The largest acceptable drop of the selection metric against the baseline (in the metric's units, or a
        fraction of the baseline's mean when ``relative``). A candidate is rejected for quality when the whole
        paired 95% interval of its change lies beyond this drop (non-inferiority), its Holm-adjusted p < 0.05.
    relative
        Read ``max_quality_drop`` and ``min_effect`` as fractions of the baseline's mean (0.01 = 1%).
    max_instability_increase
        How many more unstable runs (non-finite loss, loss spikes or a diverging curve) than the baseline a
        candidate may have; above it, it is rejected for instability even when faster or better.
    budget
        A per-run wall-clock limit in seconds (a number, or a :class:`Budget` whose ``seconds`` is used): a
        candidate whose runs take longer on average is escalated.
    min_effect
        The smallest gain worth adopting (in the metric's units, or a fraction of the baseline's mean when
        ``relative``): a candidate is adopted only when the lower bound of the paired 95% interval of its gain is
        above it (and its Holm-adjusted p < 0.05). None (the default) is :data:`MIN_EFFECT`, 0.5% of the baseline's
        mean: smaller consistent differences are what incidental changes produce (a 1% learning-rate change). For a
        metric near its bound (an accuracy of 0.99) give an absolute value (e.g. ``min_effect=0.002``); ``0`` adopts
        any gain whose interval excludes zero. It is never the spread between seeds, which the pairing removes.
    """

    max_quality_drop: float = 0.0
    relative: bool = False
    max_instability_increase: int = 0
    budget: Budget | float | None = None
    min_effect: float | None = None

    def __post_init__(self) -> None:
        q = self.max_quality_drop
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or q < 0:
            raise TroptError(f"Guardrails: max_quality_drop={q!r}; it must be a number >= 0",
                             "e.g. Guardrails(max_quality_drop=0.01) (or 0.01 with relative=True for 1%)")
        if not isinstance(self.relative, bool):
            raise TroptError(f"Guardrails: relative={self.relative!r}; it must be True or False", "e.g. relative=True")
        k = self.max_instability_increase
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise TroptError(f"Guardrails: max_instability_increase={k!r}; it must be an integer >= 0",
                             "e.g. max_instability_increase=0")
        if isinstance(self.budget, Budget):
            if self.budget.seconds is None:
                raise TroptError("Guardrails: budget=Budget(...) without seconds sets no limit",
                                 "pass budget=Budget(seconds=60) or budget=60 (seconds per run)")
        elif self.budget is not None:
            _positive("budget", self.budget, integer=False, owner="Guardrails", example="budget=60")
        e = self.min_effect
        if e is not None and (isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e < 0):
            raise TroptError(f"Guardrails: min_effect={e!r}; it must be a number >= 0 or None (the default, "
                             f"{MIN_EFFECT:.1%} of the baseline's mean)",
                             "e.g. Guardrails(min_effect=0.005) in the metric's units, or min_effect=0.01 with "
                             "relative=True for 1% of the baseline")

    @property
    def max_seconds(self) -> float | None:
        """The per-run wall-clock limit, or None."""
        return self.budget.seconds if isinstance(self.budget, Budget) else self.budget

    def allowed_drop(self, baseline_mean: float) -> float:
        """The quality drop allowed against a baseline whose mean is ``baseline_mean``."""
        return self.max_quality_drop * abs(baseline_mean) if self.relative else self.max_quality_drop

    def required_gain(self, baseline_mean: float) -> float:
        """The smallest gain adopted against a baseline whose mean is ``baseline_mean`` (see ``min_effect``)."""
        if self.min_effect is None:
            return MIN_EFFECT * abs(baseline_mean)
        return self.min_effect * abs(baseline_mean) if self.relative else self.min_effect

    def describe_min_effect(self) -> str:
        """``min_effect`` in words, e.g. "0.5% of the baseline's mean (the default)"."""
        if self.min_effect is None:
            return f"{MIN_EFFECT:.1%} of the baseline's mean (the default)"
        return f"{self.min_effect:.2%} of the baseline's mean" if self.relative else f"{self.min_effect:.4g}"

    def to_dict(self) -> dict[str, Any]:
        return {"max_quality_drop": self.max_quality_drop, "relative": self.relative,
                "max_instability_increase": self.max_instability_increase, "max_seconds": self.max_seconds,
                "min_effect": self.min_effect}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Guardrails:
        return cls(d["max_quality_drop"], d["relative"], d["max_instability_increase"], d.get("max_seconds"),
                   d.get("min_effect"))
