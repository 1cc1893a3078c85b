"""Log a comparison's runs to MLflow: overrides as params, curves as step metrics, run identity as tags.

The default store is local and embedded, a SQLite file (``sqlite:///mlflow.db``), so it works with no server and
``mlflow ui --backend-store-uri sqlite:///mlflow.db`` shows the runs. Logging happens in the calling process once
the runs are back, so workers never write to the store concurrently. MLflow is imported only here.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from ..errors import TroptError, require

DEFAULT_DB = "mlflow.db"
EXPERIMENT = "tropt-compare"
_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch call


def tracking_uri(tracking: Any) -> str:
    """``"mlflow"`` → ``sqlite:///mlflow.db`` here; a directory → ``sqlite:///<dir>/mlflow.db``; a URI as given."""
    if not isinstance(tracking, (str, os.PathLike)):
        raise TroptError(f"compare: tracking={tracking!r} is not understood",
                         'pass tracking="mlflow" (sqlite:///mlflow.db here), an MLflow tracking URI, a directory, '
                         "or None")
    text = os.fspath(tracking)
    if text == "mlflow":
        return f"sqlite:///{DEFAULT_DB}"
    if "://" in text or text.startswith(("sqlite:", "databricks")):
        return text
    if os.path.isdir(text):
        return f"sqlite:///{os.path.abspath(os.path.join(text, DEFAULT_DB))}"
    raise TroptError(f"compare: tracking={text!r} is neither 'mlflow', a URI nor an existing directory",
                     'pass tracking="mlflow", tracking="sqlite:////abs/path/mlflow.db" or an existing directory')


def _sqlite_path(uri: str) -> str | None:
    """The file of a ``sqlite:///`` URI (None for other stores and in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?")[0]
    return None if path in ("", ":memory:") else os.path.abspath(path)


def _check_file_writable(path: str, uri: str) -> None:
    """Refuse a SQLite store whose file, or the directory it would be made in, cannot be written (names the path)."""
    import tempfile

    where = os.path.dirname(path) or "."
    if not os.path.isdir(where):
        raise TroptError(f"compare: the MLflow store {uri} is in {where!r}, which does not exist",
                         "create the directory first, or pass tracking= an existing directory")
    try:
        if os.path.exists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        else:
            tempfile.TemporaryFile(dir=where).close()
    except OSError as exc:
        raise TroptError(f"compare: the MLflow store {uri} cannot be written ({path!r}: {exc.strerror or exc})",
                         "pass tracking= a directory you can write to, or fix the file's permissions") from None


def _bounded_http() -> Any:
    """A context with MLflow's HTTP retries bounded (2 tries, 10 s each) instead of its default minutes of backoff."""
    import contextlib

    @contextlib.contextmanager
    def bounded():
        keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
        saved = {k: os.environ.get(k) for k in keys}
        os.environ.update(keys)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return bounded()


