"""tropt.suggest: each finding kind gives its candidate (with hypothesis and motivating finding); correctness FAILs
give none and block. Findings carry the metrics keys the real checks write (see tropt/dynamics, tropt/perf)."""

from __future__ import annotations

import torch
from support.compare_setups import make_setup

import tropt
from tropt.experiments.suggest import WithWeightDecay, loader_like
from tropt.result import CheckResult, Report


def _report(*results: CheckResult) -> Report:
    return Report(list(results), {"tropt": tropt.__version__})


def _loader_setup(**kw):
    s = make_setup(lr=0.05, **kw)
    loader = torch.utils.data.DataLoader(s.train_data, batch_size=32, shuffle=True)
    return s.replace(train_data=loader)


def test_precision_warn_suggests_bf16():
    r = CheckResult("perf.precision", "warn", "recommend bf16", {"recommended": "bf16", "setup_precision": "fp32",
                                                                  "fp32_step_ms": 10.0, "bf16_step_ms": 5.0})
    s = tropt.suggest(_report(r))
    assert s == {"precision_bf16": {"precision": "bf16"}}
    d = s.details["precision_bf16"]
    assert d.finding == "perf.precision" and d.goal == "speed" and "10 ms → 5 ms" in d.hypothesis


def test_precision_pass_suggests_nothing():
    r = CheckResult("perf.precision", "pass", "recommend fp32", {"recommended": "fp32", "setup_precision": "fp32"})
    s = tropt.suggest(_report(r))
    assert not s and not s.hypotheses


def test_unstable_curve_suggests_clipping_and_lower_lr():
    curve = CheckResult("dynamics.loss_curve", "warn", "unstable", {"class": "unstable", "classes": "unstable",
                                                                     "spikes": 4, "grad_norm_p90": 2.5})
    lr = CheckResult("dynamics.lr_range", "pass", "in range", {"setup_lr": 0.3, "suggested_low": 0.1,
                                                               "suggested_high": 0.5})
    s = tropt.suggest(_report(curve, lr))
    assert s["grad_clip"] == {"grad_clip": 2.5} and s["lower_lr"] == {"lr": 0.1}
    assert "unstable" in s.details["grad_clip"].hypothesis and s.details["lower_lr"].finding == "dynamics.loss_curve"


def test_diverging_curve_fail_is_not_blocking():
    curve = CheckResult("dynamics.loss_curve", "fail", "diverging", {"class": "diverging", "classes": "diverging"})
    s = tropt.suggest(_report(curve), make_setup(lr=0.05))
    assert not s.blocking and "grad_clip" in s and s["lower_lr"]["lr"] == 0.0167  # 3x below the Setup's 0.05


def test_overfitting_suggests_weight_decay_and_early_stopping_as_hypothesis():
    curve = CheckResult("dynamics.loss_curve", "warn", "overfitting",
                        {"class": "overfitting", "classes": "overfitting", "val_best_step": 120.0})
    setup = make_setup(lr=0.05)
    s = tropt.suggest(_report(curve), setup)
    opt = s["weight_decay"]["optimizer"]
    assert isinstance(opt, WithWeightDecay) and opt(torch.nn.Linear(2, 2)).param_groups[0]["weight_decay"] == 0.01
    early = [h for h in s.hypotheses if h.name == "early_stopping"]
    assert early and not early[0].comparable and "step 120" in early[0].hypothesis
    assert "early_stopping=" in early[0].why_not_compared
    without = tropt.suggest(_report(curve))  # no Setup: the optimizer cannot be built, so it is a hypothesis
    assert "weight_decay" not in without and any(h.name == "weight_decay" for h in without.hypotheses)


def test_data_bound_loader_gets_workers():
    setup = _loader_setup()
    thr = CheckResult("perf.throughput", "warn", "data-loading bound",
                      {"limited_by": "data loading", "data_wait_ms": 4.0, "data_wait_share": 0.6, "device": "cpu"})
    s = tropt.suggest(_report(thr), setup)
    loader = s["loader_workers"]["train_data"]
    assert loader.num_workers >= 1 and loader.batch_size == 32 and loader.dataset is setup.train_data.dataset
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    assert setup.train_data.num_workers == 0  # the user's loader is untouched
    cheap = CheckResult("perf.throughput", "warn", "data-loading bound",
                        {"limited_by": "data loading", "data_wait_ms": 0.2, "data_wait_share": 0.3})
    s2 = tropt.suggest(_report(cheap), setup)  # sub-millisecond waits: workers would not help
    assert not s2 and s2.hypotheses[0].name == "whole_batch_indexing"


def test_compute_bound_suggests_a_larger_batch_saying_the_statistics_change():
    setup = _loader_setup()
    thr = CheckResult("perf.throughput", "pass", "compute-bound", {"limited_by": "compute", "batch_size": 32.0,
                                                                   "samples_per_s": 1000.0})
    s = tropt.suggest(_report(thr), setup)
    c = s["batch_x2"]
    assert c["train_data"].batch_size == 64 and c["lr"] == 0.1  # SGD: linear scaling
    assert "optimization statistics" in s.details["batch_x2"].hypothesis


def test_correctness_fail_blocks_every_candidate():
    leak = CheckResult("data.exact_duplicates", "fail", "20 val rows copy train rows", {"leaked_rows": 20})
    prec = CheckResult("perf.precision", "warn", "recommend bf16", {"recommended": "bf16", "setup_precision": "fp32"})
    s = tropt.suggest(_report(leak, prec))
    assert not s and [r.check for r in s.blocking] == ["data.exact_duplicates"]


def test_loader_like_refuses_custom_samplers():
    ds = torch.utils.data.TensorDataset(torch.zeros(8, 2))
    weighted = torch.utils.data.DataLoader(ds, batch_size=4,
                                           sampler=torch.utils.data.WeightedRandomSampler([1.0] * 8, 8))
    assert loader_like(weighted, num_workers=2) is None


def test_unstable_curve_without_a_known_lr_lists_the_lower_lr_as_a_hypothesis():
    curve = CheckResult("dynamics.loss_curve", "warn", "unstable", {"class": "unstable", "classes": "unstable"})
    s = tropt.suggest(_report(curve))
    assert s == {"grad_clip": {"grad_clip": 1.0}}
    assert [h.name for h in s.hypotheses] == ["lower_lr"] and "pass the Setup" in s.hypotheses[0].why_not_compared
