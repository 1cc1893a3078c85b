"""Panel unit tests without a browser: simulate clicks, assert the widget state afterwards."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import tropt
from tropt.errors import Cancelled

pytest.importorskip("ipywidgets")

from support import SAMPLES, ce_loss, make_classification

TRAIN, TEST = os.path.join(SAMPLES, "train.csv"), os.path.join(SAMPLES, "test.csv")


def run(action, timeout=120):
    """Click Run and wait for the background job; Run is disabled while it runs and re-enabled after."""
    action.run_button.click()
    assert action.wait(timeout), "the action did not finish"
    assert not action.run_button.disabled and action.stop_button.disabled
    return action


def html_of(box) -> str:
    """All HTML inside a widget tree."""
    out = []

    def walk(w):
        if hasattr(w, "value") and isinstance(w.value, str):
            out.append(w.value)
        for c in getattr(w, "children", ()):
            walk(c)

    walk(box)
    return "\n".join(out)


def images(box) -> list:
    import ipywidgets as W

    found = []

    def walk(w):
        if isinstance(w, W.Image):
            found.append(w)
        for c in getattr(w, "children", ()):
            walk(c)

    walk(box)
    return found


def test_import_tropt_stays_light():
    code = ("import sys, tropt; tropt.Setup; "
            "assert 'ipywidgets' not in sys.modules and 'matplotlib' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_dashboard_entry_point_is_lazy_and_callable():
    from tropt.widgets import Dashboard

    assert callable(tropt.dashboard)
    board = tropt.dashboard(splits={"train": TRAIN, "test": TEST}, label="churned")
    assert isinstance(board, Dashboard)
    assert board.tab.titles == ("Diagnose all", "Data")


def test_data_panel_runs_ticked_checks_with_chosen_columns():
    from tropt.widgets import DataPanel

    panel = DataPanel({"train": TRAIN, "test": TEST})
    assert "churned" in panel.label.options and panel.label.value == "(none)"
    panel.label.value, panel.group.value, panel.time.value = "churned", "customer_id", "signup_date"
    for cid, box in panel.boxes.items():
        box.value = cid in ("data.exact_duplicates", "data.group_leakage", "data.label_shift")
    run(panel.action)
    assert panel.action.state == "done", panel.action.message.value
    assert list(panel.results) == ["data.exact_duplicates", "data.group_leakage", "data.label_shift"]
    assert panel.results["data.group_leakage"].status.value == "fail"  # shared customer ids in the sample
    text = html_of(panel.action.results)
    assert 'class="tropt-badge tropt-fail"' in text and "tropt-table" in text  # badge and evidence table
    assert images(panel.action.results)  # plots
    assert panel.action.progress.value == panel.action.progress.max


def test_data_panel_bad_column_is_a_red_message_not_a_traceback():
    from tropt.widgets import DataPanel

    df = pd.DataFrame({"x": np.arange(10.0), "y": [0, 1] * 5})
    panel = DataPanel({"train": df, "test": df.copy()}, label="y")
    panel._by_name["ghost"] = "ghost"  # as if a column vanished between choosing and running
    panel.label.options = [*panel.label.options, "ghost"]
    panel.label.value = "ghost"
    run(panel.action)
    assert panel.action.state == "error"
    msg = panel.action.message.value
    assert "tropt-error" in msg and "Fix:" in msg and "ghost" in msg and "Traceback" not in msg
    # no check ticked: also a message, and the panel is usable again afterwards
    for box in panel.boxes.values():
        box.value = False
    run(panel.action)
    assert panel.action.state == "error" and "tick at least one check" in panel.action.message.value


def test_data_panel_unreadable_split_shows_in_panel():
    from tropt.widgets import DataPanel

    panel = DataPanel({"train": "/nonexistent/train.csv", "test": TEST})
    assert "tropt-error" in panel.problem.value and "does not exist" in panel.problem.value
    run(panel.action)
    assert panel.action.state == "error" and "does not exist" in panel.action.message.value


def test_overfit_panel_live_curve_then_verdict(tiny_setup):
    from tropt.widgets import OverfitPanel

    panel = OverfitPanel(tiny_setup)
    panel.samples.value, panel.steps.value = 16, 100
    seen_live = []
    orig = panel._live
    panel._live = lambda *a: (orig(*a), seen_live.append(a))
    run(panel.action)
    assert panel.action.state == "done", panel.action.message.value
    assert seen_live, "the live loss curve was never drawn"
    assert panel.result.status.value == "pass" and panel.result.metrics["samples"] == 16
    assert len(panel.curves["model"]) == len(panel.result.series["loss"])
    assert len(panel.curves["baseline"]) == len(panel.result.series["baseline_loss"])
    assert "tropt-pass" in html_of(panel.action.results) and images(panel.action.results)


def test_stop_ends_overfit_run_early(tiny_setup):
    from tropt.widgets import OverfitPanel

    panel = OverfitPanel(tiny_setup.replace(optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1e-4)))
    panel.steps.value = 2000
    orig = panel.action.tick

    def tick(done, total, text=None):  # press Stop from inside the run, at a known point
        if "step 5/" in (text or ""):
            panel.action.stop_button.click()
        return orig(done, total, text)

    panel.action.tick = tick
    run(panel.action)
    assert panel.action.state == "stopped"
    assert panel.result is None and 5 <= len(panel.curves["model"]) < 20
    assert "stopped" in panel.action.status.value and panel.action.message.value == ""


def test_stop_button_from_another_thread(tiny_setup):
    """The real use: the job runs in a background thread; Stop is clicked while it runs."""
    import time

    from tropt.widgets import GradientFlowPanel

    panel = GradientFlowPanel(tiny_setup)
    panel.steps.value, panel.every.value = 500, 100
    panel.action.run_button.click()
    assert panel.action.run_button.disabled and not panel.action.stop_button.disabled
    deadline = time.time() + 60
    while panel.action.progress.value < 3 and time.time() < deadline:
        time.sleep(0.01)
    panel.action.stop_button.click()
    assert panel.action.wait(60)
    assert panel.action.state == "stopped" and panel.action.progress.value < 500
    assert not panel.action.run_button.disabled


def test_gradient_flow_panel_live_refresh(tiny_setup):
    from tropt.widgets import GradientFlowPanel

    panel = GradientFlowPanel(tiny_setup)
    panel.steps.value, panel.every.value = 12, 4
    run(panel.action)
    assert panel.action.state == "done", panel.action.message.value
    assert panel.refreshes == 2  # at steps 4 and 8 (12 is the final picture)
    assert panel.result.status.value == "pass"
    assert "model.gradient_flow" in html_of(panel.action.results) and len(images(panel.action.results)) == 1


def test_gradient_flow_attach_to_own_loop():
    from tropt.widgets import GradientFlowPanel

    torch.manual_seed(0)
    x, y = make_classification()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tropt.GradientMonitor(model) as mon:
        panel = GradientFlowPanel.attach(mon, every=5)
        assert "waiting" in panel.verdict.value
        for _i in range(12):
            ce_loss(model, (x, y)).backward()
            opt.step()
            opt.zero_grad()
    assert panel.refreshes == 2 and "model.gradient_flow" in panel.verdict.value
    assert images(panel.live)
    panel.refresh()
    assert panel.result.metrics["recorded_steps"] == 12
    with pytest.raises(tropt.TroptError, match=r"expected a tropt\.GradientMonitor"):
        GradientFlowPanel.attach(object())


def test_loop_panel_options(tiny_setup):
    from tropt.widgets import LoopPanel

    panel = LoopPanel(tiny_setup)
    assert panel.k.value == 4 and not panel.scaler.value
    assert "loop.loss_scaling" not in [s.id for s in panel.chosen()]
    panel.k.value, panel.scaler.value, panel.resume.value = 2, True, False
    ids = [s.id for s in panel.chosen()]
    assert "loop.loss_scaling" in ids and "loop.resume" not in ids
    run(panel.action)
    assert panel.action.state == "done", panel.action.message.value
    assert list(panel.results) == ids
    assert panel.results["loop.accumulation"].metrics.get("k") in (2, None)
    assert panel.results["loop.loss_scaling"].status.value == "pass"  # fp16 + GradScaler on a copy
    assert all(r.status.value in ("pass", "skip") for r in panel.results.values())  # no scheduler: cadence SKIP
    # per-parameter error plots: zero_grad, accumulation, loss_scaling, ddp (none for the SKIP)
    assert len(images(panel.action.results)) == 4
    assert tiny_setup.precision == "fp32" and not tiny_setup.use_scaler  # the user's Setup is untouched


def test_protocol_panel_runs_the_setup_checks_of_stages_1_and_2():
    from support import contract_cases as cc

    from tropt.widgets import ProtocolPanel

    panel = ProtocolPanel(cc.class_sorted().replace(metric=tropt.Metric(cc.accuracy)))
    assert [s.id for s in panel.specs] == ["data.sampling", "data.eval_transforms", "model.init_loss",
                                           "model.eval_metric"]
    panel.boxes["model.init_loss"].value = False
    run(panel.action)
    assert panel.action.state == "done", panel.action.message.value
    assert list(panel.results) == ["data.sampling", "data.eval_transforms", "model.eval_metric"]
    assert panel.results["data.sampling"].status.value == "fail"
    assert 'data-check="data.sampling"' in html_of(panel.action.results) and len(images(panel.action.results)) == 3
    for box in panel.boxes.values():
        box.value = False
    run(panel.action)
    assert panel.action.state == "error" and "no check is ticked" in panel.action.message.value


def test_loop_panel_bad_setup_is_one_message(tiny_setup):
    from tropt.widgets import LoopPanel

    bad = tiny_setup.replace(loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1], reduction="none"))
    panel = LoopPanel(bad)
    run(panel.action)
    assert panel.action.state == "error" and "scalar" in panel.action.message.value
    assert panel.results == {}


def test_dynamics_panel_lr_range_and_upload(tiny_setup, tmp_path):
    from tropt.widgets import DynamicsPanel

    panel = DynamicsPanel(tiny_setup)
    panel.num_steps.value, panel.repeats.value = 30, 1
    run(panel.lr_action)
    assert panel.lr_action.state == "done", panel.lr_action.message.value
    assert "suggested_low" in panel.result_lr.metrics and images(panel.lr_action.results)
    # upload a diverging log: the upload starts the diagnosis by itself
    steps = np.arange(200)
    csv = pd.DataFrame({"step": steps, "train_loss": np.exp(steps / 40.0)}).to_csv(index=False).encode()
    panel.upload.value = ({"name": "log.csv", "type": "text/csv", "size": len(csv), "content": memoryview(csv),
                           "last_modified": datetime.datetime.now(datetime.timezone.utc)},)
    assert panel.upload_action.wait(60)
    assert panel.upload_action.state == "done", panel.upload_action.message.value
    assert panel.result_upload.status.value == "fail" and "log.csv" in html_of(panel.upload_action.results)
    # a file that is not a loss log: a red message
    junk = b"a,b\nx,y\n"
    panel.upload.value = ({"name": "junk.csv", "type": "text/csv", "size": len(junk), "content": memoryview(junk),
                           "last_modified": datetime.datetime.now(datetime.timezone.utc)},)
    assert panel.upload_action.wait(60)
    assert panel.upload_action.state == "error" and "Fix:" in panel.upload_action.message.value


def test_dynamics_panel_loss_curve_probe(tiny_setup):
    from tropt.widgets import DynamicsPanel

    panel = DynamicsPanel(tiny_setup)
    panel.curve_steps.value = 40
    run(panel.curve_action)
    assert panel.curve_action.state == "done", panel.curve_action.message.value
    assert panel.result_curve.check == "dynamics.loss_curve" and images(panel.curve_action.results)


def test_dynamics_panel_without_setup_only_uploads():
    from tropt.widgets import DynamicsPanel

    panel = DynamicsPanel()
    assert panel.lr_action.box not in panel.children and panel.upload in panel.children
    run(panel.upload_action)
    assert panel.upload_action.state == "error" and "no file uploaded" in panel.upload_action.message.value


def test_dashboard_diagnose_all_ends_with_report(tiny_setup):
    from tropt.widgets import Dashboard

    board = Dashboard(tiny_setup, checks=["model.init_loss", "model.gradient_flow", "loop"])
    assert board.tab.titles == ("Diagnose all", "Protocol", "Overfit", "Gradient flow", "Loop", "Dynamics")
    run(board.action)
    assert board.action.state == "done", board.action.message.value
    assert board.report.checks[:2] == ["model.init_loss", "model.gradient_flow"]
    assert "tropt-report" in html_of(board.action.results)
    direct = tropt.diagnose(tiny_setup, checks=["model.init_loss", "model.gradient_flow", "loop"], progress=False)
    assert [r.status for r in direct] == [r.status for r in board.report]  # never disagrees with diagnose
    assert html_of(board.action.results).index("tropt-verdict") < html_of(board.action.results).index("tropt-result")


def test_dashboard_budget_reaches_diagnose(tiny_setup, monkeypatch):
    from tropt import diagnosis
    from tropt.widgets import Dashboard

    seen = {}
    real = diagnosis.diagnose

    def spy(*args, **kwargs):
        seen["budget"] = kwargs.get("budget")
        return real(*args, **kwargs)

    monkeypatch.setattr(diagnosis, "diagnose", spy)
    board = Dashboard(tiny_setup, checks=["model.init_loss"], budget="quick")
    assert board.budget.value == "quick" and list(board.budget.options) == ["quick", "standard", "thorough"]
    board.budget.value = "thorough"
    run(board.action)
    assert board.action.state == "done" and seen == {"budget": "thorough"}
    with pytest.raises(tropt.TroptError, match="budget='fast'"):
        Dashboard(tiny_setup, budget="fast")


def test_dashboard_stop_during_diagnose_all(tiny_setup):
    from tropt.widgets import Dashboard

    board = Dashboard(tiny_setup, checks=["model.overfit_batch", "model.gradient_flow"])
    orig = board.action.tick

    def tick(done, total, text=None):
        if "step 3/" in (text or ""):
            board.action.stop()
        return orig(done, total, text)

    board.action.tick = tick
    run(board.action)
    assert board.action.state == "stopped" and board.report is None


def test_dashboard_needs_something():
    from tropt.widgets import Dashboard

    with pytest.raises(tropt.TroptError, match="no setup and no splits"):
        Dashboard()


def test_diagnose_callback_cancel(tiny_setup):
    calls = []

    def cb(info):
        calls.append(info)
        if info.get("check") == "model.gradient_flow" and "index" in info:
            raise Cancelled()

    with pytest.raises(Cancelled):
        tropt.diagnose(tiny_setup, checks="model", progress=False, callback=cb)
    assert [c["check"] for c in calls if "index" in c] == ["model.init_loss", "model.eval_metric",
                                                           "model.overfit_batch", "model.gradient_flow"]
    assert any("step" in c for c in calls)  # overfit_batch's per-step callback went through diagnose


def test_one_run_at_a_time_across_panels(tiny_setup):
    """A second panel's run waits for the first (checks restore global RNG state around their work)."""
    from tropt.widgets import GradientFlowPanel, LoopPanel

    first, second = GradientFlowPanel(tiny_setup), LoopPanel(tiny_setup)
    first.steps.value, first.every.value = 400, 100
    first.action.run_button.click()
    second.action.run_button.click()
    import time

    deadline = time.time() + 30
    while "waiting for another" not in second.action.status.value and time.time() < deadline:
        time.sleep(0.01)
    assert "waiting for another" in second.action.status.value and first.action.running
    first.action.stop()
    assert first.action.wait(60) and second.action.wait(120)
    assert first.action.state == "stopped" and second.action.state == "done", second.action.message.value
