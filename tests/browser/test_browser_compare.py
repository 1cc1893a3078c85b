"""ComparePanel in a real JupyterLab, in headless Chromium: choose seeds and steps, Run, see live curves replaced by
the decisions, the per-candidate table and two plots; screenshot under tests/browser/artifacts/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from test_browser_panels import PREAMBLE, click_run, open_and_run, set_slider, shot, wait_done

pytestmark = pytest.mark.browser


def test_compare_panel(page, jupyter_server, notebook, artifacts):
    name = notebook(PREAMBLE, "import sample_candidates\nfrom tropt.widgets import ComparePanel\n"
                              "ComparePanel(setup, sample_candidates.make_candidates(), steps=40)")
    panel = open_and_run(page, jupyter_server, name)
    set_slider(panel, "seeds", 3)
    set_slider(panel, "steps / run", 30)
    action = panel.locator(".tropt-action")
    click_run(action, "Compare")
    expect(action.locator(".widget-button", has_text="Compare")).to_be_disabled()
    wait_done(action, timeout=180_000)
    result = action.locator(".tropt-comparison")
    expect(result).to_be_visible()
    expect(result).to_contain_text("lr_x3")
    expect(result.locator("li").first).to_contain_text(re.compile("adopt|reject|escalate|inconclusive"))
    expect(result.locator("table")).to_be_visible()
    expect(action.locator("img.widget-image")).to_have_count(2)
    shot(page, panel, artifacts, "compare_panel")
