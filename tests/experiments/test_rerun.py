"""Re-running the winner from plan.json alone (issue #30): the plan carries reinit, eval_every, the selection rule,
seeds and budget, and ``tropt.experiments.rerun`` reproduces its numbers bit for bit on CPU; a plan mixing two
Setups is refused, naming both identities."""

from __future__ import annotations

import pytest
from support.compare_setups import make_setup, sgd
from support.synthetic_comparisons import comparison

import tropt
from tropt.errors import TroptError
from tropt.experiments import rerun
from tropt.experiments.plan import OptimizationPlan

SEEDS = (0, 1, 2)


def _healthy():
    return tropt.Report([tropt.CheckResult("dynamics.loss_curve", "pass", "healthy")], {"tropt": tropt.__version__})


@pytest.fixture(scope="module")
def adopted(tmp_path_factory):
    """A too-low learning rate (1e-3 where 0.3 trains): lr=0.3 and a faster SGD factory are compared and one is
    adopted; the plan is written to plan.json."""
    setup = make_setup(lr=1e-3)
    comp = tropt.compare(setup, {"lr_big": {"lr": 0.3}, "momentum": {"optimizer": sgd(0.01, 0.9)}},
                         budget=tropt.Budget(steps=40), seeds=SEEDS, reinit=True, eval_every=7, select="best",
                         confirm=0, progress=False)
    plan = OptimizationPlan.from_report(_healthy(), comp)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    plan.to_json(path)
    return setup, comp, plan, path


def test_plan_json_carries_what_a_rerun_needs(adopted):
    _, comp, plan, path = adopted
    rec = OptimizationPlan.from_json(str(path)).rerun
    assert plan.outcome == "adopt" and rec["candidate"] == plan.adopted[0]["name"]
    assert rec["reinit"] is True and rec["eval_every"] == 7 and rec["select"] == "best"
    assert rec["seeds"] == list(SEEDS) and rec["budget"]["steps"] == 40 and rec["select_split"] == "val"
    assert rec["identity"]["config_hash"] == comp.meta["identity"]["config_hash"]
    assert set(rec["scores"]) == {"baseline", rec["candidate"]} and len(rec["scores"]["baseline"]) == 3


def test_rerun_from_the_plan_alone_reproduces_its_scores_bit_for_bit(adopted):
    _, comp, plan, path = adopted
    name = plan.adopted[0]["name"]
    given = {"momentum": {"optimizer": sgd(0.01, 0.9)}} if name == "momentum" else None
    again = rerun(str(path), make_setup(lr=1e-3), candidates=given)
    assert again.reproduced and len(again.rows) == 6
    want = {(r["candidate"], r["seed"]): r["score"] for r in comp.records if r["candidate"] in ("baseline", name)}
    assert {(r["candidate"], r["seed"]): r["rerun"] for r in again.rows} == want


def test_rerun_on_another_setup_is_refused_naming_both_identities(adopted):
    *_, path = adopted
    other = make_setup(lr=1e-3, n_train=224)
    with pytest.raises(TroptError, match=r"compared on one Setup .*config_hash.*and this is another"):
        rerun(str(path), other, candidates={"momentum": {"optimizer": sgd(0.01, 0.9)}})


def test_a_factory_the_plan_cannot_hold_must_be_given_again():
    setup = make_setup(lr=1e-3)
    comp = tropt.compare(setup, {"momentum": {"optimizer": sgd(0.05, 0.9)}}, budget=tropt.Budget(steps=30),
                         seeds=SEEDS, reinit=True, confirm=0, progress=False)
    plan = OptimizationPlan.from_report(_healthy(), comp)
    if not plan.adopted:
        pytest.skip("the momentum candidate was not adopted on this platform")
    with pytest.raises(TroptError, match=r"overrides \['optimizer'\].*SGD"):
        rerun(plan, setup)


def test_a_plan_from_two_setups_is_refused_naming_both():
    rep = tropt.Report([tropt.CheckResult("dynamics.loss_curve", "pass", "healthy")],
                       {"tropt": tropt.__version__, "config_hash": "aaaa1111", "data_fingerprint": "fp-one"})
    comp = comparison({"baseline": {0: 1.0, 1: 1.03, 2: 0.98}, "a": {0: 0.9, 1: 0.93, 2: 0.88}})
    comp.meta["identity"] = {"config_hash": "bbbb2222", "data_fingerprint": "fp-two"}
    with pytest.raises(TroptError, match=r"config_hash aaaa1111, data_fingerprint fp-one.*config_hash bbbb2222"):
        OptimizationPlan.from_report(rep, comp)


def test_the_cli_reruns_a_plan_and_exits_0_when_its_scores_come_back(adopted, tmp_path, capsys):
    from tropt.cli import main

    *_, path = adopted
    setup_file = tmp_path / "my_setup.py"
    setup_file.write_text("from support.compare_setups import make_setup, sgd\n\n\ndef make():\n"
                          "    return make_setup(lr=1e-3)\n\n\ndef given():\n"
                          "    return {'momentum': {'optimizer': sgd(0.01, 0.9)}}\n")
    code = main(["rerun", str(path), "--setup", f"{setup_file}:make", "--candidates", f"{setup_file}:given",
                 "--json", str(tmp_path / "rerun.json")])
    out = capsys.readouterr().out
    assert code == 0 and "6 of 6 scores reproduced" in out and (tmp_path / "rerun.json").exists()


def test_rerun_and_tune_are_public_and_light():
    import subprocess
    import sys

    code = ("import sys, tropt; import tropt.experiments.replay, tropt.experiments.search, tropt.experiments.pruning;"
            "print(callable(tropt.rerun), tropt.rerun is tropt.experiments.rerun, callable(tropt.tune), "
            "tropt.tune is tropt.experiments.tune, 'optuna' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "True", "False"]
