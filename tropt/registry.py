"""The check registry: one table drives every runner (``diagnose``, the CLI, the notebooks, the widgets).

One check id, one module named after it: ``<stage>.<name>`` lives in ``tropt/<stage>/<name>.py``, and registers its
function there with :func:`register`, declaring every fact about the check in that one call: title, description,
what it runs on, its budgets (``budget="quick" | "thorough"`` options) and the module that draws it. The module list
(:func:`check_modules`) is derived from the ids, and the modules are imported on first use so ``import tropt`` stays
light. The public ids and their contract order are fixed by DESIGN.md and never change meaning.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import CheckSelectionError

STAGES: dict[int, str] = {
    1: "data",
    2: "objective",
    3: "can it learn",
    4: "is the update right",
    5: "dynamics",
    6: "throughput",
}

# The public ids in contract order (DESIGN.md). An id is registered only once its check is implemented.
PUBLIC_IDS: dict[str, int] = {
    **dict.fromkeys(
        [
            "data.exact_duplicates",
            "data.near_duplicates",
            "data.group_leakage",
            "data.temporal_leakage",
            "data.target_leakage",
            "data.label_shift",
            "data.class_coverage",
            "data.label_sanity",
            "data.sampling",
            "data.eval_transforms",
        ],
        1,
    ),
    **dict.fromkeys(["model.init_loss", "model.eval_metric"], 2),
    **dict.fromkeys(["model.overfit_batch", "model.gradient_flow", "model.activation_stats"], 3),
    **dict.fromkeys(
        ["loop.zero_grad", "loop.accumulation", "loop.loss_scaling", "loop.scheduler_cadence", "loop.resume",
         "loop.ddp", "loop.train_mode"],
        4,
    ),
    **dict.fromkeys(["dynamics.loss_curve", "dynamics.lr_range"], 5),
    **dict.fromkeys(["perf.throughput", "perf.precision", "perf.memory"], 6),
}
_ORDER = {check: i for i, check in enumerate(PUBLIC_IDS)}


def check_module(check_id: str) -> str:
    """The module that holds a check: its id under ``tropt`` (``loop.zero_grad`` -> ``tropt.loop.zero_grad``)."""
    return f"tropt.{check_id}"


def check_modules() -> tuple[str, ...]:
    """The modules of the implemented checks, in contract order: those of the public ids that exist."""
    return tuple(m for m in map(check_module, PUBLIC_IDS) if importlib.util.find_spec(m) is not None)


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: its id, contract stage, title, one-line description and function.

    ``needs`` says what the check is run on: ``"setup"`` (a :class:`tropt.Setup`) or ``"splits"`` (a mapping of
    named data splits). The function takes that subject first and keyword options after it; ``diagnose`` passes
    the options the function's signature accepts. ``budgets`` maps a budget name (``"quick"``, ``"thorough"``) to
    the options it passes; ``plot`` names the :mod:`tropt.plots` module that draws the check's results (None: the
    default series plot).
    """

    id: str
    stage: int
    title: str
    description: str
    func: Callable
    needs: str
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    plot: str | None = None

    @property
    def stage_name(self) -> str:
        return STAGES[self.stage]

    @property
    def module(self) -> str:
        return check_module(self.id)

    @property
    def docs(self) -> Path:
        """The check's page, ``docs/checks/<id>.md`` (shipped in the package)."""
        from .checkdocs import check_doc_path

        return check_doc_path(self.id)


_REGISTRY: dict[str, CheckSpec] = {}
_loaded = False


def register(check_id: str, *, title: str, description: str, needs: str = "setup",
             budgets: dict[str, dict[str, Any]] | None = None, plot: str | None = None) -> Callable:
    """Decorator registering a check function under a public id (see :data:`PUBLIC_IDS`), with its facts:
    ``budgets`` (``{"quick": {...}, "thorough": {...}}``, the options each budget passes; "standard" is the
    function's own defaults) and ``plot`` (the module of :mod:`tropt.plots` that draws it)."""
    from .budgets import BUDGETS

    if check_id not in PUBLIC_IDS:
        raise ValueError(f"{check_id!r} is not a public check id (DESIGN.md fixes them)")
    if needs not in ("setup", "splits"):
        raise ValueError(f"needs must be 'setup' or 'splits', not {needs!r}")
    unknown = set(budgets or {}) - set(BUDGETS)
    if unknown:
        raise ValueError(f"{check_id}: unknown budget(s) {sorted(unknown)}; choose from {list(BUDGETS)}")

    def deco(func: Callable) -> Callable:
        _REGISTRY[check_id] = CheckSpec(check_id, PUBLIC_IDS[check_id], title, description, func, needs,
                                        dict(budgets or {}), plot)
        for name, options in (budgets or {}).items():
            BUDGETS.table(name)[check_id] = dict(options)
        func.check_id = check_id  # type: ignore[attr-defined]
        return func

    return deco


def load_checks() -> None:
    """Import every check module (:func:`check_modules`) once, so their checks register."""
    global _loaded
    if not _loaded:
        _loaded = True  # first: a check module's import may ask for the budgets, which load the checks
        for module in check_modules():
            importlib.import_module(module)


def specs() -> list[CheckSpec]:
    """All implemented checks, in contract order."""
    load_checks()
    return sorted(_REGISTRY.values(), key=lambda s: _ORDER[s.id])


def find_spec(check_id: str) -> CheckSpec | None:
    """The spec of an implemented check, or None."""
    load_checks()
    return _REGISTRY.get(check_id)


def select(checks: str | list[str] | None = None) -> list[CheckSpec]:
    """Resolve a selection to specs in contract order.

    ``checks`` may be None or "all" (everything implemented), or ids, stage prefixes (``"loop"``, ``"data"``),
    or stage numbers as strings (``"4"``), in any mix.
    """
    available = specs()
    if checks is None or checks == "all":
        return available
    if isinstance(checks, str):
        checks = [c.strip() for c in checks.split(",") if c.strip()]
    chosen: set[str] = set()
    for item in checks:
        item = str(item).strip()
        if item in _REGISTRY:
            chosen.add(item)
        elif item in PUBLIC_IDS:
            raise CheckSelectionError(
                f"check {item!r} is part of the contract but not implemented in this version of tropt",
                "run `tropt checks` to see the implemented ones",
            )
        elif item.isdigit() and int(item) in STAGES:
            chosen.update(s.id for s in available if s.stage == int(item))
        elif any(s.id.startswith(item.rstrip(".*") + ".") for s in available):
            chosen.update(s.id for s in available if s.id.startswith(item.rstrip(".*") + "."))
        else:
            raise CheckSelectionError(
                f"unknown check {item!r}",
                f"choose from: {', '.join(s.id for s in available) or '(none implemented)'}; "
                "a prefix such as 'loop' or a stage number also works",
            )
    return [s for s in available if s.id in chosen]


def list_checks() -> pd.DataFrame:
    """The implemented checks as a DataFrame: id, stage, stage_name, title, needs, description."""
    return pd.DataFrame(
        [
            {
                "id": s.id,
                "stage": s.stage,
                "stage_name": s.stage_name,
                "title": s.title,
                "needs": s.needs,
                "description": s.description,
            }
            for s in specs()
        ],
        columns=["id", "stage", "stage_name", "title", "needs", "description"],
    )
