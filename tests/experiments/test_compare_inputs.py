"""Bad input gets a TroptError that says what, why and how to fix it, before any run starts."""

from __future__ import annotations

import math

import pytest
from support.compare_setups import adam, make_setup

import tropt
from tropt.errors import SetupError, StepError, TroptError

ADAM = {"adam": {"optimizer": adam()}}
BUDGET = tropt.Budget(steps=5)


def _compare(setup=None, candidates=ADAM, **kw):
    kw.setdefault("budget", BUDGET)
    return tropt.compare(setup or make_setup(), candidates, progress=False, **kw)


def test_unknown_setup_keyword_suggests_the_right_one():
    with pytest.raises(TroptError, match=r"unknown Setup keyword 'optimiser'.*did you mean 'optimizer'"):
        _compare(candidates={"x": {"optimiser": adam()}})


def test_a_yardstick_keyword_cannot_differ():
    with pytest.raises(TroptError, match="overrides 'val_data', which every run must share"):
        _compare(candidates={"x": {"val_data": []}})


def test_bad_override_value_names_the_candidate():
    with pytest.raises(SetupError, match="candidate 'k0': Setup: accumulation_steps=0"):
        _compare(candidates={"k0": {"accumulation_steps": 0}})


def test_empty_candidate_set():
    with pytest.raises(TroptError, match="candidate set is empty") as e:
        _compare(candidates={})
    assert "pass candidates=" in str(e.value)


def test_baseline_is_a_reserved_name():
    with pytest.raises(TroptError, match="named 'baseline'"):
        _compare(candidates={"baseline": {"lr": 0.1}})


@pytest.mark.parametrize("value, pattern", [("good", "returned a str"), (math.nan, "not a finite number")])
def test_metric_returning_a_non_number_or_nan(value, pattern):
    metric = tropt.Metric(lambda model, data: value, higher_is_better=True, name="acc")
    with pytest.raises(StepError, match=pattern):
        _compare(metric=metric)


@pytest.mark.parametrize("kw", [{"steps": 0}, {"steps": -3}, {"samples": 0}, {"seconds": -1.0}, {"seconds": 0}, {}])
def test_zero_negative_or_missing_budget(kw):
    with pytest.raises(TroptError, match="Budget"):
        tropt.Budget(**kw)


def test_budget_must_be_a_budget():
    with pytest.raises(TroptError, match=r"expected a tropt\.Budget"):
        _compare(budget={"steps": 10})


@pytest.mark.parametrize("seeds, pattern",
                         [((), "seed list is empty"), ((0, 0), "repeat a seed"), ("012", "not a list")])
def test_bad_seeds(seeds, pattern):
    with pytest.raises(TroptError, match=pattern):
        _compare(seeds=seeds)


def test_test_split_as_selection_split_is_refused():
    setup = make_setup()
    with pytest.raises(TroptError, match="selection split is named 'test'") as e:
        _compare(setup, splits={"test": setup.val_data}, select_split="test")
    assert "evaluate the winner on test once" in str(e.value)


def test_no_validation_split():
    setup = make_setup().replace(val_data=None)
    with pytest.raises(SetupError, match="compare selects on a validation split only"):
        _compare(setup)


def test_bad_guardrails_and_early_stopping():
    with pytest.raises(TroptError, match="max_quality_drop"):
        tropt.Guardrails(max_quality_drop=-1)
    with pytest.raises(TroptError, match="early_stopping"):
        _compare(early_stopping="soon")
    with pytest.raises(TroptError, match="executor"):
        _compare(executor=object())
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(1) as threads, pytest.raises(TroptError, match="share torch's global random state"):
        _compare(executor=threads)
    with pytest.raises(TroptError, match="tracking"):
        _compare(tracking=42)


def test_lr_override_must_be_positive():
    with pytest.raises(TroptError, match="lr=0"):
        _compare(candidates={"x": {"lr": 0}})


def test_lr_override_scales_every_param_group():
    import torch
    from torch import nn

    from tropt.experiments.candidates import ScaledLR

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    factory = lambda m: torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.1},  # noqa: E731
                                         {"params": m[1].parameters(), "lr": 1.0}])
    opt = ScaledLR(factory, 0.3)(model)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.3, 3.0])
