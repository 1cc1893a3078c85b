"""Identity that re-runs the winner (issue #30): the data fingerprint covers all the data a run reads, the code
identity hashes loss_fn/step and what they close over, optimizers and candidates carry their own identity, and a
selection split equal by content to a final split is refused."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest
import torch
from support.compare_setups import make_setup, sgd
from torch.nn import functional as F

import tropt
from tropt.errors import TroptError
from tropt.identity import fingerprint, run_identity


def _listed(**kw) -> tropt.Setup:
    return make_setup(shuffled=False, **kw)


def test_the_fingerprint_covers_a_later_training_batch_and_the_validation_split():
    setup = _listed()
    base = fingerprint(setup)[0]
    assert base and fingerprint(_listed())[0] == base  # reproducible
    later = list(setup.train_data)
    x, y = later[-1]
    later[-1] = (x + 1.0, y)  # the last training batch only: the first batch (the old fingerprint) is unchanged
    assert fingerprint(setup.replace(train_data=later))[0] != base
    (vx, vy), = setup.val_data
    assert fingerprint(setup.replace(val_data=[(vx, (vy + 1) % 3)]))[0] != base  # the validation labels only


def test_the_fingerprint_is_order_free_and_its_bound_is_said(monkeypatch):
    setup = _listed()
    assert fingerprint(setup.replace(train_data=list(reversed(setup.train_data))))[0] == fingerprint(setup)[0]
    import tropt.identity as ident

    monkeypatch.setattr(ident, "FINGERPRINT_MAX_BATCHES", 2)
    cov = run_identity(setup)["data_fingerprint_coverage"]
    assert "train: the first 2 batches (64 rows" in cov


def _scaled_loss(scale: float):
    def loss(model, batch):
        x, y = batch
        return scale * F.cross_entropy(model(x), y)
    return loss


def test_the_configuration_hash_covers_the_loss_body_and_what_it_closes_over():
    one, two = _listed().replace(loss_fn=_scaled_loss(1.0)), _listed().replace(loss_fn=_scaled_loss(2.0))
    assert one.loss_fn.__qualname__ == two.loss_fn.__qualname__  # the same name: only the closed-over value differs
    assert run_identity(one)["config_hash"] != run_identity(two)["config_hash"]
    assert run_identity(one)["config_hash"] == run_identity(_listed().replace(loss_fn=_scaled_loss(1.0)))["config_hash"]

    def step_a(ctx, batch):
        return tropt.standard_step(ctx, batch)

    def step_b(ctx, batch):
        out = tropt.standard_step(ctx, batch)
        return out
    step_b.__qualname__ = step_a.__qualname__
    assert run_identity(_listed(step=step_a))["config_hash"] != run_identity(_listed(step=step_b))["config_hash"]


def test_the_git_commit_is_the_user_code_files_repository(tmp_path):
    repo = tmp_path / "user"
    repo.mkdir()
    (repo / "userloss.py").write_text("from torch.nn import functional as F\n\n\ndef loss(model, batch):\n"
                                      "    x, y = batch\n    return F.cross_entropy(model(x), y)\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "userloss.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "loss"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    spec = importlib.util.spec_from_file_location("userloss_h9", repo / "userloss.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ident = run_identity(_listed().replace(loss_fn=mod.loss))
    assert ident["git_commit"] == head and ident["code_file"].endswith("userloss.py")


def _grouped(wd: float):
    def factory(m):
        first, *rest = list(m.parameters())
        return torch.optim.Adam([{"params": [first], "weight_decay": wd}, {"params": rest}], lr=1e-3)
    return factory


def test_every_param_group_hyperparameter_is_recorded():
    a = run_identity(_listed().replace(optimizer=_grouped(0.1)))
    b = run_identity(_listed().replace(optimizer=_grouped(0.2)))
    assert a["config_hash"] != b["config_hash"]
    groups = a["optimizers"][0]["groups"]
    assert a["optimizers"][0]["class"] == "Adam" and groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0
    assert groups[0]["betas"] == [0.9, 0.999]


def test_each_candidate_has_its_own_identity():
    setup = _listed()
    comp = tropt.compare(setup, {"a": {"optimizer": sgd(0.02)}, "b": {"optimizer": sgd(0.08)}},
                         budget=tropt.Budget(steps=2), seeds=(0, 1), reinit=True, confirm=0, progress=False)
    ids = comp.meta["candidate_identities"]
    base = comp.meta["identity"]["config_hash"]
    assert ids["a"]["config_hash"] != ids["b"]["config_hash"]  # two lambdas of one qualname, other closed-over LRs
    assert base not in (ids["a"]["config_hash"], ids["b"]["config_hash"])
    assert ids["a"]["optimizers"][0]["groups"][0]["lr"] == 0.02
    from tropt.experiments.plan import OptimizationPlan

    rep = tropt.Report([tropt.CheckResult("dynamics.loss_curve", "pass", "healthy")],
                       {"tropt": tropt.__version__, **comp.meta["identity"]})
    plan = OptimizationPlan.from_report(rep, comp)
    shown = {iv["name"]: iv["identity"].get("candidate_config_hash") for iv in plan.interventions}
    assert shown == {"a": ids["a"]["config_hash"], "b": ids["b"]["config_hash"]}


def test_a_validation_split_equal_to_a_final_split_by_content_is_refused():
    setup = _listed()
    test_copy = [tuple(t.clone() for t in b) for b in setup.val_data]
    with pytest.raises(TroptError, match="same content as the final split 'holdout'"):
        tropt.compare(setup, {"a": {"lr": 0.1}}, budget=tropt.Budget(steps=2), seeds=(0, 1), reinit=True,
                      confirm=0, progress=False, splits={"holdout": test_copy})


def test_a_distinct_final_split_is_accepted():
    setup = _listed()
    other = [(torch.randn(16, 8, generator=torch.Generator().manual_seed(5)), torch.zeros(16, dtype=torch.long))]
    comp = tropt.compare(setup, {"a": {"lr": 0.1}}, budget=tropt.Budget(steps=2), seeds=(0, 1), reinit=True,
                         confirm=0, progress=False, splits={"test": other})
    assert any("never used for selection" in n for n in comp.notes)

