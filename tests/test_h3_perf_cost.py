"""The perf checks stop when their verdict is decided, and their quick budgets really cut (issue 32). Known answers:
a step with no data wait stops at ``min_steps``; a slow dataset is still data-loading bound; the precision comparison
stops only when no candidate can be recommended any more."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from support.perf_setups import mlp_setup, quiet_machine  # noqa: F401 - quiet_machine is an autouse fixture

from tropt.budgets import BUDGETS
from tropt.perf import check_throughput
from tropt.perf.precision import settled
from tropt.result import Status


class _Slow(torch.utils.data.Dataset):
    """Each sample sleeps 10 ms: a batch of 16 waits ~160 ms for a ~1 ms step."""

    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.01)
        return self.x[i], self.y[i]


def test_throughput_stops_when_no_data_wait_is_decided():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]
    r = check_throughput(mlp_setup(batches), warmup=1, steps=25, min_steps=6, profile=False, progress=False)
    assert r.status is Status.PASS and r.metrics["limited_by"] == "compute", r.summary
    assert r.metrics["timed_steps"] == 6 and r.metrics["max_steps"] == 25 and len(r.tables["steps"]) == 6
    assert "over 6 steps" in r.summary


def test_throughput_still_names_a_slow_dataset_when_stopping_early():
    s = mlp_setup(torch.utils.data.DataLoader(_Slow(), batch_size=16))
    r = check_throughput(s, warmup=1, steps=12, min_steps=4, profile_steps=1, progress=False)
    assert r.status is Status.WARN and r.metrics["limited_by"] == "data loading", r.summary
    assert r.metrics["timed_steps"] == 4 and not r.tables["top_operators"].empty


class _Run:
    """What :func:`settled` reads of a precision run."""

    def __init__(self, times, losses=None, skips=0):
        self.times = list(times)
        self.losses = list(losses if losses is not None else [1.0] * len(self.times))
        self.skips = skips


def test_precision_settles_only_when_no_candidate_can_reach_the_threshold():
    fp32 = _Run([1.0] * 8)
    slower = _Run([1.5, 1.4, 1.6, 1.5, 1.45, 1.55, 1.5, 1.5])  # bf16 on a CPU without bf16 units
    assert settled({"fp32": fp32, "bf16": slower}, "fp32", 8, 1.2)
    assert not settled({"fp32": fp32, "bf16": slower}, "fp32", 9, 1.2)  # too few rounds yet
    faster = _Run([0.5] * 8)  # clearly 2x faster and the same losses: recommended, settled
    assert settled({"fp32": fp32, "bf16": faster}, "fp32", 8, 1.2)
    drifting = _Run([0.5] * 8, [1.0] * 6 + [1.04, 1.04])  # clearly faster, but its loss drifts 4% from fp32's
    assert not settled({"fp32": fp32, "bf16": drifting}, "fp32", 8, 1.2, max_deviation=0.05)
    near = _Run([0.9, 0.8, 0.85, 0.8, 0.9, 0.85, 0.8, 0.9])  # 1.1-1.25x: the interval straddles 1.2, keep going
    assert not settled({"fp32": fp32, "bf16": near}, "fp32", 8, 1.2)
    noisy = _Run([1.5] * 7 + [0.7])  # one round reaches 1.43x: the high end of the interval is not under 1.2
    assert not settled({"fp32": fp32, "bf16": noisy}, "fp32", 8, 1.2)
    unstable = _Run([1.5] * 8, [1.0] * 7 + [math.nan])  # a non-finite loss: the stability verdict is still open
    assert not settled({"fp32": fp32, "bf16": unstable}, "fp32", 8, 1.2)
    assert not settled({"fp32": fp32, "bf16": _Run([1.5] * 8, skips=1)}, "fp32", 8, 1.2)
    assert settled({"fp32": fp32}, "fp32", 8, 1.2)  # nothing to recommend over fp32


def test_precision_reports_the_steps_it_ran():
    from tropt.perf import check_precision

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]
    r = check_precision(mlp_setup(batches), precisions=("fp32", "bf16"), steps=12, warmup=1, min_steps=4,
                        progress=False)
    assert r.status is not Status.ERROR, r.summary
    n = r.metrics["timed_steps"]
    assert 4 <= n <= 12 and len(r.series["step_ms_fp32"]) == n and len(r.series["loss_bf16"]) == n + 1
    assert np.isfinite(r.metrics["bf16_loss_deviation"])


def test_quick_budgets_cut_the_perf_checks():
    quick = BUDGETS["quick"]
    assert quick["perf.throughput"]["profile"] is False  # no profiler work in a first answer
    assert quick["perf.throughput"]["steps"] + quick["perf.throughput"]["warmup"] <= 8
    assert quick["perf.precision"]["steps"] + quick["perf.precision"]["warmup"] <= 8


def test_diagnose_takes_its_cost_unit_from_perf_throughput_instead_of_timing_the_step_again(monkeypatch):
    import tropt
    from tropt.core import step_cost

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]
    setup = mlp_setup(batches)

    def not_again(*a, **k):
        raise AssertionError("the step was timed again although perf.throughput measured it")

    monkeypatch.setattr(step_cost, "step_seconds", not_again)
    report = tropt.diagnose(setup, checks=["model.init_loss", "perf.throughput"], progress=False,
                            options={"perf.throughput": {"profile": False}})
    r = report["perf.throughput"]
    assert report.identity["step_seconds"] == round(r.metrics["compute_ms"] / 1e3, 6)
    assert report["model.init_loss"].metrics["cost_steps"] >= 0 and r.metrics["cost_steps"] > 0


def test_diagnose_still_times_the_step_without_perf_throughput():
    import tropt

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]
    report = tropt.diagnose(mlp_setup(batches), checks=["model.init_loss"], progress=False)
    assert report.identity["step_seconds"] > 0 and "cost_steps" in report["model.init_loss"].metrics


def test_memory_at_budget_quick_leaves_the_bf16_option_out_and_keeps_the_rest():
    from tropt.perf import check_memory

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]
    setup = mlp_setup(batches)
    quick = check_memory(setup, growth_steps=4, bf16=False, progress=False)
    full = check_memory(setup, growth_steps=4, progress=False)
    assert "bf16 autocast" not in set(quick.tables["strategies"]["option"])
    assert "bf16 autocast" in set(full.tables["strategies"]["option"])
    assert quick.metrics["optimizer_steps"] == full.metrics["optimizer_steps"] - 2
    assert quick.status is full.status and quick.metrics["peak_mib"] > 0
    assert BUDGETS["quick"]["perf.memory"]["bf16"] is False
