"""A Lightning port (held-out probe "vision"), through ``tropt.integrations.lightning.setup_from_lightning``.
Paraphrased, never copied.

``lightning_mixup_onecycle``: the Lightning docs' / lightning-tutorials' image-classifier pattern
(Lightning-AI/tutorials ``lightning_examples/cifar10-baseline/baseline.py``: ``LitResnet`` whose
``configure_optimizers`` returns SGD and ``OneCycleLR(max_lr, total_steps=self.trainer.estimated_stepping_batches)``
with ``"interval": "step"``), with mixup drawn inside ``training_step`` from ``torch.distributions.Beta(0.4, 0.4)`` and
a random permutation (the common "mixup in training_step" recipe), ``self.log`` of the loss, label-smoothed CE on
validation
``Trainer(max_epochs=10, gradient_clip_val=1.0)``.

Planted bug:
- ``lightning_onecycle_interval_epoch``: the scheduler returned without ``"interval": "step"`` (Lightning's default
  interval is "epoch"), though OneCycleLR is sized by ``estimated_stepping_batches`` (optimizer steps): the
  one-cycle schedule advances once per epoch (Lightning docs, "configure_optimizers": the lr_scheduler config's
  ``interval`` defaults to 'epoch'; a frequent forum / issue report).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ports import Bug, Port
from ports.heldout.vision_data import C, images


def lit_module(interval_step: bool = True):
    import lightning.pytorch as pl

    class LitMixup(pl.LightningModule):
        def __init__(self, lr: float = 0.05) -> None:
            super().__init__()
            self.lr = lr
            self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                     nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
                                     nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, C))
            self.beta = torch.distributions.Beta(torch.tensor(0.4), torch.tensor(0.4))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            lam = float(self.beta.sample())
            perm = torch.randperm(x.size(0))
            logits = self(lam * x + (1 - lam) * x[perm])
            loss = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, y[perm])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y, label_smoothing=0.1)
            self.log("val_loss", loss)
            return loss

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=5e-4)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1,
                                                        total_steps=self.trainer.estimated_stepping_batches)
            cfg = {"scheduler": sched, "interval": "step"} if interval_step else {"scheduler": sched}
            return {"optimizer": opt, "lr_scheduler": cfg}

    return LitMixup()


def loaders(seed: int, n: int = 96):
    x, y = images(n, seed)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=False)


def lightning_setup(*, interval_step: bool = True):
    """Lightning-AI/tutorials cifar10-baseline: SGD with OneCycleLR sized by estimated_stepping_batches, stepped per
    optimizer step (``interval_step=False``: the planted default interval "epoch"), mixup inside training_step."""
    from tropt.integrations.lightning import setup_from_lightning

    torch.manual_seed(0)
    return setup_from_lightning(lit_module(interval_step), train_dataloaders=loaders(0), val_dataloaders=loaders(1),
                                trainer_kwargs={"max_epochs": 10, "gradient_clip_val": 1.0})


LT = "Lightning-AI/tutorials/lightning_examples/cifar10-baseline/baseline.py"

PORTS: list[Port] = [
    Port("lightning_mixup_onecycle", "lightning", LT, lightning_setup, needs=("lightning",),
         notes={"loop.accumulation": "BatchNorm's batch statistics differ between micro-batches by design",
                "data.sampling": "the probe's loader is not shuffled (the tutorial's is)"}, bugs=(
             Bug("lightning_onecycle_interval_epoch", "loop.scheduler_cadence", ("epoch",),
                 lambda: lightning_setup(interval_step=False),
                 source="Lightning docs, LightningModule.configure_optimizers: lr_scheduler_config 'interval' "
                        "defaults to 'epoch'"),
         )),
]
