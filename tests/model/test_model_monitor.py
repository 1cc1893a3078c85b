"""GradientMonitor in a user's own loop: exact statistics, hooks removed, cadence, frozen and missing parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from support.model_fixtures import C, D, data, mlp
from torch import nn
from torch.nn import functional as F

import tropt
from tropt.errors import TroptError


def _global_hooks() -> tuple[int, int]:
    from torch.optim import optimizer as o

    return len(o._global_optimizer_pre_hooks), len(o._global_optimizer_post_hooks)


def test_monitor_records_exact_norms_in_a_plain_loop_and_removes_its_hooks():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    expected = []
    hooks_before = _global_hooks()
    with tropt.GradientMonitor(model, full_every=1) as mon:
        assert _global_hooks() == (hooks_before[0] + 1, hooks_before[1] + 1)
        for x, y in data()[:5]:
            F.cross_entropy(model(x), y).backward()
            before = [p.detach().clone() for p in model.parameters()]
            grads = [p.grad.norm().item() for p in model.parameters()]
            opt.step()
            updates = [(p.detach() - b).norm().item() for p, b in zip(model.parameters(), before)]
            expected.append((grads, [p.norm().item() for p in model.parameters()], updates))
            opt.zero_grad()
    assert _global_hooks() == hooks_before
    assert all(not m._forward_pre_hooks for m in model.modules())
    df = mon.frame()
    assert list(df["step"].unique()) == [0, 1, 2, 3, 4] and len(df) == 5 * 6
    for step, (g, p, u) in enumerate(expected):
        rows = df[df["step"] == step]
        np.testing.assert_allclose(rows["grad_norm"], g, rtol=1e-5)
        np.testing.assert_allclose(rows["param_norm"], p, rtol=1e-5)
        np.testing.assert_allclose(rows["update_norm"], u, rtol=1e-4)
    assert (df["nonfinite"] == 0).all() and df["zero_fraction"].between(0, 1).all()
    np.testing.assert_allclose(mon.global_norms()[0], math.sqrt(sum(v * v for v in expected[0][0])), rtol=1e-5)
    assert mon.module_order == ["0", "2", "4"]
    assert mon.memory_bytes > 0
    assert mon.result().status.value == "pass"


def test_monitor_measures_updates_on_every_kth_recorded_step_exactly():
    """Default cadence: update norms, parameter norms and zero counts on recorded rows 0, 10, 20 (NaN elsewhere);
    gradient norm and non-finite count every row."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    expected, params = {}, {}
    with tropt.GradientMonitor(model) as mon:
        assert mon.full_every == 10
        for step, (x, y) in enumerate((data() * 4)[:23]):
            F.cross_entropy(model(x), y).backward()
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            expected[step] = [(p.detach() - b).norm().item() for p, b in zip(model.parameters(), before)]
            params[step] = [p.norm().item() for p in model.parameters()]
            opt.zero_grad()
    df = mon.frame()
    measured = sorted(df.loc[df["update_norm"].notna(), "step"].unique())
    assert measured == [0, 10, 20]
    for step in measured:
        np.testing.assert_allclose(df.loc[df["step"] == step, "update_norm"], expected[step], rtol=1e-4)
    assert sorted(df.loc[df["zero_fraction"].notna(), "step"].unique()) == [0, 10, 20]  # the other slow statistics
    assert sorted(df.loc[df["param_norm"].notna(), "step"].unique()) == [0, 10, 20]
    for step in measured:
        np.testing.assert_allclose(df.loc[df["step"] == step, "param_norm"], params[step], rtol=1e-5)
    assert df["grad_norm"].notna().all() and df["nonfinite"].notna().all()
    assert len(df) == 23 * 6
    summary = mon.summary()
    assert summary["update_ratio_mean"].notna().all()
    np.testing.assert_allclose(summary["param_norm"], params[20], rtol=1e-5)  # the latest measured, not a NaN row
    # One pass over the gradients per recorded step; on rows 0, 10, 20 the zero count (1), the parameter norm (1)
    # and AdamW's copy-based update (6).
    np.testing.assert_allclose(mon.passes["gradients"], 23 + 3)
    np.testing.assert_allclose(mon.passes["parameters"], 3 * (1 + 6))