def check_store(tracking: Any, *, experiment: str = EXPERIMENT, attempts: int = 2) -> str:
    """Check, before the first run, that the store behind ``tracking`` can be written: its URI, or a TroptError
    naming the store (and the file, for SQLite). The experiment is found or created, with ``attempts`` tries
    (bounded retries: an unreachable server fails in seconds, not after every run and minutes of backoff)."""
    require("mlflow", "experiments")
    uri = tracking_uri(tracking)
    path = _sqlite_path(uri)
    if path is not None:
        _check_file_writable(path, uri)
    from mlflow.tracking import MlflowClient

    last: BaseException | None = None
    with _bounded_http():
        for attempt in range(attempts):
            try:
                client = MlflowClient(tracking_uri=uri)
                if client.get_experiment_by_name(experiment) is None:
                    client.create_experiment(experiment)
                return uri
            except Exception as exc:  # noqa: BLE001 - any store failure is reported with the store named
                last = exc
                if attempt + 1 < attempts:
                    time.sleep(1.0)
    raise TroptError(f"compare: the MLflow store {uri} cannot be used ({type(last).__name__}: "
                     f"{str(last).splitlines()[0][:300] if str(last) else ''})",
                     "start the tracking server or pass tracking= a store you can write to (a directory, or "
                     "'mlflow' for sqlite:///mlflow.db here); tracking=None logs nothing")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _str(v: Any, limit: int = 500) -> str:
    s = str(v)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def log_comparison(comparison: Any, tracking: Any, *, experiment: str = EXPERIMENT) -> dict[str, Any]:
    """Log every run of ``comparison``; returns ``{"uri", "experiment_id", "run_ids"}`` (run ids by candidate/seed).

    The work is done by then: when logging fails, the error is recorded instead of raised (``{"uri", "error",
    "run_ids"}`` with the runs logged before it), so the comparison is kept."""
    require("mlflow", "experiments")
    run_ids: dict[str, str] = {}
    try:
        with _bounded_http():
            return _log_all(comparison, tracking, experiment, run_ids)
    except Exception as exc:  # noqa: BLE001 - the comparison is returned with the logging error in it
        import warnings

        first = str(exc).splitlines()[0][:500] if str(exc) else ""
        error = f"{type(exc).__name__}: {first}"
        warnings.warn(f"compare: logging to MLflow failed after the runs ({error}); the comparison is returned "
                      "with the error in comparison.meta['tracking']", RuntimeWarning, stacklevel=3)
        return {"uri": tracking_uri(tracking), "error": error, "run_ids": run_ids}


def _log_all(comparison: Any, tracking: Any, experiment: str, run_ids: dict[str, str]) -> dict[str, Any]:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(tracking)
    client = MlflowClient(tracking_uri=uri)  # no global tracking URI is changed
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    meta = comparison.meta
    identity = meta.get("identity", {})
    overrides = meta.get("candidates", {})
    budget = meta.get("budget", {})
    for r in comparison.records:
        name = r["candidate"]
        tags = {"tropt.candidate": name, "tropt.seed": str(r["seed"]), "tropt.status": r["status"],
                "tropt.stopped_by": r["stopped_by"], "tropt.comparison": meta.get("comparison_id", ""),
                "tropt.metric": comparison.metric,
                **{f"tropt.identity.{k}": _str(v) for k, v in identity.items() if v is not None}}
        if r["reason"]:
            tags["tropt.reason"] = _str(r["reason"])
        run = client.create_run(exp_id, run_name=f"{name}/seed{r['seed']}", tags=tags)
        rid = run.info.run_id
        params = {"candidate": name, "seed": r["seed"],
                  **{f"override.{k}": v for k, v in overrides.get(name, {}).items()},
                  **{f"budget.{k}": v for k, v in budget.items() if v is not None}, "optimizer": r.get("optimizer", "")}
        now = int(time.time() * 1000)
        scalars = {k: r[k] for k in ("score", "final", "best", "steps", "samples", "seconds", "samples_per_s",
                                     "peak_memory_mb", "cost", "spikes", "non_finite", "steps_saved")
                   if _finite(r.get(k))}
        scalars.update({k: v for k, v in r.items() if (k.startswith("final_") or k.startswith("test_")) and _finite(v)})
        metrics = [Metric(k, float(v), now, 0) for k, v in scalars.items()]
        c = r["curves"]
        for key in ("train_loss", "lr"):
            metrics += [Metric(key, float(v), now, int(s))
                        for s, v in zip(c.get("step", []), c.get(key, [])) if _finite(v)]
        for key, values in c.items():
            if key not in ("step", "train_loss", "lr", "eval_step"):
                metrics += [Metric(f"curve.{key}", float(v), now, int(s))
                            for s, v in zip(c["eval_step"], values) if _finite(v)]
        client.log_batch(rid, params=[Param(k, _str(v)) for k, v in params.items()])
        for i in range(0, len(metrics), _BATCH):
            client.log_batch(rid, metrics=metrics[i:i + _BATCH])
        client.set_terminated(rid, status="FINISHED" if r["status"] == "ok" else "FAILED")
        run_ids[f"{name}/seed{r['seed']}"] = rid
    return {"uri": uri, "experiment_id": exp_id, "run_ids": run_ids}
