"""``tropt.experiments.tune``: search a declared space with Optuna's samplers, then decide with ``compare``.

Playbook order: explore with quasi-random search (``sampler="qmc"``, :class:`optuna.samplers.QMCSampler`, the
default) or exploit with TPE (``sampler="tpe"``); each trial is one run of the Setup with the trial's overrides
(seed ``search_seed``, the comparison's budget), scored on the selection split. The search only proposes: the best
configuration is then compared with the baseline over paired seeds with the guardrails (:func:`tropt.compare`,
Holm, ``min_effect``, confirmation), and only that comparison adopts.

Nuisance hyperparameters are re-tuned per scientific choice: with ``scientific={"adam": {...}, "sgd": {...}}`` each
choice gets its own study over ``space`` (Adam at its best learning rate against SGD at its own, never one learning
rate for both), and the tuned choices are the comparison's candidates.

Studies live in Optuna's storage, so they resume: ``storage=None`` keeps them in a journal file
``tropt-tune.journal`` in the working directory; a path ending ``.db``/``.sqlite`` is an SQLite RDB; any Optuna
URL or storage object is used as it is (several workers may share it). ``optuna`` is the ``tune`` extra.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import TroptError, require
from .budget import Budget
from .candidates import OVERRIDABLE, candidate_setup, validate_candidates

if TYPE_CHECKING:
    from ..setup import Setup
    from .comparison import Comparison

SAMPLERS = ("qmc", "tpe", "random")
DEFAULT_STORAGE = "tropt-tune.journal"


@dataclass
class Tuning:
    """The studies (one per scientific choice), each choice's best overrides and the deciding comparison."""

    studies: dict[str, Any]
    best: dict[str, dict[str, Any]]
    comparison: Comparison
    storage: str = ""
    trials: dict[str, int] = field(default_factory=dict)

    def decision(self) -> Any:
        return self.comparison.decision()

    def __repr__(self) -> str:
        return f"Tuning({', '.join(f'{k}: {v}' for k, v in self.best.items())}; {self.comparison!r})"


def _check_space(space: Any) -> dict[str, Any]:
    """``{keyword: (low, high) | (low, high, "log") | [choices]}`` of Setup keywords a candidate may override."""
    fix = "e.g. space={'lr': (1e-4, 1.0, 'log'), 'grad_clip': [None, 1.0]}"
    if not isinstance(space, Mapping) or not space:
        raise TroptError(f"tune: space is {space!r}, expected a non-empty dict of Setup keyword -> range", fix)
    for k, v in space.items():
        if k not in OVERRIDABLE:
            raise TroptError(f"tune: {k!r} is not a Setup keyword a candidate may override",
                             f"search over {', '.join(OVERRIDABLE)}")
        ok_range = (isinstance(v, tuple) and len(v) in (2, 3) and all(isinstance(x, (int, float)) for x in v[:2])
                    and v[0] < v[1] and (len(v) == 2 or v[2] == "log") and (len(v) == 2 or v[0] > 0))
        if not ok_range and not (isinstance(v, list) and v):
            raise TroptError(f"tune: the range of {k!r} is {v!r}", fix)
    return dict(space)


def _suggest(trial: Any, space: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in space.items():
        if isinstance(v, list):
            out[k] = v[trial.suggest_categorical(k, list(range(len(v))))]  # indices: any value, None too
        elif all(isinstance(x, int) and not isinstance(x, bool) for x in v[:2]):
            out[k] = trial.suggest_int(k, v[0], v[1], log=len(v) == 3)
        else:
            out[k] = trial.suggest_float(k, float(v[0]), float(v[1]), log=len(v) == 3)
    return out


def _params(study: Any, space: Mapping[str, Any]) -> dict[str, Any]:
    best = study.best_trial.params
    return {k: (v[best[k]] if isinstance(v, list) else best[k]) for k, v in space.items()}


def _storage(storage: Any) -> tuple[Any, str]:
    optuna = require("optuna", "tune")
    if storage is None:
        storage = DEFAULT_STORAGE
    if isinstance(storage, str) and "://" not in storage:
        if storage.endswith((".db", ".sqlite", ".sqlite3")):
            return f"sqlite:///{storage}", storage
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(storage)), storage
    return storage, str(storage)


def _sampler(sampler: Any, seed: int) -> Any:
    optuna = require("optuna", "tune")
    if sampler == "qmc":
        import warnings

        with warnings.catch_warnings():  # "QMCSampler is experimental": the Playbook's quasi-random search all the same
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed)
    if sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    raise TroptError(f"tune: sampler={sampler!r}", f"use one of {SAMPLERS} or an optuna.samplers sampler")


def _spec(setup: Setup, base: Mapping[str, Any], space: Mapping[str, Any], trial: Any, budget: Budget,
          search_seed: int, metric: Any, every: int, reinit: bool, threads: int) -> Any:
    """The run of one trial: its suggested values over the choice's ``base``, as a picklable RunSpec."""
    from .runner import RunSpec

    cand, factory = candidate_setup(setup, f"trial {trial.number}", {**base, **_suggest(trial, space)})
    return RunSpec(cand, f"trial {trial.number}", search_seed, budget, metric, every, model_factory=factory,
                   reinit=reinit, threads=threads)


