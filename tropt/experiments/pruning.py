"""Early stopping that prunes losers by rank, on Optuna's pruners (``compare(prune=...)``).

The default stays the Playbook's: a fixed budget for every run, the best checkpoint chosen afterwards
(``select="best"``). With ``prune="halving"`` (:class:`optuna.pruners.SuccessiveHalvingPruner`) or
``"hyperband"`` (:class:`optuna.pruners.HyperbandPruner`), or any Optuna pruner instance, each seed is one Optuna
study whose trials are the baseline and the candidates: every evaluation is reported as an intermediate value
(``trial.report(value, step)``), and a candidate ranked among the losers at a rung is stopped there
(``trial.should_prune()``) and not run on the later seeds. The baseline runs first on every seed and is never
pruned: it is the yardstick. A pruned candidate is never adopted (verdict inconclusive, "pruned"). The compute
saved against the full grid (every candidate on every seed at the whole budget) is in ``meta["pruning"]``.

Runs go in this process, in order (the pruner ranks what has been reported so far: Optuna's asynchronous
successive halving); ``optuna`` is an optional extra (``pip install tropt[tune]``), imported only here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import TroptError, require
from .candidates import BASELINE
from .runner import RunSpec, _Run, run_one

PRUNERS = ("halving", "hyperband")


def check_prune(prune: Any, executor: Any) -> None:
    """Bad ``prune`` values (and pruning on an executor) fail before any run."""
    if prune is None:
        return
    if executor is not None:
        raise TroptError("compare: prune= ranks runs as they report, so it runs them in this process, in order; an "
                         "executor was given too", "drop executor=, or prune=None (the fixed budget)")
    if isinstance(prune, str):
        if prune not in PRUNERS:
            raise TroptError(f"compare: prune={prune!r} is not a pruner",
                             f"use one of {PRUNERS}, an optuna.pruners pruner, or None (the fixed budget)")
        return
    optuna = require("optuna", "tune")
    if not isinstance(prune, optuna.pruners.BasePruner):
        raise TroptError(f"compare: prune is a {type(prune).__name__}",
                         f"use one of {PRUNERS}, an optuna.pruners pruner, or None (the fixed budget)")


def _pruner(prune: Any, every: int, steps: int | None) -> Any:
    optuna = require("optuna", "tune")
    if prune == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=every, reduction_factor=3)
    if prune == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=every, max_resource=steps or "auto", reduction_factor=3)
    return prune


class Pruning:
    """One Optuna study per seed; the baseline and the candidates are its trials."""

    def __init__(self, prune: Any, higher_is_better: bool, every: int, steps: int | None) -> None:
        self.optuna = require("optuna", "tune")
        self.optuna.logging.set_verbosity(self.optuna.logging.WARNING)
        self.prune, self.every, self.steps = prune, every, steps
        self.direction = "maximize" if higher_is_better else "minimize"
        self.studies: dict[int, Any] = {}
        self.pruned: dict[str, dict[str, Any]] = {}  # candidate -> where it was pruned

    def label(self) -> str:
        return self.prune if isinstance(self.prune, str) else type(self.prune).__name__

    def _study(self, seed: int) -> Any:
        if seed not in self.studies:
            self.studies[seed] = self.optuna.create_study(
                direction=self.direction, pruner=_pruner(self.prune, self.every, self.steps),
                sampler=self.optuna.samplers.RandomSampler(seed=0), study_name=f"tropt-compare-seed-{seed}")
        return self.studies[seed]

    def run(self, spec: RunSpec, step_cb: Callable | None) -> dict[str, Any]:
        """Run ``spec`` as a trial of its seed's study (or record it as skipped when its candidate was pruned)."""
        if spec.candidate in self.pruned:
            return self._skipped(spec)
        study = self._study(spec.seed)
        trial = study.ask()
        trial.set_user_attr("candidate", spec.candidate)

        def hook(step: int, value: float) -> bool:
            trial.report(value, step)
            verdict = trial.should_prune()  # asked for the baseline too: that records its value at each rung
            return spec.candidate != BASELINE and verdict

        rec = run_one(dataclasses.replace(spec, pruner=hook), step_cb)
        if rec["stopped_by"] == "pruned":
            study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
            self.pruned[spec.candidate] = {"seed": spec.seed, "step": rec["steps"]}
            rec["reason"] = (f"pruned by {self.label()} at step {rec['steps']} on seed {spec.seed}: it ranked among "
                             "the losers at that rung")
        elif rec["status"] == "ok":
            study.tell(trial, rec["score"] if rec["score"] == rec["score"] else None,
                       state=None if rec["score"] == rec["score"] else self.optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        return rec

    def _skipped(self, spec: RunSpec) -> dict[str, Any]:
        run = _Run(spec)
        where = self.pruned[spec.candidate]
        run.status, run.stopped_by = "pruned", "pruned"
        run.reason = f"not run: pruned by {self.label()} on seed {where['seed']} at step {where['step']}"
        rec = run.record()
        rec["steps_saved"] = spec.budget.steps or 0
        return rec

    def summary(self, records: list[dict[str, Any]], planned: dict[str, int | None]) -> dict[str, Any]:
        """Steps run against the full grid (every run of the selection at its whole budget)."""
        full = sum(planned.get(r["candidate"]) or 0 for r in records)
        ran = sum(r["steps"] for r in records)
        return {"pruner": self.label(), "steps_run": ran, "steps_full_grid": full,
                "saved_fraction": (1 - ran / full) if full else 0.0, "pruned": dict(self.pruned)}


def execute_pruned(specs: list[RunSpec], pruning: Pruning, progress: bool,
                   callback: Callable | None) -> list[dict[str, Any]]:
    """Every spec in order through ``pruning`` (the callbacks and progress bar of a sequential comparison)."""
    from tqdm.auto import tqdm

    out = []
    step_cb = None if callback is None else (lambda info: callback({"event": "eval", **info}))
    with tqdm(total=len(specs), desc="tropt.compare (pruning)", disable=not progress, leave=False) as bar:
        for i, spec in enumerate(specs):
            rec = pruning.run(spec, step_cb)
            out.append(rec)
            bar.update(1)
            if callback is not None:
                callback({"event": "run", "index": i, "total": len(specs), "candidate": rec["candidate"],
                          "seed": rec["seed"], "status": rec["status"], "reason": rec["reason"],
                          "score": rec["score"]})
    return out


def pruning_note(summary: dict[str, Any]) -> str:
    names = ", ".join(f"{n} (seed {w['seed']}, step {w['step']})" for n, w in summary["pruned"].items()) or "none"
    return (f"pruned by rank ({summary['pruner']}, Optuna): {summary['steps_run']} of the full grid's "
            f"{summary['steps_full_grid']} steps run, {100 * summary['saved_fraction']:.0f}% saved; pruned: {names}. "
            "A pruned candidate is never adopted")
