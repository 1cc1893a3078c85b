"""The one support package of the tests: plain helpers here (``from support import ...``), and one module per kind
of known-answer case (``support.loop_cases``, ``support.real_loops`` (the public-loop ports), ``support.perf_setups``,
``support.contract_cases``, ...). conftest.py only holds fixtures (a test directory's own conftest.py would shadow
``import conftest``)."""

from __future__ import annotations

import contextlib
import os

import torch
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.path.join(ROOT, "data", "samples")


def make_classification(n: int = 64, d: int = 8, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, classes, generator=g)
    y = (x @ w).argmax(1)
    return x, y


def ce_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


@contextlib.contextmanager
def mlflow_tracking_uri(uri: str):
    """Use ``uri`` as MLflow's tracking URI inside the block and restore the previous global setting after it
    (MLflow keeps one process-wide URI, which Lightning's MLFlowLogger also sets; tests must not leak it)."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    old = utils._tracking_uri  # None when unset: then MLFLOW_TRACKING_URI / the default apply again
    mlflow.set_tracking_uri(uri)
    try:
        yield uri
    finally:
        mlflow.set_tracking_uri(old)
