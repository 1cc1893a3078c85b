"""The shared live core on a plain loop: vanishing gradients warned once, healthy runs quiet, arguments checked."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tropt.errors import TroptError
from tropt.integrations.live import LiveMonitor, TroptLiveWarning


def _train(live, model, steps=40, lr=0.1):
    torch.manual_seed(0)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    live.attach(model)
    for step in range(1, steps + 1):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        live.add_loss(step, loss)
        live.step_end(step)
    live.detach()
    return live.report()


def _deep_sigmoid():
    torch.manual_seed(0)
    layers = [nn.Linear(8, 32), nn.Sigmoid()]
    for _ in range(11):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    return nn.Sequential(*layers, nn.Linear(32, 3))


def test_vanishing_gradients_are_warned_once_and_can_stop():
    # judge every check, record every step
    live = LiveMonitor(every=10, stop_on="vanishing", budget=1.0, sample_every=1)
    with pytest.warns(TroptLiveWarning, match="vanishing gradients: 0") as rec:
        report = _train(live, _deep_sigmoid())
    assert sum("vanishing" in str(w.message) for w in rec) == 1  # once, not at every check
    assert live.should_stop and [e.kind for e in live.events] == ["vanishing"]
    assert report["model.gradient_flow"].status.value == "fail"
    assert report.identity["live_warnings"][0].startswith("vanishing at step 10")


def test_healthy_loop_is_quiet_and_hooks_are_removed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    live = LiveMonitor(every=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TroptLiveWarning)
        report = _train(live, model)
    assert report["model.gradient_flow"].status.value == "pass"
    assert report["dynamics.loss_curve"].metrics["points"] == 40
    rows = live.monitor.rows
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    assert live.monitor.rows == rows  # no hook left behind


def test_too_few_losses_give_a_skip_not_an_error():
    live = LiveMonitor(checks="loss_curve")
    live.add_loss(0, 1.0)
    r = live.report()["dynamics.loss_curve"]
    assert r.status.value == "skip" and "at least" in r.summary


@pytest.mark.parametrize("kw, match", [({"checks": "bogus"}, "unknown check"), ({"every": 0}, "every"),
                                       ({"stop_on": "explode"}, "stop_on"), ({"sample_every": 1.5}, "sample_every")])
def test_bad_arguments_say_how_to_fix(kw, match):
    with pytest.raises(TroptError, match=match):
        LiveMonitor(**kw)


def test_budget_limits_how_often_the_full_judgement_runs(monkeypatch):
    """The periodic judgements run only while their total time fits ``budget`` x the elapsed time. With a clock that
    advances 1 s per reading, each part "costs" 1 s: budget=1 judges at every check; with a budget near 0 no
    judgement runs during training (a first run is assumed to cost 10 ms until measured), and the forced check at
    the end still judges."""
    import types

    import tropt.integrations.live as live_mod

    ticks = iter(range(10**6))
    monkeypatch.setattr(live_mod, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    counts = {}
    for budget in (1.0, 1e-12):
        live = LiveMonitor(every=5, budget=budget, sample_every=1)
        _train(live, nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)), steps=40)
        counts[budget] = live.judgements
        live.check(40, force=True)
        assert live.judgements == counts[budget] + 1
    assert counts == {1.0: 8, 1e-12: 0}
