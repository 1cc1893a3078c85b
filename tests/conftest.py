"""Shared fixtures: small, deterministic setups with known answers."""

from __future__ import annotations

import os
import sys

import matplotlib
import pytest
import torch
from torch import nn

matplotlib.use("Agg")  # tests draw off-screen
# The models under test are tiny: one intra-op thread is faster than two (no fork/join per op) and keeps timing
# steady when other processes share the machine's cores.
torch.set_num_threads(1)

from support import CHROMIUM, CHROMIUM_ARGS, SAMPLES, ce_loss, make_classification  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    """Close what a test drew, so figures do not pile up across the suite."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


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