def _score(rec: Mapping[str, Any]) -> float | None:
    score = rec["score"]
    return None if rec["status"] != "ok" or score is None or not math.isfinite(score) else float(score)


def _run_trials(study: Any, n: int, executor: Any, spec: Any) -> None:
    """Run ``n`` trials of ``study``: one after another, or on ``executor`` (any ``concurrent.futures`` executor,
    ``tropt.experiments.dask_executor()`` included) in rounds of its worker count through Optuna's ask/tell, the
    study and its sampler staying in this process. A run that fails or scores non-finite is a pruned trial."""
    from ..budgets import tropt_threads
    from .executors import check_executor
    from .runner import run_one, run_pickled

    optuna = require("optuna", "tune")
    check_executor(executor)  # processes or Dask: threads would share torch's global RNG
    with tropt_threads(None) as used:
        if executor is None:
            def objective(trial: Any) -> float:
                rec = run_one(spec(trial, threads=used))
                score = _score(rec)
                if score is None:
                    raise optuna.TrialPruned(rec["reason"] or "non-finite score")
                return score

            study.optimize(objective, n_trials=n)
            return
        width = max(1, int(getattr(executor, "_max_workers", 0) or 2))
        while n > 0:
            trials = [study.ask() for _ in range(min(width, n))]
            # Specs travel as cloudpickle bytes, as compare's do: lambdas and closures in a Setup work everywhere.
            cloudpickle = require("cloudpickle", "experiments")
            futures = [executor.submit(run_pickled, cloudpickle.dumps(spec(t, threads=used))) for t in trials]
            for trial, fut in zip(trials, futures, strict=True):
                score = _score(fut.result())
                if score is None:
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(trial, score)
            n -= len(trials)


def tune(setup: Setup, space: Mapping[str, Any], *, budget: Budget, n_trials: int = 16, sampler: Any = "qmc",
         scientific: Mapping[str, Mapping[str, Any]] | None = None, storage: Any = None, study_name: str = "tropt",
         search_seed: int = 0, seeds: Any = (0, 1, 2), metric: Any = None, eval_every: int | None = None,
         reinit: bool = False, **compare_kw: Any) -> Tuning:
    """Search ``space`` (per scientific choice), then compare each choice's best with the baseline and decide.

    ``n_trials``: the trials each study should have; a resumed study runs only the missing ones. Other keywords
    (``guardrails``, ``confirm``, ``threads``, ``executor``, ``select``, ...) go to :func:`tropt.compare`; an
    ``executor`` runs the trials too (in rounds of its worker count, through Optuna's ask/tell: the study stays
    here, the runs go to the workers, ``dask_executor()`` included).
    """
    from .orchestration import _default_eval_every, compare

    optuna = require("optuna", "tune")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = _check_space(space)
    if not isinstance(budget, Budget):
        raise TroptError(f"tune: budget is a {type(budget).__name__}", "pass budget=tropt.Budget(steps=300)")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise TroptError(f"tune: n_trials={n_trials!r}", "give a positive integer, e.g. n_trials=16")
    choices = validate_candidates(scientific) if scientific is not None else {"tuned": {}}
    target, where = _storage(storage)
    every = eval_every or _default_eval_every(setup, budget)
    setup.validate()
    direction = "maximize" if metric is not None and metric.higher_is_better else "minimize"
    studies, best, counts = {}, {}, {}
    for name, base in choices.items():
        study = optuna.create_study(storage=target, study_name=f"{study_name}/{name}", direction=direction,
                                    sampler=_sampler(sampler, search_seed), load_if_exists=True)
        done = sum(t.state.is_finished() for t in study.trials)
        if done < n_trials:
            _run_trials(study, n_trials - done, compare_kw.get("executor"),
                        partial(_spec, setup, base, space, budget=budget, search_seed=search_seed, metric=metric,
                                every=every, reinit=reinit))
        counts[name] = n_trials - done if done < n_trials else 0
        if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
            raise TroptError(f"tune: every trial of {name!r} failed", "look at the runs' reasons: tropt.compare the "
                             "space's corners by hand")
        studies[name], best[name] = study, {**base, **_params(study, space)}
    comp = compare(setup, best, budget=budget, seeds=seeds, metric=metric, eval_every=every, reinit=reinit,
                   **compare_kw)
    comp.meta["tuning"] = {"storage": where,
                           "sampler": sampler if isinstance(sampler, str) else type(sampler).__name__,
                           "studies": {n: s.study_name for n, s in studies.items()},
                           "best_trial_values": {n: s.best_value for n, s in studies.items()},
                           "search_seed": search_seed}
    return Tuning(studies, best, comp, where, counts)
