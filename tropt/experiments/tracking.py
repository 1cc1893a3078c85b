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


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _str(v: Any, limit: int = 500) -> str:
    s = str(v)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def log_comparison(comparison: Any, tracking: Any, *, experiment: str = EXPERIMENT) -> dict[str, Any]:
    """Log every run of ``comparison``; returns ``{"uri", "experiment_id", "run_ids"}`` (run ids by candidate/seed)."""
    require("mlflow", "experiments")
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
    run_ids: dict[str, str] = {}
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
