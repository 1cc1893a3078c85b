"""TroptTrainerCallback inside a real ``transformers.Trainer.train`` of a tiny GPT-2 built from a config (offline)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tropt.errors import TroptError  # noqa: E402
from tropt.integrations.hf import TroptTrainerCallback  # noqa: E402
from tropt.integrations.live import TroptLiveWarning  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """Repeating token patterns a tiny GPT-2 learns within a few dozen steps."""

    def __init__(self, n=64, length=16, vocab=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (starts + torch.arange(length)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=32, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(cfg)


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), max_steps=60, per_device_train_batch_size=8, learning_rate=3e-3,
                logging_steps=5, report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
                dataloader_num_workers=0)
    base.update(kw)
    return transformers.TrainingArguments(**base)


class NanAfter(transformers.Trainer):
    """Planted problem: from optimizer step ``at`` on, the loss (so every gradient) is NaN."""

    at = 15

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if self.state.global_step >= self.at:
            loss = loss * float("nan")
        return loss


def test_healthy_train_writes_a_report(tmp_path):
    cb = TroptTrainerCallback(every=10)
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TroptLiveWarning)
        trainer = transformers.Trainer(model=model, args=_args(tmp_path, eval_strategy="steps", eval_steps=20),
                                       train_dataset=Tokens(), eval_dataset=Tokens(16, seed=1), callbacks=[cb])
        trainer.train()
    found = json.loads((tmp_path / "out" / "tropt" / "findings.json").read_text())
    checks = {r["check"]: r for r in found["results"]}
    assert checks["model.gradient_flow"]["status"] == "pass"
    assert checks["model.gradient_flow"]["metrics"]["recorded_steps"] == 6  # one optimizer step in 10 (sample_every=10)
    curve = checks["dynamics.loss_curve"]
    assert curve["status"] in ("pass", "warn") and curve["metrics"]["points"] == 60  # one loss per optimizer step
    assert curve["metrics"]["val_points"] == 3
    assert (tmp_path / "out" / "tropt" / "report.html").exists()
    assert not model._forward_hooks  # the loss hook is gone


def test_nonfinite_gradients_are_warned_and_stop_on_stops(tmp_path):
    cb = TroptTrainerCallback(every=5, stop_on="nonfinite", sample_every=1)  # record the NaN steps (15-19) too
    trainer = NanAfter(model=_model(), args=_args(tmp_path), train_dataset=Tokens(), callbacks=[cb])
    with pytest.warns(TroptLiveWarning, match="non-finite"):
        trainer.train()
    assert trainer.state.global_step == 20  # NaN from step 15, seen at the check at step 20, stopped there
    assert {e.kind for e in cb.events} == {"nonfinite"}
    found = json.loads((tmp_path / "out" / "tropt" / "findings.json").read_text())
    assert {r["check"]: r["status"] for r in found["results"]} == {"model.gradient_flow": "fail",
                                                                   "dynamics.loss_curve": "fail"}


def test_without_stop_on_training_runs_to_the_end(tmp_path):
    cb = TroptTrainerCallback(every=5)
    trainer = NanAfter(model=_model(), args=_args(tmp_path, max_steps=30), train_dataset=Tokens(), callbacks=[cb])
    with pytest.warns(TroptLiveWarning):
        trainer.train()
    assert trainer.state.global_step == 30 and cb.events


def test_logs_to_tensorboard_via_report_to(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = TroptTrainerCallback(every=10)
    trainer = transformers.Trainer(model=_model(), args=_args(tmp_path, max_steps=20, report_to="tensorboard"),
                                   train_dataset=Tokens(), callbacks=[cb])
    trainer.train()
    acc = EventAccumulator(str(tmp_path / "out" / "runs" / "tropt"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("tropt/grad_norm/global")] == [0, 10]  # one step in 10 recorded
    assert "tropt/model.gradient_flow" in acc.Tags()["images"]


@pytest.mark.parametrize("accumulation", [1, 4])
def test_step_loss_matches_the_trainers_logged_loss(tmp_path, accumulation):
    """With gradient accumulation the Trainer passes num_items_in_batch and each micro-batch loss is a share of the
    step's: the callback sums them (a mean would read the loss 4x too small)."""
    cb = TroptTrainerCallback(every=100)
    trainer = transformers.Trainer(model=_model(), args=_args(tmp_path, max_steps=12, logging_steps=1,
                                                               per_device_train_batch_size=2,
                                                               gradient_accumulation_steps=accumulation),
                                   train_dataset=Tokens(), callbacks=[cb])
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == len(cb.live.train_loss) == 12
    np.testing.assert_allclose(cb.live.train_loss, logged, rtol=2e-3)


def test_loss_from_logs_sees_a_compute_loss_override(tmp_path):
    """NanAfter makes the loss NaN in compute_loss, after the forward: only the logged loss shows it at once."""
    cb = TroptTrainerCallback(every=5, loss_from="logs", checks="loss_curve")
    trainer = NanAfter(model=_model(), args=_args(tmp_path, max_steps=20, logging_steps=1,
                                                  logging_nan_inf_filter=False), train_dataset=Tokens(), callbacks=[cb])
    with pytest.warns(TroptLiveWarning, match="the first at step 16"):
        trainer.train()
    assert not trainer.model._forward_hooks
    with pytest.raises(TroptError, match="loss_from"):
        TroptTrainerCallback(loss_from="forward")


def test_an_unsupported_transformers_version_is_named(monkeypatch):
    from tropt.errors import SetupError

    monkeypatch.setattr("tropt.integrations._frameworks.metadata.version", lambda dist: "4.30.0")
    with pytest.raises(SetupError, match=r"transformers 4\.30\.0 is installed.*>=4\.46,<6"):
        TroptTrainerCallback()
