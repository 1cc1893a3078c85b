"""ComparePanel without a browser: Run shows live curves then the decisions; Stop ends the comparison; the Dashboard
has a Compare tab when the Setup has validation data."""

from __future__ import annotations

import os
import sys
import threading

import pytest

import tropt

pytest.importorskip("ipywidgets")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
from support.compare_setups import adam, make_setup


def _html(box) -> str:
    out = []

    def walk(w):
        if isinstance(getattr(w, "value", None), str):
            out.append(w.value)
        for c in getattr(w, "children", ()):
            walk(c)

    walk(box)
    return "\n".join(out)


def test_compare_panel_runs_and_shows_decisions():
    from tropt.widgets import ComparePanel

    setup = make_setup(lr=0.02)
    panel = ComparePanel(setup, {"adam": {"optimizer": adam(1e-2)}, "lr_x3": {"lr": 0.06}}, steps=40)
    panel.seeds.value = 3
    panel.choose.value = ("adam",)  # only the chosen candidates run
    panel.action.run_button.click()
    assert panel.action.wait(120)
    assert panel.action.state == "done", panel.action.message.value
    comp = panel.comparison
    assert comp.candidates == ["baseline", "adam"] and len(comp.records) == 6
    text = _html(panel.action.results)
    assert comp.decision().iloc[0]["verdict"] in text and "val_loss_mean" in text
    import ipywidgets as W

    pictures = [w for w in panel.action.results.children if isinstance(w, W.Image)]
    assert len(pictures) == 2 and all(p.value[:4] == b"\x89PNG" for p in pictures)


def test_compare_panel_default_candidates_scale_the_setup_lr():
    from tropt.widgets import ComparePanel

    panel = ComparePanel(make_setup(lr=0.05))
    assert panel.candidates == {"lr_x0.3": {"lr": pytest.approx(0.015)}, "lr_x3": {"lr": pytest.approx(0.15)}}


def test_compare_panel_stop_ends_the_comparison():
    from tropt.widgets import ComparePanel

    started = threading.Event()

    def slow_step(ctx, micro_batches):
        started.set()
        return tropt.standard_step(ctx, micro_batches)

    panel = ComparePanel(make_setup(step=slow_step), {"lr2": {"lr": 0.1}}, steps=2000)
    panel.seeds.value = 3
    panel.action.run_button.click()
    assert started.wait(60)
    panel.action.stop_button.click()
    assert panel.action.wait(120)
    assert panel.action.state == "stopped" and panel.comparison is None


def test_compare_panel_without_selection_shows_the_fix():
    from tropt.widgets import ComparePanel

    panel = ComparePanel(make_setup(), {"lr2": {"lr": 0.1}})
    panel.choose.value = ()
    panel.action.run_button.click()
    assert panel.action.wait(30)
    assert panel.action.state == "error" and "select at least one candidate" in panel.action.message.value


def test_dashboard_has_a_compare_tab():
    board = tropt.dashboard(make_setup())
    assert "Compare" in board.panels and "Compare" in board.tab.titles
    no_val = tropt.dashboard(make_setup().replace(val_data=None))
    assert "Compare" not in no_val.panels
