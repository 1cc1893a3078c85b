"""``tropt.compare``: every candidate and the baseline under one budget, over seeds, on the user's own step."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import Cancelled, SetupError, TroptError
from ..metric import Metric
from .budget import Budget, EarlyStopping, Guardrails
from .candidates import BASELINE, candidate_setup, describe_overrides, validate_candidates
from .comparison import Comparison
from .confirmation import fresh_seeds, winner
from .evaluation import higher_is_better, metric_name, score
from .executors import check_executor, executor_label
from .fairness import fair_budgets
from .provenance import plain, refuse_final_as_selection
from .runner import RunSpec, _Run, run_one, run_pickled
from .seeding import check_seeds_vary

if TYPE_CHECKING:
    from ..setup import Setup

SELECT = ("final", "best")


def _check_seeds(seeds: Any) -> list[int]:
    fix = "pass seeds=(0, 1, 2); three or more let a difference be told from seed noise"
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise TroptError(f"compare: seeds={seeds!r} is not a list of integers", fix)
    out = list(seeds)
    if not out:
        raise TroptError("compare: the seed list is empty, so no run would happen", fix)
    if any(isinstance(s, bool) or not isinstance(s, int) for s in out):
        raise TroptError(f"compare: seeds={out!r}; every seed must be an integer", fix)
    if len(set(out)) != len(out):
        raise TroptError(f"compare: seeds={out!r} repeat a seed, which would count one run twice",
                         "give distinct seeds")
    return out


def _is_test_name(name: str) -> bool:
    return "test" in str(name).lower()


def _selection(setup: Setup, splits: Mapping | None, select_split: str) -> tuple[str, Any, dict[str, Any], list[str]]:
    """(selection split name, its data or None for Setup.val_data, splits evaluated only at the end, notes)."""
    splits = dict(splits or {})
    notes = []
    if not isinstance(select_split, str):
        raise TroptError(f"compare: select_split={select_split!r} is not a split name", "e.g. select_split='val'")
    if _is_test_name(select_split):
        raise TroptError(f"compare: the selection split is named {select_split!r}; choosing a candidate on the test "
                         "split leaks it into the choice, so its score no longer estimates performance on new data",
                         "select on a validation split (Setup.val_data, or splits={'val': ...}) and evaluate the "
                         "winner on test once, after the choice")
    if select_split in splits:
        data = splits.pop(select_split)
    elif select_split == "val" and setup.val_data is not None:
        data = None
    else:
        raise SetupError(f"compare: no {select_split!r} split to select on (Setup.val_data is "
                         f"{'set' if setup.val_data is not None else 'None'}, splits has {sorted(splits)})",
                         "give the Setup val_data=..., or pass splits={'val': ...}: compare selects on a validation "
                         "split only")
    for name in splits:
        if _is_test_name(name):
            notes.append(f"split {name!r} was evaluated once at the end of every run, for reporting only: it was never "
                         "used for selection or early stopping")
        else:
            notes.append(f"split {name!r} was evaluated at the end of every run, for reporting only")
    return select_split, data, splits, notes


def _default_eval_every(setup: Setup, budget: Budget) -> int:
    steps = budget.steps
    if steps is None and budget.samples is not None:
        from ..core.batch import batch_size

        steps = max(1, budget.samples // max(1, batch_size(setup.sample_batch())))
    return max(1, (steps or 500) // 10)


def compare(
    setup: Setup,
    candidates: Mapping[str, Mapping[str, Any]],
    *,
    budget: Budget,
    seeds: Iterable[int] = (0, 1, 2),
    metric: Metric | None = None,
    eval_every: int | None = None,
    early_stopping: int | EarlyStopping | None = None,
    guardrails: Guardrails | None = None,
    executor: Any = None,
    tracking: Any = None,
    progress: bool = True,
    callback: Callable[[dict], Any] | None = None,
    select: str = "final",
    splits: Mapping[str, Any] | None = None,
    select_split: str = "val",
    reinit: bool = False,
    threads: int | str | None = None,
    confirm: int | None = None,
    prune: Any = None,
) -> Comparison:
    """Run every candidate and the baseline under one budget over seeds, and decide.

    Parameters
    ----------
    setup
        The :class:`tropt.Setup`: the baseline, always run. Never modified.
    candidates
        ``{name: overrides}`` of Setup keywords: ``optimizer``, ``scheduler``, ``accumulation_steps``, ``grad_clip``,
        ``precision``, ``use_scaler``, ``step``, ``train_data``, ``batch_size``, ``model`` (a module, or a factory
        called with the run's seed set) and ``lr`` (sets the first param group's learning rate and scales the others
        by the same factor).
    budget
        :class:`tropt.Budget`, the same for every run.
    seeds
        Each candidate runs once per seed; runs with the same seed share the data order and starting weights.
    metric
        :class:`tropt.Metric` to select by; default the Setup's ``metric``, else the validation loss through
        ``loss_fn`` (plus accuracy when ``num_classes`` is set).
    eval_every
        Evaluate the selection split every this many steps (default: a tenth of the run) and at the end.
    early_stopping
        A patience (int) or :class:`tropt.experiments.EarlyStopping`: the same rule for every run.
    guardrails
        :class:`tropt.Guardrails` for the decisions (default: no quality drop, no extra instability, a minimum
        effect of 0.5% of the baseline's mean). Decisions read the paired 95% interval of each candidate's gain, with
        p-values Holm-adjusted across the candidates (see :mod:`tropt.experiments.stats`).
    executor
        Any ``concurrent.futures.Executor`` (e.g. :func:`tropt.experiments.dask_executor`); None runs sequentially
        in this process. Runs travel as cloudpickle bytes; results do not depend on the executor (use process-based
        executors: threads share torch's global random state).
    tracking
        ``"mlflow"`` (SQLite store ``mlflow.db`` in the working directory), a directory (``<dir>/mlflow.db``) or an
        MLflow tracking URI: every run is logged. None logs nothing.
    progress, callback
        A progress bar over runs; ``callback(dict)`` after each evaluation (sequential runs: ``event="eval"``) and
        each finished run (``event="run"``); raising :class:`tropt.errors.Cancelled` in it stops.
    select
        Select on each run's ``"final"`` score or its ``"best"`` evaluation.
    splits, select_split
        Extra named splits evaluated once at the end of every run for reporting (a split named like ``test`` is never
        used for selection), and the name of the selection split (``"val"``: the Setup's ``val_data``).
    reinit
        Re-initialise each run's model copy from its seed (``reset_parameters``): for models trained from scratch,
        so seeds vary the initialisation too. Default keeps the Setup's weights (fine-tuning). A list of training
        batches is read in a seeded order either way (:mod:`tropt.experiments.seeding`); when the seeds vary
        nothing at all, compare says so before any run (a :class:`tropt.errors.TroptError`).
    threads
        torch intra-op threads for every run, the same policy as :func:`tropt.diagnose`
        (:func:`tropt.budgets.tropt_threads`): None takes the cores other work leaves idle, chosen once so every
        run (on any executor) uses the same count; the user's setting is restored afterwards.
    confirm
        Fresh seeds on which the winner of two or more candidates is re-run with the baseline before it is adopted
        (:mod:`tropt.experiments.confirmation`); None: as many as ``seeds``; 0 turns the confirmation off.
    prune
        None (default): the fixed budget for every run, the best checkpoint chosen afterwards with ``select="best"``.
        ``"halving"`` or ``"hyperband"`` (or an ``optuna.pruners`` pruner): stop losers by rank at each evaluation
        with Optuna's pruners, and report the compute saved against the full grid (:mod:`tropt.experiments.pruning`;
        needs the ``tune`` extra; runs in this process).

    Returns
    -------
    Comparison
    """
    opts = _validated(setup, candidates, budget, seeds, metric, eval_every, early_stopping, guardrails, select, reinit,
                      executor, tracking, prune)
    confirm_n = _check_confirm(confirm, len(opts.seeds))
    selection = _selection(setup, splits, select_split)
    setup.validate()
    built: dict[str, tuple[Setup, Callable[[], Any] | None]] = {BASELINE: (setup, None)}
    built.update({n: candidate_setup(setup, n, o) for n, o in opts.candidates.items()})
    comparison = _run_all(setup, built, opts, selection, eval_every, threads, confirm_n, progress, callback)
    if tracking is not None:
        from .tracking import log_comparison

        comparison.meta["tracking"] = log_comparison(comparison, tracking)
    return comparison


def _run_all(setup: Setup, built: dict[str, tuple[Setup, Any]], opts: _Options, selection: tuple, eval_every: Any,
             threads: Any, confirm_n: int, progress: bool, callback: Callable | None) -> Comparison:
    """Under one thread policy: probe the metric and the seeds, fix each candidate's fair budget, run every
    candidate on every seed, then the winner of many and the baseline on fresh seeds."""
    from ..budgets import oversubscribed, tropt_threads
    from ..identity import candidate_identity

    select_name, select_data, final_splits, notes = selection
    with tropt_threads(threads) as used:
        if opts.metric is not None:
            _probe_metric(setup, opts.metric, select_data, select_name)
        check_seeds_vary(setup, opts.seeds, reinit=opts.reinit)
        refuse_final_as_selection(setup, select_name, select_data, final_splits)
        budgets, basis, fair_notes = fair_budgets(built, opts.budget)
        every = eval_every or _default_eval_every(setup, opts.budget)

        def specs(names: list[str], seed_list: list[int], phase: str) -> list[RunSpec]:
            return [RunSpec(built[n][0], n, seed, budgets[n], opts.metric, every, opts.early_stopping, built[n][1],
                            opts.reinit, final_splits, opts.select, select_name, select_data, used, phase)
                    for seed in seed_list for n in names]  # seed by seed: load drift hits every candidate alike

        records, pruned = _select_runs(specs(list(built), opts.seeds, "select"), opts, every, budgets, progress,
                                       callback)
        comparison = Comparison(records, _meta(setup, opts, every, select_name, notes + fair_notes, records))
        if pruned:
            from .pruning import pruning_note

            comparison.meta["pruning"] = pruned
            comparison.meta["notes"].append(pruning_note(pruned))
        comparison.meta.update(threads=used, compared_at=basis,
                               candidate_identities={n: candidate_identity(built[n][0], opts.candidates[n])
                                                     for n in opts.candidates})
        busy = oversubscribed()
        if busy:
            comparison.meta["notes"].append(busy)
        best = winner(comparison.decision().to_dict("records")) if confirm_n else None
        if best is not None:
            fresh = fresh_seeds(opts.seeds, confirm_n)
            comparison.records += _execute(specs([BASELINE, best], fresh, "confirm"), opts.executor, progress,
                                           callback)
            comparison.meta["confirmation"] = {"candidate": best, "seeds": fresh}
    return comparison


def _select_runs(specs: list[RunSpec], opts: _Options, every: int, budgets: dict[str, Budget], progress: bool,
                 callback: Callable | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The selection runs: every one at the fixed budget, or through Optuna's pruner (with its summary)."""
    if opts.prune is None:
        return _execute(specs, opts.executor, progress, callback), None
    from .pruning import Pruning, execute_pruned

    pruning = Pruning(opts.prune, higher_is_better(opts.metric), every, budgets[BASELINE].steps)
    records = execute_pruned(specs, pruning, progress, callback)
    base_steps = max((r["steps"] for r in records if r["candidate"] == BASELINE), default=0)
    planned = {n: b.steps or base_steps for n, b in budgets.items()}
    return records, pruning.summary(records, planned)


def _check_confirm(confirm: Any, n_seeds: int) -> int:
    """The number of fresh seeds for the winner's confirmation (None: as many as the selection's seeds)."""
    if confirm is None:
        return n_seeds
    if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 0:
        raise TroptError(f"compare: confirm={confirm!r}; it must be an integer >= 0 or None",
                         "confirm=3 re-runs the winner on 3 fresh seeds; confirm=0 adopts without confirmation")
    return confirm


@dataclass(frozen=True)
class _Options:
    """compare's keywords once checked: what every run shares and what the decisions use."""

    candidates: dict[str, dict[str, Any]]
    budget: Budget
    seeds: list[int]
    metric: Metric | None
    early_stopping: EarlyStopping | None
    guardrails: Guardrails
    select: str
    reinit: bool
    executor: Any
    prune: Any = None


def _validated(setup: Setup, candidates: Any, budget: Any, seeds: Any, metric: Any, eval_every: Any,
               early_stopping: Any, guardrails: Any, select: Any, reinit: Any, executor: Any,
               tracking: Any, prune: Any = None) -> _Options:
    """Check every keyword before any run (a bad one fails now, saying how to fix it), in the order given."""
    from ..setup import Setup

    if not isinstance(setup, Setup):
        raise TroptError(f"compare: setup is a {type(setup).__name__}, expected a tropt.Setup",
                         "pass tropt.Setup(model, loss_fn, optimizer, train_data, val_data)")
    cands = validate_candidates(candidates)
    if not isinstance(budget, Budget):
        raise TroptError(f"compare: budget is a {type(budget).__name__}, expected a tropt.Budget",
                         "pass budget=tropt.Budget(steps=300)")
    seed_list = _check_seeds(seeds)
    metric = metric if metric is not None else setup.metric
    if metric is not None and not isinstance(metric, Metric):
        raise TroptError(f"compare: metric is a {type(metric).__name__}, expected a tropt.Metric",
                         "wrap it: metric=tropt.Metric(fn, higher_is_better=True)")
    if eval_every is not None and (isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1):
        raise TroptError(f"compare: eval_every={eval_every!r}; it must be an integer >= 1 or None",
                         "e.g. eval_every=50")
    es = EarlyStopping.coerce(early_stopping)
    guardrails = guardrails if guardrails is not None else Guardrails()
    if not isinstance(guardrails, Guardrails):
        raise TroptError(f"compare: guardrails is a {type(guardrails).__name__}", "pass tropt.Guardrails(...) or None")
    if select not in SELECT:
        raise TroptError(f"compare: select={select!r}", f"use one of {SELECT}")
    if not isinstance(reinit, bool):
        raise TroptError(f"compare: reinit={reinit!r}; it must be True or False",
                         "reinit=True re-initialises each run from its seed")
    check_executor(executor)
    from .pruning import check_prune

    check_prune(prune, executor)
    if tracking is not None:
        from .tracking import check_store

        check_store(tracking)  # a bad value or an unwritable store fails now, not after every run
    return _Options(cands, budget, seed_list, metric, es, guardrails, select, reinit, executor, prune)


def _meta(setup: Setup, opts: _Options, every: int, select_name: str, notes: list[str],
          records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the comparison was: its metric, budget, seeds, rules, candidates and executor, and the Setup's identity."""
    from ..identity import run_identity

    metric, es = opts.metric, opts.early_stopping
    name = metric_name(metric) if metric is not None else f"{select_name}_loss"
    if metric is not None and select_name != "val":
        name = f"{select_name}_{metric.name}"
    meta: dict[str, Any] = {
        "comparison_id": uuid.uuid4().hex[:12],
        "metric": name, "higher_is_better": higher_is_better(metric), "select": opts.select,
        "select_split": select_name, "budget": opts.budget.to_dict(), "seeds": opts.seeds, "eval_every": every,
        "early_stopping": es.to_dict() if es is not None else None,
        "guardrails": opts.guardrails.to_dict(), "reinit": opts.reinit,
        "prune": opts.prune if opts.prune is None or isinstance(opts.prune, str) else type(opts.prune).__name__,
        "candidates": {BASELINE: {}, **{n: describe_overrides(o, setup) for n, o in opts.candidates.items()}},
        "plain_overrides": {n: {k: v for k, v in o.items() if plain(v)} for n, o in opts.candidates.items()},
        "executor": executor_label(opts.executor), "notes": notes,
        "identity": run_identity(setup),
    }
    saved = sum(r.get("steps_saved", 0) or 0 for r in records)
    if es is not None:
        meta["notes"].append(f"early stopping (patience {es.patience} evaluations, min_delta {es.min_delta:g}) applied "
                             f"to every run; it saved {saved} steps in all")
    return meta


def _probe_metric(setup: Setup, metric: Metric, data: Any, prefix: str) -> None:
    """Score the untrained baseline once: a metric that fails or returns a non-number is bad input, found before
    any run (it raises :class:`tropt.errors.StepError` naming what came back)."""
    from ..snapshot import preserved

    with preserved():
        ctx = setup.build()
        score(setup, ctx, metric, data, prefix=prefix)


def _lost(spec: RunSpec, exc: BaseException) -> dict[str, Any]:
    """The record of a run the executor could not bring back (e.g. its worker process died)."""
    run = _Run(spec)
    run.fail(f"the executor lost this run ({type(exc).__name__}: {exc}); its worker process may have died "
             "(out of memory, a crash in native code, os._exit)", "error")
    return run.record()


def _execute(specs: list[RunSpec], executor: Any, progress: bool, callback: Callable | None) -> list[dict[str, Any]]:
    """Run every spec, in this process or on ``executor``; records come back in spec order."""
    from tqdm.auto import tqdm

    total = len(specs)
    records: list[dict[str, Any] | None] = [None] * total
    bar = tqdm(total=total, desc="tropt.compare", disable=not progress, leave=False)

    def finished(i: int, rec: dict[str, Any]) -> None:
        records[i] = rec
        bar.update(1)
        if callback is not None:
            callback({"event": "run", "index": i, "total": total, "candidate": rec["candidate"], "seed": rec["seed"],
                      "status": rec["status"], "reason": rec["reason"], "score": rec["score"]})

    with bar:
        if executor is None:
            step_cb = None if callback is None else (lambda info: callback({"event": "eval", **info}))
            for i, spec in enumerate(specs):
                finished(i, run_one(spec, step_cb))
            return records  # type: ignore[return-value]
        import concurrent.futures as cf

        from ..errors import require

        cloudpickle = require("cloudpickle", "experiments")
        futures = {}
        try:
            for i, spec in enumerate(specs):
                futures[executor.submit(run_pickled, cloudpickle.dumps(spec))] = i
            for fut in cf.as_completed(futures):
                i = futures[fut]
                try:
                    rec = fut.result()
                except Cancelled:
                    raise
                except BaseException as exc:
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    rec = _lost(specs[i], exc)
                finished(i, rec)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return records  # type: ignore[return-value]
