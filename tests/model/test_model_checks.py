"""The stage 2-3 checks together: a healthy MLP passes all four; each leaves the Setup untouched, rejects bad input
the same way, round-trips through JSON and plots. Each check's own known answers are in tests/model/test_<name>.py."""

from __future__ import annotations

import math

import pytest
from support.model_fixtures import C, Detached, adam, ce, data, healthy, mlp, run, setup_for
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.errors import SetupError, StepError, TroptError
from tropt.model import check_activation_stats, check_gradient_flow, check_init_loss, check_overfit_batch
from tropt.result import Status
from tropt.testing import untouched

CHECKS = [check_init_loss, check_overfit_batch, check_gradient_flow, check_activation_stats]


def test_healthy_mlp_passes_all_four_via_diagnose():
    setup = healthy()
    with untouched(setup):
        report = tropt.diagnose(setup, checks="model", progress=False)
    got = {r.check: r.status for r in report.results}
    assert got == {**{c: Status.PASS for c in ("model.init_loss", "model.overfit_batch", "model.gradient_flow",
                                                "model.activation_stats")},
                   "model.eval_metric": Status.SKIP}, [r.summary for r in report.results]  # no Setup(metric=...)
    init = report["model.init_loss"]
    assert init.metrics["objective"] == "cross_entropy" and init.metrics["expected_loss"] == pytest.approx(math.log(C))
    assert report["model.overfit_batch"].metrics["final_accuracy"] == 1.0


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.check_id)
def test_every_check_leaves_the_setup_untouched_and_is_reproducible(check):
    setup = healthy()
    a, b = run(check, setup), run(check, setup)
    assert a.to_dict()["metrics"] == b.to_dict()["metrics"]


def test_model_without_parameters_is_rejected():
    with pytest.raises(SetupError, match="no parameters"):
        tropt.Setup(nn.ReLU(), ce, adam(), data())


def test_loss_that_is_not_a_scalar_is_an_error_with_the_fix():
    s = setup_for(mlp(), loss=lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none"))
    for check in CHECKS:
        with untouched(s), pytest.raises(StepError,
                                         match=r"shape \(32,\), expected a scalar — reduce it with .mean\(\)"):
            check(s, progress=False)
    report = tropt.diagnose(s, checks="model", progress=False)
    assert {r.status for r in report.results} == {Status.ERROR}
    assert all("expected a scalar" in r.summary for r in report.results)


def test_batch_too_small_to_sample_is_an_error():
    s = setup_for(mlp(), batches=data(n=8, batch=1))
    for check in (check_overfit_batch, check_activation_stats):
        with untouched(s), pytest.raises(TroptError,
                                         match=r"holds 1 sample\(s\), too few to sample: it needs at least 2"):
            check(s, progress=False)
    report = tropt.diagnose(s, checks=["model.overfit_batch", "model.activation_stats"], progress=False)
    assert [r.status for r in report.results] == [Status.ERROR, Status.ERROR]
    assert all("use batches of at least 2 samples" in " ".join(r.advice) for r in report.results)


def test_results_round_trip_and_plot():
    import matplotlib.pyplot as plt

    from tropt.plots.model import plot_global_norm, plot_gradient_heatmap

    setup = setup_for(Detached())
    for check in CHECKS:
        r = run(check, setup)
        back = tropt.CheckResult.from_dict(r.to_dict())
        for res in (r, back):
            ax = res.plot()
            assert ax is not None
            plt.close("all")
        if check is check_gradient_flow:
            _, axes = plt.subplots(1, 2)
            plot_gradient_heatmap(r, axes[0])
            plot_global_norm(r, axes[1])
            labels = [t.get_text() for t in axes[0].get_yticklabels()]
            # named with their class
            assert labels[:2] == ["main.0 (Linear)", "side.0 (Linear)"] or "side.2 (Linear)" in labels
            plt.close("all")
