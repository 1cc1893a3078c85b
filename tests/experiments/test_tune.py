"""Search over a space on Optuna's samplers (issue #30): quasi-random by default, TPE on request, resumable
storage, the decision layer on top (the best configuration compared with the baseline over paired seeds), and
nuisance hyperparameters re-tuned per scientific choice."""

from __future__ import annotations

import typing

import pytest
from support.compare_setups import adam, make_setup

from tropt import Budget
from tropt.errors import TroptError

optuna = pytest.importorskip("optuna")
from tropt.experiments import tune  # noqa: E402

SPACE = {"lr": (1e-4, 1.0, "log")}
KW = {"budget": Budget(steps=40), "reinit": True, "confirm": 0, "progress": False}


def test_quasi_random_search_finds_a_higher_lr_and_compare_adopts_it(tmp_path):
    out = tune(make_setup(lr=1e-3), SPACE, n_trials=6, storage=str(tmp_path / "s.journal"), **KW)
    study = out.studies["tuned"]
    assert isinstance(study.sampler, optuna.samplers.QMCSampler) and len(study.trials) == 6
    assert out.best["tuned"]["lr"] > 0.03  # 1e-3 is ~80x below what trains this MLP in 40 steps
    d = out.decision().set_index("candidate")
    assert d.loc["tuned", "verdict"] == "adopt" and out.comparison.meta["seeds"] == [0, 1, 2]
    assert out.comparison.meta["tuning"]["studies"] == {"tuned": "tropt/tuned"}


def test_a_study_resumes_from_its_storage(tmp_path):
    where = str(tmp_path / "tune.db")
    first = tune(make_setup(lr=1e-3), SPACE, n_trials=3, storage=where, sampler="tpe", **KW)
    again = tune(make_setup(lr=1e-3), SPACE, n_trials=5, storage=where, sampler="tpe", **KW)
    assert first.trials == {"tuned": 3} and again.trials == {"tuned": 2}  # only the missing trials ran
    assert len(again.studies["tuned"].trials) == 5 and isinstance(again.studies["tuned"].sampler,
                                                                  optuna.samplers.TPESampler)


def test_each_scientific_choice_gets_its_own_learning_rate(tmp_path):
    out = tune(make_setup(lr=1e-3), SPACE, n_trials=6, storage=str(tmp_path / "s.journal"),
               scientific={"sgd": {}, "adam": {"optimizer": adam(1e-3)}}, **KW)
    assert set(out.studies) == {"sgd", "adam"} and set(out.comparison.candidates) == {"baseline", "sgd", "adam"}
    lr_sgd, lr_adam = out.best["sgd"]["lr"], out.best["adam"]["lr"]
    assert lr_sgd != lr_adam and lr_adam < lr_sgd  # Adam at its best LR against SGD at its own, never one LR


def test_a_bad_space_fails_before_any_trial(tmp_path):
    with pytest.raises(TroptError, match="not a Setup keyword"):
        tune(make_setup(), {"loss_fn": [1]}, storage=str(tmp_path / "x.journal"), **KW)
    with pytest.raises(TroptError, match="the range of 'lr'"):
        tune(make_setup(), {"lr": (1.0, 0.1)}, storage=str(tmp_path / "x.journal"), **KW)


def test_trials_run_on_an_executor_give_the_sequential_search(tmp_path):
    """The trials go to the executor's workers through ask/tell (the study stays here): with the quasi-random
    sampler the suggestions and the runs are deterministic, so the study equals the sequential one."""
    import concurrent.futures as cf
    import multiprocessing
    import pickle

    class Counting(cf.ProcessPoolExecutor):
        """A process pool that notes the name of every run submitted to it."""

        names: typing.ClassVar[list] = []

        def submit(self, fn, /, *args, **kwargs):
            Counting.names.append(pickle.loads(args[0]).candidate)
            return super().submit(fn, *args, **kwargs)

    kw = {**KW, "n_trials": 4}
    seq = tune(make_setup(lr=1e-3), SPACE, storage=str(tmp_path / "a.journal"), **kw)
    with Counting(2, mp_context=multiprocessing.get_context("fork")) as ex:
        par = tune(make_setup(lr=1e-3), SPACE, storage=str(tmp_path / "b.journal"), executor=ex, **kw)
    assert sorted(n for n in Counting.names if n.startswith("trial")) == [f"trial {i}" for i in range(4)]
    values = lambda out: [(t.params["lr"], t.value) for t in out.studies["tuned"].trials]  # noqa: E731
    assert len(values(par)) == 4 and values(par) == values(seq)
    assert par.best == seq.best