def test_monitor_two_optimizers_each_measure_their_own_update():
    """Two optimizers over halves of one model, stepping in turn: each row's update is that optimizer's, exactly."""
    model = mlp()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    rest = torch.optim.SGD([p for m in list(model)[1:] for p in m.parameters()], lr=0.05)
    names = [n for n, _ in model.named_parameters()]
    expected = []
    with tropt.GradientMonitor(model, full_every=1) as mon:
        for x, y in data()[:3]:
            F.cross_entropy(model(x), y).backward()
            for opt in (first, rest):
                before = [p.detach().clone() for p in model.parameters()]
                opt.step()
                expected.append([(p.detach() - b).norm().item() for p, b in zip(model.parameters(), before)])
            first.zero_grad(), rest.zero_grad()
    df = mon.frame()
    assert mon.steps_seen == 6
    for step, upd in enumerate(expected):
        rows = df[df["step"] == step].set_index("name").loc[names]
        stepped = [u > 0 for u in upd]
        assert stepped == ([True, True] + [False] * 4 if step % 2 == 0 else [False, False] + [True] * 4)
        got = rows["update_norm"].to_numpy()
        np.testing.assert_allclose(got[np.array(stepped)], np.array(upd)[np.array(stepped)], rtol=1e-4)
    assert mon.summary()["in_optimizer"].all()


