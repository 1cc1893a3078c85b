"""Shared pieces of the perf.throughput and perf.precision tests: a small MLP Setup and the quiet-machine fixture
(import the fixture into a test module to apply it there)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tropt


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """These tests run real steps on a shared machine: the oversubscription note (tested with injected timings in
    test_perf_timing.py) would depend on the machine's load, so it is off here."""
    from tropt.perf import precision as prec
    from tropt.perf import throughput as thr

    monkeypatch.setattr(prec, "oversubscription", lambda *a, **k: [])
    monkeypatch.setattr(thr, "oversubscription", lambda *a, **k: [], raising=False)


def mlp_setup(data, *, width: int = 32, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 3))
    return tropt.Setup(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                       lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), data, **kw)
