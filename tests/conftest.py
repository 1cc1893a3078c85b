"""Shared fixtures: small, deterministic setups with known answers."""

from __future__ import annotations

import os
import sys

import matplotlib
import pytest
import torch
from torch import nn
from torch.nn import functional as F

matplotlib.use("Agg")  # tests draw off-screen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


@pytest.fixture
def tiny_setup():
    """A correct 2-layer MLP on 4 batches of 16 samples (3 classes)."""
    import tropt

    torch.manual_seed(0)
    x, y = make_classification()
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return tropt.Setup(model, ce_loss, lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), batches,
                       num_classes=3)


@pytest.fixture
def sample_module():
    """The bundled sample setup module (data/samples/sample_setup.py)."""
    sys.path.insert(0, SAMPLES)
    try:
        import sample_setup
    finally:
        sys.path.remove(SAMPLES)
    return sample_setup


CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def chromium():
    """Debian's Chromium driven by Playwright (never `playwright install`). Missing Chromium fails, not skips:
    `make test` installs it."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found: run `make test` (it installs Debian's chromium) or set CHROMIUM_PATH")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
