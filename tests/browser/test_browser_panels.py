"""Each panel in a real JupyterLab, in headless Chromium: open a generated notebook, run it, interact, assert the
results render (badges, plot images, evidence tables), and save a screenshot under tests/browser/artifacts/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect
from support.lab import KERNEL_IDLE_JS, ROOT

pytestmark = pytest.mark.browser

SAMPLES = ROOT / "data" / "samples"
PREAMBLE = f"""\
import sys
sys.path.insert(0, {str(SAMPLES)!r})
import tropt, sample_setup
setup = sample_setup.make_setup()
splits = {{"train": {str(SAMPLES / 'train.csv')!r}, "test": {str(SAMPLES / 'test.csv')!r}}}"""
RUN_TIMEOUT = 90_000


def open_and_run(page: Page, server: dict, name: str):
    page.goto(f"{server['url']}/lab/tree/{name}?reset")
    expect(page.locator(".jp-NotebookPanel")).to_be_visible()
    page.wait_for_function(KERNEL_IDLE_JS, timeout=120_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    panel = page.locator(".jp-OutputArea-output .tropt-panel").first
    error = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]')
    expect(panel.or_(error.first)).to_be_visible(timeout=120_000)
    assert error.count() == 0, error.first.inner_text()  # a traceback in the notebook
    expect(page.get_by_text("Error displaying widget")).to_have_count(0)
    return panel


def set_slider(scope, description: str, value) -> None:
    """Type a value into an ipywidgets slider's editable readout (what a user can do besides dragging)."""
    slider = scope.locator(".widget-slider", has=scope.page.locator(".widget-label", has_text=description)).first
    readout = slider.locator(".widget-readout")
    readout.click()
    readout.press("Control+a")
    readout.type(str(value))
    readout.press("Enter")
    expect(readout).to_have_text(str(value))


def click_run(action, label: str) -> None:
    button = action.locator(".widget-button", has_text=label)
    expect(button).to_be_enabled()
    button.click()


def wait_done(action, timeout: int = RUN_TIMEOUT) -> None:
    """The action's status line ends in done (and its Run button is enabled again)."""
    status = action.locator(".tropt-action-status")
    expect(status).to_have_attribute("data-state", re.compile("done|error|stopped"), timeout=timeout)
    expect(action.locator(".tropt-error")).to_have_count(0)
    expect(status).to_have_attribute("data-state", "done")


def shot(page: Page, panel, artifacts, name: str) -> None:
    """Screenshot the whole panel: grow the window to the panel's height first (JupyterLab lays out to the window,
    so a tall panel is otherwise clipped by the notebook's scroll area)."""
    expect(page.get_by_text("Error displaying widget")).to_have_count(0)
    height = panel.bounding_box()["height"]
    page.set_viewport_size({"width": 1300, "height": int(min(height + 400, 8000))})
    panel.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    panel.screenshot(path=str(artifacts / f"{name}.png"))


def test_data_panel(page, jupyter_server, notebook, artifacts):
    name = notebook(PREAMBLE, "from tropt.widgets import DataPanel\nDataPanel(splits)")
    panel = open_and_run(page, jupyter_server, name)
    for desc, column in (("label", "churned"), ("group", "customer_id"), ("time", "signup_date")):
        panel.locator(".widget-dropdown",
                      has=page.locator(".widget-label", has_text=desc)).locator("select").select_option(column)
    panel.locator(".widget-checkbox", has_text="Near duplicates").locator("input").uncheck()
    action = panel.locator(".tropt-action")
    click_run(action, "Run data checks")
    wait_done(action)
    results = action.locator(".tropt-result")
    expect(results).to_have_count(7)
    expect(action.locator('.tropt-result[data-check="data.group_leakage"] .tropt-badge.tropt-fail')).to_be_visible()
    leaked = action.locator('.tropt-result[data-check="data.exact_duplicates"]')
    leaked.locator("summary", has_text="metrics and evidence").click()  # open the evidence
    expect(leaked.locator("table.tropt-table").first).to_be_visible()
    expect(action.locator("img.widget-image").first).to_be_visible()
    shot(page, panel, artifacts, "data_panel")


