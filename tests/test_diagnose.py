import subprocess
import sys

import pandas as pd
import pytest
import torch

import tropt
from tropt import registry
from tropt.errors import CheckSelectionError, TroptError
from tropt.result import CheckResult, Status


@pytest.fixture
def fake_checks(monkeypatch):
    """Three temporary checks under public ids: one passes, one crashes, one needs splits."""
    calls = []

    def ok(setup, *, progress=True):
        calls.append(("ok", progress))
        return CheckResult("loop.zero_grad", Status.PASS, "fine")

    def crash(setup):
        raise ZeroDivisionError("division by zero deep inside")

    def data(splits, *, label=None, group=None):
        calls.append(("data", label, group))
        return CheckResult("data.group_leakage", Status.WARN, f"{len(splits)} splits, label {label}")

    def bad_input(setup):
        raise TroptError("the thing is wrong", "do the other thing")

    registry.load_checks()  # import the real check modules now: one imported later would register over a fake
    monkeypatch.setattr(registry, "_REGISTRY", {})  # only the fakes: real checks would change the selections
    for cid, fn, needs in [("loop.zero_grad", ok, "setup"), ("loop.resume", crash, "setup"),
                           ("data.group_leakage", data, "splits"), ("loop.scheduler_cadence", bad_input, "setup")]:
        monkeypatch.setitem(registry._REGISTRY, cid,
                            registry.CheckSpec(cid, registry.PUBLIC_IDS[cid], cid.title(), "test", fn, needs))
    return calls


IDS = ["loop.resume", "data.group_leakage", "loop.zero_grad", "loop.scheduler_cadence"]


def test_crashing_check_becomes_error_and_rest_still_run(tiny_setup, fake_checks):
    report = tropt.diagnose(tiny_setup, {"train": pd.DataFrame({"a": [1]}), "test": pd.DataFrame({"a": [2]})},
                            label="a", checks=IDS, progress=False)
    # contract order
    assert report.checks == ["data.group_leakage", "loop.zero_grad", "loop.scheduler_cadence", "loop.resume"]
    crash = report["loop.resume"]
    assert crash.status is Status.ERROR and "ZeroDivisionError: division by zero deep inside" in crash.summary
    assert "traceback" in crash.metrics and crash.duration_s is not None
    bad = report["loop.scheduler_cadence"]
    assert bad.status is Status.ERROR and bad.summary == "could not run: the thing is wrong — do the other thing"
    assert bad.advice == ["do the other thing"] and "traceback" not in bad.metrics
    assert (report["loop.zero_grad"].status is Status.PASS
            and report["data.group_leakage"].summary == "2 splits, label a")
    assert ("ok", False) in fake_checks and ("data", "a", None) in fake_checks  # options passed by signature
    assert report.status is Status.ERROR  # PASS, WARN, ERROR, ERROR: the worst
    assert report.identity["seed"] == 0 and report.identity["data_fingerprint"]


def test_inapplicable_checks_skip_with_reason(tiny_setup, fake_checks):
    report = tropt.diagnose(tiny_setup, checks=IDS, progress=False)
    assert (report["data.group_leakage"].status is Status.SKIP
            and "no data splits" in report["data.group_leakage"].summary)
    report = tropt.diagnose(splits={"a": pd.DataFrame({"x": [1]})}, checks=IDS, progress=False)
    assert report["loop.zero_grad"].status is Status.SKIP and "no Setup given" in report["loop.zero_grad"].summary


def test_invalid_setup_errors_setup_checks_but_data_checks_run(fake_checks):
    from support import make_classification

    x, y = make_classification()
    setup = tropt.Setup(torch.nn.Linear(8, 3),
                        lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1], reduction="none"),
                        lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [(x, y)])
    report = tropt.diagnose(setup, {"a": pd.DataFrame({"x": [1]})}, checks=IDS, progress=False)
    for cid in ("loop.zero_grad", "loop.resume"):
        assert report[cid].status is Status.ERROR and "expected a scalar" in report[cid].summary
    assert report["data.group_leakage"].status is Status.WARN


def test_selection(fake_checks, monkeypatch):
    assert [s.id for s in registry.select("loop")] == ["loop.zero_grad", "loop.scheduler_cadence", "loop.resume"]
    assert [s.id for s in registry.select(["1"])] == ["data.group_leakage"]
    with pytest.raises(CheckSelectionError, match=r"unknown check 'loop\.nonsense'"):
        registry.select(["loop.nonsense"])
    with pytest.raises(CheckSelectionError, match="not implemented"):
        monkeypatch.delitem(registry._REGISTRY, "loop.ddp", raising=False)
        registry.select(["loop.ddp"])


def test_bad_diagnose_arguments(tiny_setup):
    with pytest.raises(TroptError, match="needs something to check"):
        tropt.diagnose()
    with pytest.raises(TroptError, match=r"expected a tropt\.Setup"):
        tropt.diagnose(setup=torch.nn.Linear(2, 2))
    with pytest.raises(TroptError, match="expected a mapping"):
        tropt.diagnose(splits=[1, 2])


def test_list_checks_matches_registry():
    df = tropt.list_checks()
    assert list(df.columns) == ["id", "stage", "stage_name", "title", "needs", "description"]
    assert set(df["id"]) <= set(registry.PUBLIC_IDS)
    assert list(df["id"]) == sorted(df["id"], key=list(registry.PUBLIC_IDS).index)


def test_register_rejects_unknown_ids():
    with pytest.raises(ValueError, match="not a public check id"):
        registry.register("loop.made_up", title="x", description="y")


def test_import_is_light_and_side_effect_free():
    code = (
        "import sys, tropt, tropt.result, tropt.setup, tropt.registry;"
        "heavy=[m for m in ('matplotlib','seaborn','ipywidgets','papermill','nbconvert') if m in sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = ("import pandas as pd, torch; o=pd.get_option('display.max_rows'); import tropt; tropt.Setup; "
            "tropt.list_checks(); print(pd.get_option('display.max_rows')==o, torch.get_default_dtype())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "torch.float32"]


def test_diagnose_stays_the_function_after_submodule_imports():
    code = ("import tropt, tropt.diagnosis, tropt.data.splits; "
            "print(callable(tropt.diagnose), tropt.diagnose.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "tropt.diagnosis"]


def test_options_reach_one_check_and_typos_are_errors():
    import pytest
    import torch
    from support import ce_loss, make_classification
    from torch import nn

    import tropt
    from tropt.errors import TroptError

    x, y = make_classification(n=64, d=8, classes=3, seed=0)
    torch.manual_seed(0)
    setup = tropt.Setup(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3)), ce_loss,
                        lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), [(x[:32], y[:32]), (x[32:], y[32:])])
    plain = tropt.diagnose(setup, checks=["perf.memory"], progress=False)["perf.memory"]
    tiny = tropt.diagnose(setup, checks=["perf.memory"], progress=False,
                          options={"perf.memory": {"memory_limit": 1e-5}})["perf.memory"]  # ~10 KiB: nothing fits
    assert plain.status is tropt.Status.PASS, plain.summary  # on CPU no limit is assumed: no fit verdict
    assert tiny.status is tropt.Status.FAIL, tiny.summary
    with pytest.raises(TroptError, match="takes no keyword 'memory_limt'"):
        tropt.diagnose(setup, checks=["perf.memory"], progress=False, options={"perf.memory": {"memory_limt": 80}})
    with pytest.raises(TroptError, match="not among the selected checks"):
        tropt.diagnose(setup, checks=["perf.memory"], progress=False, options={"loop.ddp": {}})
