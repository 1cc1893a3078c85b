"""setup_from_lightning: a LightningModule's own automatic optimization, checked by the loop checks."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

pl = pytest.importorskip("lightning.pytorch")

from support import make_classification  # noqa: E402

import tropt  # noqa: E402
from tropt.errors import SetupError, StepError  # noqa: E402
from tropt.integrations.lightning import setup_from_lightning  # noqa: E402
from tropt.result import Status  # noqa: E402
from tropt.testing import untouched  # noqa: E402


class LitClassifier(pl.LightningModule):
    """A small classifier as a Lightning user writes it: self.log in training_step, a dict return."""

    def __init__(self, schedule: str | None = None, step_by_hand: bool = False, lr: float = 0.1,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(dropout), nn.Tanh(), nn.Linear(16, 3))
        self.schedule, self.step_by_hand, self.lr = schedule, step_by_hand, lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        if self.step_by_hand:  # BUG: Lightning already steps an interval="step" scheduler after each optimizer step
            self.lr_schedulers().step()
        return {"loss": loss}

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if self.schedule == "step":
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        if self.schedule == "epoch":
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]  # Lightning default: per epoch
        if self.schedule == "every_2":
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 2}}
        return opt


def loader(n: int = 64, batch: int = 16) -> torch.utils.data.DataLoader:
    x, y = make_classification(n=n)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)


def run(setup, checks) -> dict:
    return {r.check: r for r in tropt.diagnose(setup, checks=checks, progress=False).results}


def bad(results: dict) -> dict:
    return {c: (r.status.value, r.summary) for c, r in results.items() if r.status in (Status.FAIL, Status.ERROR)}


# ------------------------------------------------------------------ healthy modules pass
def test_healthy_module_passes_every_loop_check_and_is_not_modified():
    torch.manual_seed(0)
    module = LitClassifier(schedule="step")
    setup = setup_from_lightning(module, train_dataloaders=loader(), trainer_kwargs={"gradient_clip_val": 1.0})
    with untouched(setup, module):
        results = run(setup, ["loop"])
    assert not bad(results), bad(results)
    for cid in ("loop.zero_grad", "loop.accumulation", "loop.scheduler_cadence", "loop.resume", "loop.ddp",
                "loop.train_mode"):
        assert results[cid].status is Status.PASS, (cid, results[cid].summary)
    assert module._trainer is None  # the stand-in was attached to tropt's copies only


class CallsSelf(LitClassifier):
    """The common Lightning style: forward() defined, and training_step calls self(x)."""

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


def test_a_training_step_calling_self_runs_under_ddp():
    # Under loop.ddp the forward pass goes through DistributedDataParallel to training_step; the module's own forward
    # (what self(x) calls inside training_step) must stay its own.
    torch.manual_seed(0)
    setup = setup_from_lightning(CallsSelf(), train_dataloaders=loader())
    results = run(setup, ["loop.ddp", "loop.accumulation"])
    assert not bad(results), bad(results)
    assert results["loop.ddp"].status is Status.PASS, results["loop.ddp"].summary


def test_accumulate_grad_batches_4_passes_accumulation():
    torch.manual_seed(0)
    setup = setup_from_lightning(LitClassifier(), train_dataloaders=loader(),
                                 trainer_kwargs={"accumulate_grad_batches": 4, "gradient_clip_val": 0.5})
    assert (setup.accumulation_steps, setup.grad_clip, setup.precision) == (4, 0.5, "fp32")
    r = run(setup, ["loop.accumulation"])["loop.accumulation"]
    assert r.status is Status.PASS, r.summary
    assert r.metrics["k"] == 4


def test_per_step_scheduler_passes_scheduler_cadence():
    torch.manual_seed(0)
    setup = setup_from_lightning(LitClassifier(schedule="step"), train_dataloaders=loader(),
                                 trainer_kwargs={"accumulate_grad_batches": 4})
    r = run(setup, ["loop.scheduler_cadence"])["loop.scheduler_cadence"]
    assert r.status is Status.PASS, r.summary


def test_scheduler_also_stepped_in_training_step_fails_scheduler_cadence():
    torch.manual_seed(0)
    setup = setup_from_lightning(LitClassifier(schedule="step", step_by_hand=True), train_dataloaders=loader())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about lr_scheduler.step() before optimizer.step(): the bug itself
        results = run(setup, ["loop"])
    r = results["loop.scheduler_cadence"]
    assert r.status is Status.FAIL, r.summary
    assert "stepped 2 times per optimizer step" in r.summary, r.summary


@pytest.mark.parametrize("precision, scaler", [("16-mixed", True), ("bf16-mixed", False)])
def test_mixed_precision_reproduces_lightnings_scaler_order(precision, scaler):
    torch.manual_seed(0)
    setup = setup_from_lightning(LitClassifier(), train_dataloaders=loader(),
                                 trainer_kwargs={"precision": precision, "gradient_clip_val": 1.0,
                                                 "accumulate_grad_batches": 2})
    assert setup.use_scaler is scaler
    results = run(setup, ["loop.accumulation", "loop.loss_scaling", "loop.zero_grad"])
    assert not bad(results), bad(results)
    if scaler:
        assert results["loop.loss_scaling"].status is Status.PASS, results["loop.loss_scaling"].summary


# ------------------------------------------------------------------ Lightning's semantics, known answers
def lrs_over_steps(setup, n: int, k: int = 1) -> list[float]:
    """The learning rate after each of ``n`` calls of the Setup's step with ``k`` micro-batches."""
    ctx = setup.build()
    batch = setup.sample_batch()
    out = []
    for _ in range(n):
        setup.run_step(ctx, setup.split(batch, k))
        out.append(ctx.optimizer.param_groups[0]["lr"])
    return out