def test_overfit_panel(page, jupyter_server, notebook, artifacts):
    name = notebook(PREAMBLE, "from tropt.widgets import OverfitPanel\nOverfitPanel(setup)")
    panel = open_and_run(page, jupyter_server, name)
    set_slider(panel, "batch size", 16)
    set_slider(panel, "max steps", 150)
    action = panel.locator(".tropt-action")
    click_run(action, "Overfit one batch")
    expect(action.locator(".widget-button", has_text="Overfit one batch")).to_be_disabled()
    wait_done(action)
    result = action.locator('.tropt-result[data-check="model.overfit_batch"]')
    expect(result.locator(".tropt-badge")).to_be_visible()
    expect(result).to_contain_text("batch of 16")  # the slider reached the check
    expect(action.locator("img.widget-image")).to_be_visible()
    shot(page, panel, artifacts, "overfit_panel")


def test_gradient_flow_panel_stop_then_run(page, jupyter_server, notebook, artifacts):
    name = notebook(PREAMBLE, "from tropt.widgets import GradientFlowPanel\nGradientFlowPanel(setup)")
    panel = open_and_run(page, jupyter_server, name)
    action = panel.locator(".tropt-action")
    set_slider(panel, "steps", 500)
    set_slider(panel, "refresh every", 100)
    click_run(action, "Check gradient flow")
    expect(action.locator(".tropt-action-status")).to_contain_text("step", timeout=RUN_TIMEOUT)
    action.locator(".widget-button", has_text="Stop").click()  # the kernel is free: the job runs in a thread
    expect(action.locator(".tropt-action-status")).to_have_attribute("data-state", "stopped", timeout=RUN_TIMEOUT)
    set_slider(panel, "steps", 30)
    set_slider(panel, "refresh every", 10)
    click_run(action, "Check gradient flow")
    expect(action.locator("img.widget-image")).to_be_visible(timeout=RUN_TIMEOUT)  # live charts while it runs
    wait_done(action)
    expect(action.locator('.tropt-result[data-check="model.gradient_flow"] .tropt-badge')).to_be_visible()
    expect(action.locator("img.widget-image")).to_have_count(1)
    shot(page, panel, artifacts, "gradient_flow_panel")


def test_gradient_flow_attached_to_own_loop(page, jupyter_server, notebook, artifacts):
    loop = """\
import torch
from torch import nn
from torch.nn import functional as F
from tropt.widgets import GradientFlowPanel
torch.manual_seed(0)
x, y = torch.randn(256, 8), torch.randint(0, 3, (256,))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
with tropt.GradientMonitor(model) as mon:
    panel = GradientFlowPanel.attach(mon, every=20)
    display(panel)
    for step in range(60):
        i = torch.randint(0, 256, (32,))
        F.cross_entropy(model(x[i]), y[i]).backward()
        opt.step(); opt.zero_grad()
panel.refresh()
print("loop finished")"""
    name = notebook(PREAMBLE, loop)
    panel = open_and_run(page, jupyter_server, name)
    expect(page.locator(".jp-OutputArea-output pre", has_text="loop finished")).to_be_visible(timeout=RUN_TIMEOUT)
    expect(panel.locator('.tropt-result[data-check="model.gradient_flow"] .tropt-badge')).to_be_visible()
    expect(panel.locator("img.widget-image")).to_be_visible()
    shot(page, panel, artifacts, "gradient_flow_attached")


def test_loop_panel(page, jupyter_server, notebook, artifacts):
    name = notebook(PREAMBLE, "from tropt.widgets import LoopPanel\nLoopPanel(setup)")
    panel = open_and_run(page, jupyter_server, name)
    set_slider(panel, "K (micro-batches)", 4)
    panel.locator(".widget-checkbox", has_text="GradScaler").locator("input").check()
    action = panel.locator(".tropt-action")
    click_run(action, "Check the loop")
    wait_done(action)
    # zero_grad .. resume, ddp (2 forked processes), train_mode
    expect(action.locator(".tropt-result")).to_have_count(7)
    expect(action.locator('.tropt-result[data-check="loop.ddp"][data-status="pass"]')).to_have_count(1)
    expect(action.locator('.tropt-result[data-check="loop.loss_scaling"] .tropt-badge')).to_be_visible()
    acc = action.locator('.tropt-result[data-check="loop.accumulation"]')
    expect(acc).to_contain_text("4 micro-batches")  # K from the slider
    acc.locator("summary", has_text="metrics and evidence").click()
    expect(acc.locator("table.tropt-table").first).to_be_visible()
    expect(action.locator("img.widget-image").first).to_be_visible()
    shot(page, panel, artifacts, "loop_panel")


