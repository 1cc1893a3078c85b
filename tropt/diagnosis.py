"""``diagnose``: run the registered checks that apply, in contract order, and never let one crash the report."""

from __future__ import annotations

import functools
import inspect
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import Cancelled, DataError, SetupError, TroptError
from .registry import CheckSpec, select
from .result import CheckResult, Report, Status, link_findings
from .setup import Setup

_F = TypeVar("_F", bound=Callable[..., Any])

# What the checks touch is process-wide: torch's global RNG (seeded and restored by every check), its intra-op
# thread count, the default dtype. Two diagnose calls in two threads would restore each other's state mid-check
# (loop.resume then FAILs "RNG" on a healthy loop), so they take turns: one check run per process at a time.
# Re-entrant: a diagnose inside a check or callback of the same thread goes on.
PROCESS_STATE_LOCK = threading.RLock()


def one_at_a_time(func: _F) -> _F:
    """Run ``func`` holding :data:`PROCESS_STATE_LOCK` (a second thread waits for the first to finish)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with PROCESS_STATE_LOCK:
            return func(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def error_result(check: str, exc: BaseException, duration_s: float | None = None) -> CheckResult:
    """The ERROR result for a check that raised: the message says why; the fix becomes the advice."""
    if isinstance(exc, SystemExit):  # sys.exit()/exit() in the user's code: their code stopped, not tropt
        return CheckResult(check, Status.ERROR, f"could not run: the code under test raised SystemExit({exc.code!r})",
                           {"error_type": "SystemExit"}, duration_s=duration_s,
                           advice=["Do not call sys.exit() or exit() in a step, loss_fn or factory: raise an exception "
                                   "that says what went wrong."])
    if isinstance(exc, TroptError):
        return CheckResult(check, Status.ERROR, f"could not run: {exc}", {"error_type": type(exc).__name__},
                           advice=[exc.fix] if exc.fix else [], duration_s=duration_s)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-6))
    return CheckResult(
        check,
        Status.ERROR,
        f"could not run: {type(exc).__name__}: {exc}",
        {"error_type": type(exc).__name__, "traceback": tb},
        advice=["This is unexpected: report it to tropt with the traceback in this result's metrics."],
        duration_s=duration_s,
    )


@one_at_a_time
def run_check(spec: CheckSpec, subject: Any, options: Mapping[str, Any]) -> CheckResult:
    """Run one check on its subject with the options its signature accepts; exceptions become ERROR results."""
    params = inspect.signature(spec.func).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in options.items() if v is not None and (takes_all or k in params)}
    start = time.perf_counter()
    try:
        result = spec.func(subject, **kwargs)
        if not isinstance(result, CheckResult):
            raise TypeError(f"check {spec.id} returned {type(result).__name__}, not a CheckResult")
    except Cancelled:  # a stop request (a callback raised it) ends the run instead of becoming a result
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a check never crashes the report; KeyboardInterrupt stops it
        from .loader_errors import loading_error

        named = loading_error(exc, subject) if spec.needs == "setup" else None
        return error_result(spec.id, named if named is not None else exc, time.perf_counter() - start)
    if result.duration_s is None:
        object.__setattr__(result, "duration_s", time.perf_counter() - start)
    return result


def _meta_tensor(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` is, or directly holds, a tensor on the meta device (shapes only, no data to read)."""
    if getattr(obj, "is_meta", False) is True:
        return True
    if depth < 2 and isinstance(obj, (tuple, list)):
        return any(_meta_tensor(v, depth + 1) for v in obj)
    if depth < 2 and isinstance(obj, Mapping):
        return any(_meta_tensor(v, depth + 1) for v in obj.values())
    return False


def check_splits_readable(splits: Mapping[str, Any]) -> None:
    """Raise a :class:`DataError` naming the split when a split cannot be read at all, before any check runs.

    Each split is opened the way the data checks open it (a file's format and columns, an array's shape, a
    Dataset's length); what the cells hold is the checks' business (they report it as their ERROR)."""
    from .data.load import Options, validate_splits
    from .data.readers import Reader

    for name, obj in validate_splits(splits):
        try:  # the reader names what it finds wrong, and where (e.g. "X of the (X, y) tuple is on the meta device")
            reader = Reader(obj, name, Options())
            if getattr(reader, "columns", None) == []:
                where = f" at {reader.path!r}" if hasattr(reader, "path") else ""
                raise DataError(f"split {name!r} has no columns{where} (an empty directory or file?)",
                                "pass a table with feature columns, or a directory of Parquet files")
        except TroptError:
            raise
        except Exception as exc:
            raise DataError(f"split {name!r} cannot be read: {type(exc).__name__}: {exc}",
                            "pass a DataFrame, an array or tensor, a map-style Dataset, a .csv/.parquet file or a "
                            "directory of Parquet files") from exc
        if _meta_tensor(obj):
            raise DataError(f"split {name!r} holds a tensor on the meta device, which has a shape but no data to check",
                            "pass the real data (materialise the tensor on the CPU or your device first)")