def test_monitor_every_and_explicit_optimizer_and_other_optimizers_ignored():
    model, other = mlp(), nn.Linear(3, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    with tropt.GradientMonitor(model, every=3) as mon:
        for x, y in data()[:7]:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            other(torch.randn(2, 3)).sum().backward()
            other_opt.step()  # an optimizer over other parameters: not counted
    assert mon.steps_seen == 7 and mon.recorded_steps == [0, 3, 6]
    with tropt.GradientMonitor(model, optimizer=other_opt) as mon2:
        F.cross_entropy(model(data()[0][0]), data()[0][1]).backward()
        opt.step()
    assert mon2.steps_seen == 0


def test_monitor_flags_nonfinite_counts_missing_optimizer_and_no_grad():
    model = nn.Sequential(nn.Linear(D, 4), nn.Linear(4, C))
    unused = nn.Linear(2, 2)
    model.add_module("unused", unused)
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    with tropt.GradientMonitor(model) as mon:
        x, y = data()[0]
        F.cross_entropy(model[1](model[0](x)), y).backward()
        model[0].weight.grad[0, :3] = float("nan")
        opt.step()
    df = mon.frame().set_index("name")
    assert df.loc["0.weight", "nonfinite"] == 3
    assert math.isnan(df.loc["unused.weight", "grad_norm"])
    s = mon.summary().set_index("name")
    assert not s.loc["1.weight", "in_optimizer"] and s.loc["0.weight", "in_optimizer"]
    assert s.loc["unused.bias", "steps_with_grad"] == 0
    r = mon.result()
    assert r.status.value == "fail"
    got = set(zip(r.tables["problems"]["name"], r.tables["problems"]["problem"]))
    assert {("unused.weight", "no gradient"), ("1.weight", "never updated"), ("0.weight", "non-finite gradient")} <= got


def test_monitor_bad_input():
    with pytest.raises(TroptError, match=r"expected a torch\.nn\.Module"):
        tropt.GradientMonitor("model")
    with pytest.raises(TroptError, match="every=0"):
        tropt.GradientMonitor(mlp(), every=0)
    with pytest.raises(TroptError, match="full_every=0"):
        tropt.GradientMonitor(mlp(), full_every=0)
    with pytest.raises(TroptError, match="no parameters"):
        tropt.GradientMonitor(nn.ReLU()).__enter__()


def test_import_tropt_stays_light():
    import subprocess
    import sys

    code = ("import sys, tropt; tropt.GradientMonitor; "
            "print(any(m in sys.modules for m in ('matplotlib', 'seaborn', 'tropt.plots.model')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_monitor_update_norms_are_exact_with_parameters_of_two_dtypes():
    """The parameter copy is one block per dtype: a float64 head beside a float32 body keeps exact update norms."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    model[1].double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    expected = []
    with tropt.GradientMonitor(model, full_every=1) as mon:
        for _ in range(3):
            model[1](model[0](torch.randn(5, 4)).double()).pow(2).sum().backward()
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            expected.append([(p.detach() - b).norm().item() for p, b in zip(model.parameters(), before)])
            opt.zero_grad()
    df = mon.frame()
    for step, upd in enumerate(expected):
        np.testing.assert_allclose(df.loc[df["step"] == step, "update_norm"], upd, rtol=1e-5)


def _sgd_run(opt_kwargs: dict, steps: int = 4, skip: str | None = None):
    """Monitor an SGD loop (full_every=1); returns the frame, the measured updates and the monitor."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), **opt_kwargs)
    expected = []
    with tropt.GradientMonitor(model, full_every=1) as mon:
        for x, y in (data() * 2)[:steps]:
            F.cross_entropy(model(x), y).backward()
            if skip is not None:
                model.get_parameter(skip).grad = None  # the step leaves this parameter alone
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            expected.append([(p.detach() - b).norm().item() for p, b in zip(model.parameters(), before)])
            opt.zero_grad()
    return mon.frame(), expected, mon


@pytest.mark.parametrize("opt_kwargs, copies", [
    ({"lr": 0.1}, False),                                                   # lr * ||grad||
    ({"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2, "dampening": 0.1}, False),  # lr * ||buffer||
    ({"lr": 0.1, "momentum": 0.9, "nesterov": True}, True),                 # not read from the step: copied
    ({"lr": 0.1, "weight_decay": 1e-2}, True),
])
def test_monitor_sgd_update_norm_from_the_step_matches_the_parameter_difference(opt_kwargs, copies):
    """SGD's update is read from its own step (no parameter copy, at most one pass) where that is exact; the result
    equals the measured parameter difference, and a parameter the step skips (no gradient) has update 0."""
    df, expected, mon = _sgd_run(opt_kwargs, skip="2.bias")
    for step, upd in enumerate(expected):
        np.testing.assert_allclose(df.loc[df["step"] == step, "update_norm"], upd, rtol=1e-4, atol=1e-12)
    assert (df.loc[df["name"] == "2.bias", "update_norm"] == 0).all()
    per_step = mon.passes_per_step()["parameters"]
    if copies:  # the copy is made only where the step cannot give the update
        assert per_step >= 7 - 1e-9  # parameter norm + copy (2) + difference (3) + its norm (1)
    else:
        assert per_step <= 2 + 1e-9  # parameter norm (+ the momentum buffer's norm)


def test_monitor_sgd_subclass_is_measured_by_copy():
    """A subclass of SGD may change step(): its update is measured from the parameters, not from the formula; its
    super().step() call (which fires the global hooks again, nested) is one optimizer step, not two."""
    class HalfSGD(torch.optim.SGD):
        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.mul_(0.5)
            return super().step(closure)

    torch.manual_seed(0)
    model = mlp()
    opt = HalfSGD(model.parameters(), lr=0.1, momentum=0.9)
    with tropt.GradientMonitor(model, full_every=1) as mon:
        x, y = data()[0]
        F.cross_entropy(model(x), y).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        upd = [(p.detach() - b).norm().item() for p, b in zip(model.parameters(), before)]
    assert mon.steps_seen == 1
    np.testing.assert_allclose(mon.frame()["update_norm"], upd, rtol=1e-4)