class HandWarmup(LitClassifier):
    """Hooks as Lightning's docs show them: a warm-up set by hand in optimizer_step, clipping in its own hook."""

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)
        scale = min(1.0, float(self.trainer.global_step + 1) / 4.0)
        for group in optimizer.param_groups:
            group["lr"] = scale * self.lr

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=0.02, gradient_clip_algorithm="norm")


@pytest.mark.parametrize("kwargs, schedule, cls", [
    ({"accumulate_grad_batches": 2, "gradient_clip_val": 0.05}, "step", LitClassifier),
    ({"accumulate_grad_batches": 1, "gradient_clip_val": 1e-3, "gradient_clip_algorithm": "value"}, "every_2",
     LitClassifier),
    ({"accumulate_grad_batches": 2}, "epoch", LitClassifier),
    ({"accumulate_grad_batches": 2}, None, HandWarmup),
])
def test_the_step_reproduces_a_real_trainer_fit(tmp_path, kwargs, schedule, cls):
    # The reference is Lightning itself: Trainer.fit for 3 optimizer steps vs 3 calls of the Setup's step on the
    # same batches (one accumulation cycle per call) reach the same parameters and learning rate.
    torch.manual_seed(0)
    module = cls(schedule=schedule, dropout=0.0)
    data = loader(n=96)
    setup = setup_from_lightning(module, train_dataloaders=data, trainer_kwargs=kwargs)
    ctx = setup.build()
    batches, acc = list(data), kwargs["accumulate_grad_batches"]
    for i in range(3):
        setup.run_step(ctx, batches[i * acc:(i + 1) * acc])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=tmp_path,
                             num_sanity_val_steps=0, **kwargs)
        trainer.fit(module, train_dataloaders=data)
    for (name, p), q in zip(module.named_parameters(), ctx.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5), name
    assert ctx.optimizer.param_groups[0]["lr"] == pytest.approx(trainer.optimizers[0].param_groups[0]["lr"])


def test_epoch_interval_steps_at_the_end_of_each_epoch():
    # 4 batches, accumulate_grad_batches=2: an epoch is 2 optimizer steps; StepLR halves the LR at each epoch end.
    setup = setup_from_lightning(LitClassifier(schedule="epoch", lr=0.8), train_dataloaders=loader(),
                                 trainer_kwargs={"accumulate_grad_batches": 2})
    assert lrs_over_steps(setup, 5, k=2) == pytest.approx([0.8, 0.4, 0.4, 0.2, 0.2])


def test_step_frequency_counts_batches_as_lightning_does():
    # frequency=2 with accumulate_grad_batches=1: every 2nd optimizer step; with 2 it is every step
    # (batch_idx + 1 = 2, 4).
    one = setup_from_lightning(LitClassifier(schedule="every_2", lr=0.8), train_dataloaders=loader())
    assert lrs_over_steps(one, 4) == pytest.approx([0.8, 0.4, 0.4, 0.2])
    two = setup_from_lightning(LitClassifier(schedule="every_2", lr=0.8), train_dataloaders=loader(),
                               trainer_kwargs={"accumulate_grad_batches": 2})
    assert lrs_over_steps(two, 2, k=2) == pytest.approx([0.4, 0.2])


def test_value_clipping_clips_each_gradient_entry():
    setup = setup_from_lightning(LitClassifier(), train_dataloaders=loader(),
                                 trainer_kwargs={"gradient_clip_val": 1e-3, "gradient_clip_algorithm": "value"})
    assert setup.grad_clip is None  # Setup.grad_clip is a norm; value clipping stays inside the step
    ctx = setup.build()
    seen = []
    ctx.optimizer.register_step_pre_hook(lambda opt, a, kw: seen.append(max(p.grad.abs().max().item()
                                                                            for g in opt.param_groups
                                                                            for p in g["params"]
                                                                            if p.grad is not None)))
    setup.run_step(ctx, [setup.sample_batch()])
    assert seen and seen[0] <= 1e-3 + 1e-9