def test_dynamics_panel(page, jupyter_server, notebook, artifacts, tmp_path):
    import numpy as np
    import pandas as pd

    name = notebook(PREAMBLE, "from tropt.widgets import DynamicsPanel\nDynamicsPanel(setup)")
    panel = open_and_run(page, jupyter_server, name)
    set_slider(panel, "steps / sweep", 60)
    set_slider(panel, "seeds", 1)
    lr = panel.locator(".tropt-action").nth(0)
    click_run(lr, "LR range test")
    wait_done(lr)
    expect(lr.locator('.tropt-result[data-check="dynamics.lr_range"] .tropt-badge')).to_be_visible()
    expect(lr.locator("img.widget-image")).to_be_visible()
    # a user's own log: a loss that starts to diverge
    steps = np.arange(300)
    loss = np.where(steps < 200, 2.0 * np.exp(-steps / 60) + 0.3, 0.3 * np.exp((steps - 200) / 25))
    log = tmp_path / "metrics.csv"
    pd.DataFrame({"step": steps, "train_loss": loss}).to_csv(log, index=False)
    with page.expect_file_chooser() as chooser:  # what a user does: click "Upload CSV", pick the file
        panel.locator(".widget-upload", has_text="Upload CSV").click()
    chooser.value.set_files(str(log))
    up = panel.locator(".tropt-action").nth(2)
    wait_done(up)
    expect(up.locator('.tropt-result[data-check="dynamics.loss_curve"] .tropt-badge.tropt-fail')).to_be_visible()
    expect(up).to_contain_text("metrics.csv")
    expect(up.locator("img.widget-image")).to_be_visible()
    shot(page, panel, artifacts, "dynamics_panel")


def test_dashboard(page, jupyter_server, notebook, artifacts):
    name = notebook(PREAMBLE,
                    'tropt.dashboard(setup, splits, label="churned", group="customer_id", time="signup_date",\n'
                    '                checks=["data", "model.init_loss", "model.gradient_flow", "loop"])')
    board = open_and_run(page, jupyter_server, name)
    expect(board.locator(".lm-TabBar-tabLabel")).to_have_text(["Diagnose all", "Data", "Protocol", "Overfit",
                                                               "Gradient flow", "Loop", "Dynamics", "Compare"])
    action = board.locator(".tropt-action").first
    click_run(action, "Diagnose all")
    wait_done(action)
    report = action.locator(".tropt-report")
    expect(report).to_be_visible()
    # The verdict first (#15): the leak is the first thing to fix; the per-check details are collapsed under it.
    expect(report.locator(".tropt-verdict .tropt-finding").first).to_have_attribute("data-status", "fail")
    expect(report.locator('.tropt-verdict .tropt-finding[data-check="data.group_leakage"]'
                          ' .tropt-badge.tropt-fail')).to_be_visible()
    shot(page, board, artifacts, "dashboard")
    report.locator("summary.tropt-all-summary, details.tropt-all > summary").first.click()
    expect(report.locator('.tropt-result[data-check="data.group_leakage"] .tropt-badge.tropt-fail')).to_be_visible()
    expect(report.locator('.tropt-result[data-check="loop.accumulation"] .tropt-badge.tropt-pass')).to_be_visible()
    leak = report.locator('.tropt-result[data-check="data.group_leakage"]')
    leak.locator("summary", has_text="metrics and evidence").click()  # evidence collapsed until asked for
    expect(leak.locator("table.tropt-table").first).to_be_visible()
    board.locator(".lm-TabBar-tab", has_text="Loop").click()  # tab switching shows the panel
    expect(board.locator(".tropt-loop-panel")).to_be_visible()