@one_at_a_time
def diagnose(
    setup: Setup | None = None,
    splits: Mapping[str, Any] | None = None,
    *,
    label: str | int | None = None,
    group: str | None = None,
    time: str | None = None,
    checks: str | list[str] | None = None,
    task: str | None = None,
    progress: bool = True,
    callback: Any = None,
    budget: str = "standard",
    on_result: Any = None,
    threads: int | str | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> Report:
    """Run the registered checks that apply, in contract order, and return a :class:`Report`.

    Parameters
    ----------
    setup
        A :class:`tropt.Setup` for model-side checks (stages 2-6); checks needing it are SKIP without it.
    splits
        Ordered mapping of named data splits for stage-1 checks; SKIP without it.
    label, group, time
        Column names (or keys/indices) for the data checks.
    checks
        None/"all", or a list of ids, stage prefixes ("loop") or stage numbers ("4").
    task
        "classification" or "regression" for the label checks; None infers it from the labels (integer labels with
        more than 50 distinct values read as regression: pass task="classification" for many classes).
    progress
        Show a progress bar over checks.
    callback
        Optional ``callback(info)``: called before each check with ``{"check", "index", "count"}`` and passed on to
        the checks that take a per-step ``callback``; raising :class:`tropt.errors.Cancelled` in it stops the run.
    budget
        "quick" (a first answer in seconds: fewer steps, see :data:`tropt.budgets.BUDGETS`), "standard" (every
        check's defaults) or "thorough" (more steps and seeds).
    on_result
        Optional ``on_result(result)``, called with each :class:`CheckResult` as soon as its check finishes.
    threads
        torch intra-op threads for the checks (the user's setting is restored afterwards); None takes the cores
        other work on the machine leaves idle, at most the user's setting (see :func:`tropt.budgets.tropt_threads`).
    options
        Keyword arguments for single checks, by id, over the budget's: e.g.
        ``{"perf.memory": {"memory_limit": 80}}`` to plan for an 80 GB accelerator.

    Inapplicable checks are SKIP with the reason; a check that raises becomes ERROR and the rest still run. A split
    that cannot be read at all is found before any check runs: every data check is ERROR with a DataError naming it.
    The data checks share one scan of the splits, whose row fingerprints also give the report's data fingerprint;
    when that fails, the identity says why (``data_fingerprint_error``) and the report is kept.

    Calls from several threads take turns (the checks seed and restore torch's process-wide RNG and thread count):
    a second call waits until the first returns.
    """
    from contextlib import nullcontext

    from .budgets import budget_options, tropt_threads
    from .core.compiled import CompileLog
    from .core.step_cost import add_costs
    from .data.cache import scan_needs, session
    from .identity import run_identity

    _refuse_bad_inputs(setup, splits, task)
    specs = select(checks)
    budget_options(budget, "")  # refuses an unknown budget before any check runs
    per_check = _check_options(options, specs)
    splits_error: DataError | None = None
    if splits is not None and any(s.needs == "splits" for s in specs):
        try:  # an unreadable split is found before any check runs; its data checks are ERROR, the rest still run
            check_splits_readable(splits)
        except DataError as exc:
            splits_error = exc
    common: dict[str, Any] = {"label": label, "group": group, "time": time, "task": task, "progress": progress,
                              "callback": callback}
    results: list[CheckResult] = []
    data_ids = [s.id for s in specs if s.needs == "splits"]
    setup_ids = {s.id for s in specs if s.needs == "setup"}
    # Validation runs under tropt's thread count too: a compiled model guards on it, and would recompile (issue 28).
    with CompileLog() as compile_log, tropt_threads(threads) as used_threads, \
            session(scan_needs(data_ids)) if splits is not None else nullcontext():
        setup_error = _validated(setup, specs)
        _run_specs(specs, setup, splits, setup_error, {**common, "budget": budget, "per_check": per_check}, results,
                   progress, callback, on_result, splits_error)
        step_s = _step_unit(setup, setup_error, setup_ids, results)
        # Inside the session: the identity's data fingerprint reuses the scan the data checks made.
        identity = run_identity(setup if setup_error is None else None, splits if splits_error is None else None,
                                checks=[s.id for s in specs], label=label, group=group, time=time)
    identity.update(budget=budget, threads=used_threads, **add_costs(results, step_s, setup_ids))
    if setup is not None and setup_ids:
        identity.update(_precision_note(setup))
    if note := compile_log.note():
        identity["compile_note"] = note
    if splits_error is not None:
        identity["data_fingerprint_error"] = str(splits_error)
    return Report(link_findings(results), identity)


def _step_unit(setup: Setup | None, setup_error: Any, setup_ids: set[str], results: list[CheckResult]) -> float | None:
    """One step of the user's own, timed at the checks' thread count: the unit of each check's cost (issue 32).
    perf.throughput's own timing when it ran, else timed here (after the checks: the same copy, the same unit)."""
    from .core.step_cost import measured_step_seconds, step_seconds

    if setup is None or setup_error is not None or not setup_ids:
        return None
    return measured_step_seconds(results) or step_seconds(setup)


def _validated(setup: Setup | None, specs: list) -> BaseException | None:
    """Validate the Setup once before its checks; the error each setup check then reports, or None."""
    if setup is None or not any(s.needs == "setup" for s in specs):
        return None
    try:
        setup.validate()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported once per setup check, the data checks still run
        from .loader_errors import loading_error

        return loading_error(exc, setup) or exc
    return None


def _precision_note(setup: Setup) -> dict[str, str]:
    """The report's one word on fp16 autocast on a CPU (each loop result notes it compared in fp32)."""
    from .core.cpu_fp16 import NOTE, fp16_on_cpu

    if not fp16_on_cpu(setup):
        return {}
    return {"precision_note": f"{NOTE}; the loop checks compared in fp32, loop.loss_scaling and perf.precision in fp16"}


def _refuse_bad_inputs(setup: Setup | None, splits: Any, task: str | None) -> None:
    """Refuse what :func:`diagnose` cannot run on, before any check runs."""
    if setup is None and splits is None:
        raise TroptError("diagnose needs something to check: no setup and no splits were given",
                         "pass setup=tropt.Setup(...) and/or splits={'train': df_train, 'test': df_test}")
    if setup is not None and not isinstance(setup, Setup):
        raise SetupError(f"diagnose: setup is a {type(setup).__name__}, expected a tropt.Setup",
                         "wrap your objects: tropt.Setup(model, loss_fn, optimizer, train_data)")
    if splits is not None and not isinstance(splits, Mapping):
        raise TroptError(f"diagnose: splits is a {type(splits).__name__}, expected a mapping of split name to data",
                         "pass e.g. {'train': df_train, 'test': df_test}")
    if task not in (None, "classification", "regression"):
        raise TroptError(f"diagnose: task={task!r} is not 'classification' or 'regression'",
                         "pass one of those, or None to infer it from the labels")


def _run_specs(specs, setup, splits, setup_error, options, results, progress, callback, on_result,
               splits_error=None) -> None:
    """The loop of :func:`diagnose`: each spec's result appended to ``results`` (and handed to ``on_result``)."""
    from tqdm.auto import tqdm

    from .budgets import budget_options

    budget = options.pop("budget")
    per_check = options.pop("per_check", {})
    bar = tqdm(specs, desc="tropt diagnose", disable=not progress, leave=False)
    for index, spec in enumerate(bar):
        bar.set_postfix_str(spec.id)
        if callback is not None:
            callback({"check": spec.id, "index": index, "count": len(specs)})
        if spec.needs == "setup" and setup is None:
            results.append(CheckResult(spec.id, Status.SKIP,
                                       "no Setup given: pass setup=tropt.Setup(...) to run model-side checks"))
        elif spec.needs == "splits" and splits is None:
            results.append(CheckResult(spec.id, Status.SKIP, "no data splits given: pass splits={'train': ..., "
                                       "'test': ...} to run data checks"))
        elif spec.needs == "setup" and setup_error is not None:
            results.append(error_result(spec.id, setup_error))
        elif spec.needs == "splits" and splits_error is not None:
            results.append(error_result(spec.id, splits_error))
        else:
            results.append(_run_one(spec, setup, splits, {**options, **budget_options(budget, spec.id),
                                                          **per_check.get(spec.id, {})}))
        if on_result is not None:
            on_result(results[-1])


def _run_one(spec: CheckSpec, setup: Setup | None, splits: Any, options: Mapping[str, Any]) -> CheckResult:
    """One check on its subject; a loop check of an fp16 Setup on a CPU compares in fp32 and says so
    (:mod:`tropt.core.cpu_fp16`: fp16 autocast there is ~30x slower and does not change those verdicts)."""
    if spec.needs != "setup":
        return run_check(spec, splits, options)
    from .core.cpu_fp16 import fp32_setup, mark_result, runs_in_fp32

    if setup is not None and runs_in_fp32(spec.id, setup):
        fp32 = fp32_setup(setup)
        result = run_check(spec, fp32, options)
        # A SKIP compared nothing; the Setup itself (its fp32 copy could not be made) ran as it is.
        return result if result.status is Status.SKIP or fp32 is setup else mark_result(result)
    return run_check(spec, setup, options)


def _check_options(options: Mapping[str, Mapping[str, Any]] | None, specs: list[CheckSpec]) -> dict[str, dict]:
    """Validate ``diagnose(options=...)``: known ids, and keywords each check accepts (a typo is an error, not
    ignored)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TroptError(f"diagnose: options is a {type(options).__name__}, expected {{check id: {{keyword: value}}}}",
                         "e.g. options={'perf.memory': {'memory_limit': 80}}")
    by_id = {s.id: s for s in specs}
    out = {}
    for cid, kwargs in options.items():
        if cid not in by_id:
            raise TroptError(f"diagnose: options names {cid!r}, which is not among the selected checks",
                             f"use one of: {', '.join(by_id)}")
        params = inspect.signature(by_id[cid].func).parameters
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            accepted = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
            raise TroptError(f"diagnose: {cid} takes no keyword {', '.join(map(repr, unknown))}",
                             f"its keywords: {', '.join(accepted)}")
        out[cid] = dict(kwargs)
    return out