def test_self_log_outside_a_trainer_is_silent():
    setup = setup_from_lightning(LitClassifier(), train_dataloaders=loader())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = setup.build()
        setup.run_step(ctx, setup.split(setup.sample_batch(), 2))
        setup.loss(ctx.model, setup.sample_batch())
    assert not [w for w in caught if "self.log" in str(w.message)], [str(w.message) for w in caught]


class FitData(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.calls = []

    def setup(self, stage: str) -> None:
        self.calls.append(stage)
        x, y = make_classification(n=48)
        self.train_set = torch.utils.data.TensorDataset(x, y)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_set, batch_size=16)


def test_datamodule_is_set_up_on_a_copy():
    dm = FitData()
    setup = setup_from_lightning(LitClassifier(), dm)
    assert dm.calls == [] and not hasattr(dm, "train_set")  # the user's datamodule keeps its state
    assert len(setup.train_data) == 3 and setup.val_data is None


def test_a_pytorch_lightning_module_without_batch_idx_reading_the_trainer():
    ptl = pytest.importorskip("pytorch_lightning")

    class Old(ptl.LightningModule):  # the standalone package's base class; training_step(batch) only
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 3)

        def training_step(self, batch):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=1e-2)
            total = self.trainer.estimated_stepping_batches  # 4 batches / 2 per step * 5 epochs
            assert total == 10 and isinstance(total, int)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=total)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    setup = setup_from_lightning(Old(), train_dataloaders=loader(),
                                 trainer_kwargs={"max_epochs": 5, "accumulate_grad_batches": 2})
    results = run(setup, ["loop.accumulation", "loop.scheduler_cadence", "loop.resume"])
    for cid, r in results.items():
        assert r.status is Status.PASS, (cid, r.summary)


def test_reading_what_the_trainer_stand_in_lacks_says_so():
    class ReadsLoader(LitClassifier):
        def training_step(self, batch, batch_idx):
            _ = self.trainer.train_dataloader  # not provided outside a Trainer
            return super().training_step(batch, batch_idx)

    setup = setup_from_lightning(ReadsLoader(), train_dataloaders=loader())
    with pytest.raises(StepError, match="stand-in for the Trainer does not have"):
        setup.validate()


# ------------------------------------------------------------------ bad inputs: what, why, how to fix
class NoStep(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 3)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TwoOptimizers(LitClassifier):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.Adam(self.net[3].parameters())]


class Manual(LitClassifier):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class Skips(LitClassifier):
    def training_step(self, batch, batch_idx):
        return None


@pytest.mark.parametrize("module, words", [
    (NoStep(), ["does not define training_step", "define training_step"]),
    (TwoOptimizers(), ["2 optimizers (SGD, Adam)", "one optimizer", "merge them"]),
    (Manual(), ["manual optimization", "step(ctx, micro_batches)"]),
    (nn.Linear(2, 2), ["not a LightningModule", "tropt.Setup"]),
])
def test_unusable_modules_raise_setup_error_with_the_fix(module, words):
    with pytest.raises(SetupError) as err:
        setup_from_lightning(module, train_dataloaders=loader())
    for w in words:
        assert w in str(err.value), str(err.value)
    assert err.value.fix


def test_skipped_training_step_is_a_clear_error():
    setup = setup_from_lightning(Skips(), train_dataloaders=loader())
    with pytest.raises(StepError, match="returned None"):
        setup.validate()


@pytest.mark.parametrize("kwargs, words", [
    ({"precision": "16-true"}, "'32-true', 'bf16-mixed' and '16-mixed'"),
    ({"accumulate_grad_batches": 0}, "integer >= 1"),
    ({"gradient_clip_algorithm": "l2"}, "'norm' or 'value'"),
])
def test_unsupported_trainer_kwargs_raise(kwargs, words):
    with pytest.raises(SetupError, match=words.replace("(", r"\(")):
        setup_from_lightning(LitClassifier(), train_dataloaders=loader(), trainer_kwargs=kwargs)


def test_no_training_data_raises():
    with pytest.raises(SetupError, match="no training data"):
        setup_from_lightning(LitClassifier())


def test_an_unsupported_lightning_version_is_named(monkeypatch):
    monkeypatch.setattr("tropt.integrations._frameworks.metadata.version", lambda dist: "1.9.5")
    with pytest.raises(SetupError, match=r"lightning 1\.9\.5 is installed.*>=2\.2,<3"):
        setup_from_lightning(LitClassifier(), train_dataloaders=loader())
