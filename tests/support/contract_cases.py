"""Known-answer setups for the four contract checks of issue #20 (data.sampling, data.eval_transforms,
model.eval_metric, loop.train_mode): one healthy setup and one planted defect per case, each with the statuses the
four checks must give (import with ``from support.contract_cases import ...``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import tropt
from tropt.result import Status

NEW = ["data.sampling", "data.eval_transforms", "model.eval_metric", "loop.train_mode"]
P, W, F_, S = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP
D, C = 6, 4  # features, classes
MEAN, STD = 5.0, 3.0  # the raw features' scale; the training transform standardises it


def raw(n: int = 384, classes: int = C, seed: int = 0, shares: list[float] | None = None):
    """Raw features (mean 5, std 3) and labels a linear model can learn; balanced unless ``shares`` is given."""
    g = torch.Generator().manual_seed(seed)
    if shares is None:
        y = (torch.arange(n) % classes)[torch.randperm(n, generator=g)]
    else:
        y = torch.multinomial(torch.tensor(shares), n, replacement=True, generator=g)
    x = torch.randn(n, D, generator=g)
    x[:, 0] += 3.0 * y.float()
    return MEAN + STD * x, y


def normalise(x: torch.Tensor) -> torch.Tensor:
    return (x - MEAN) / STD


class Items(Dataset):
    """A map-style dataset of (transform(x_i), y_i): the transform runs when an item is read, as torchvision's do."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform=normalise) -> None:
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.transform(self.x[i]), self.y[i]


def noisy(x: torch.Tensor) -> torch.Tensor:
    """A random augmentation (jitter) on top of the normalisation."""
    return normalise(x) + 0.1 * torch.randn_like(x)


class EpochLoader(DataLoader):
    """A DataLoader that calls ``sampler.set_epoch`` at every pass, as Accelerate's and Lightning's loaders do."""

    def __iter__(self):
        self.sampler.set_epoch(getattr(self, "_epoch", 0))
        self._epoch = getattr(self, "_epoch", 0) + 1
        return super().__iter__()


def net(bn: bool = True, dropout: float = 0.1, classes: int = C) -> nn.Module:
    torch.manual_seed(0)
    layers = ([nn.Linear(D, 64)] + ([nn.BatchNorm1d(64)] if bn else [])
              + [nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, classes)])
    return nn.Sequential(*layers)


def ce(model: nn.Module, batch) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def accuracy(model: nn.Module, loader) -> float:
    correct = total = 0
    for x, y in loader:
        correct += int((model(x).argmax(1) == y).sum())
        total += len(y)
    return correct / total


def balanced_accuracy(model: nn.Module, loader) -> float:
    preds, ys = [], []
    for x, y in loader:
        preds.append(model(x).argmax(1))
        ys.append(y)
    p, t = torch.cat(preds), torch.cat(ys)
    recalls = [float(((p == c) & (t == c)).sum()) / int((t == c).sum()) for c in t.unique()]
    return sum(recalls) / len(recalls)


def make(train=None, val="default", model=None, metric="default", **kw) -> tropt.Setup:
    """A correct setup: shuffled training loader, validation prepared the same way, accuracy on balanced labels."""
    x, y = raw()
    train = DataLoader(Items(x, y), batch_size=32, shuffle=True) if train is None else train
    if isinstance(val, str):
        xv, yv = raw(256, seed=1)
        val = DataLoader(Items(xv, yv), batch_size=64)
    metric = tropt.Metric(accuracy) if metric == "default" else metric
    return tropt.Setup(net() if model is None else model, ce, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
                       train, val_data=val, metric=metric, num_classes=C, **kw)


# ---------------------------------------------------------------------------------------------- the cases
def healthy():
    return make()


def class_sorted():
    x, y = raw()
    order = y.argsort(stable=True)
    return make(train=DataLoader(Items(x[order], y[order]), batch_size=32, shuffle=False))


def distributed_without_set_epoch():
    x, y = raw()
    ds = Items(x, y)
    return make(train=DataLoader(ds, batch_size=32,
                                 sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True)))


def distributed_with_set_epoch():
    x, y = raw()
    ds = Items(x, y)
    return make(train=EpochLoader(ds, batch_size=32,
                                  sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True)))


def tiny_last_batch(n: int = 386):
    x, y = raw(n)  # 12 batches of 32 and one of 2 (n=385: of 1), with BatchNorm
    return make(train=DataLoader(Items(x, y), batch_size=32, shuffle=True))


def weighted_sampler():
    x, y = raw()
    weights = torch.where(y == 0, 9.0, 1.0).double()  # class 0 drawn 9x as often: 75% of the samples
    return make(train=DataLoader(Items(x, y), batch_size=32,
                                 sampler=torch.utils.data.WeightedRandomSampler(weights, len(y))))


def val_without_normalisation():
    xv, yv = raw(256, seed=1)
    return make(val=DataLoader(Items(xv, yv, transform=lambda t: t), batch_size=64))


def random_val_transform():
    xv, yv = raw(256, seed=1)
    return make(val=DataLoader(Items(xv, yv, transform=noisy), batch_size=64))


def declared_tta():
    return random_val_transform().replace(eval_augmentation=True)


def accuracy_on_imbalanced_labels():
    shares = [0.95, 0.05, 0.0, 0.0]  # both splits: the validation data is prepared and distributed like training
    x, y = raw(384, shares=shares)
    xv, yv = raw(400, seed=1, shares=shares)
    return make(train=DataLoader(Items(x, y), batch_size=32, shuffle=True),
                val=DataLoader(Items(xv, yv), batch_size=64))


def balanced_accuracy_on_imbalanced_labels():
    return accuracy_on_imbalanced_labels().replace(metric=tropt.Metric(balanced_accuracy))


def label_share(model: nn.Module, loader) -> float:
    """Runs the model but scores the labels only (the share of class 0): not a function of the predictions."""
    hits = total = 0
    for x, y in loader:
        model(x)
        hits += int((y == 0).sum())
        total += len(y)
    return hits / total


def metric_closing_over_the_original_model():
    original = net()  # the metric evaluates this model whatever model it is given
    return make(metric=tropt.Metric(lambda model, loader: accuracy(original.eval(), loader), name="closure_accuracy"))


def metric_that_raises():
    return make(metric=tropt.Metric(lambda model, loader: float(model(loader).mean()), name="broken"))


def model_left_in_eval_mode():
    return make(model=net().eval())


def step_that_calls_eval(ctx, micro_batches):
    ctx.model.eval()  # e.g. a validation helper called inside the step
    return tropt.standard_step(ctx, micro_batches)


def eval_inside_step():
    return make(step=step_that_calls_eval)


class FrozenBackbone(nn.Module):
    """A pretrained-style backbone kept frozen (requires_grad=False, eval mode) under a trainable head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(D, 128), nn.BatchNorm1d(128), nn.ReLU())  # wide: the head alone can fit
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(128, C))
        for p in self.backbone.parameters():
            p.requires_grad_(False)
        self.backbone.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def frozen_backbone():
    return make(model=FrozenBackbone())


def accuracy_in_train_mode(model, loader):
    model.train()  # a metric that reuses a training helper: dropout on during evaluation
    return accuracy(model, loader)


def metric_in_train_mode():
    return make(metric=tropt.Metric(accuracy_in_train_mode))


# name: (builder, {check: status}) — the statuses of the four new checks
CASES = {
    "healthy": (healthy, dict.fromkeys(NEW, P)),
    "class_sorted": (class_sorted, {**dict.fromkeys(NEW, P), "data.sampling": F_}),
    "distributed_without_set_epoch": (distributed_without_set_epoch, {**dict.fromkeys(NEW, P), "data.sampling": W}),
    "distributed_with_set_epoch": (distributed_with_set_epoch, dict.fromkeys(NEW, P)),
    "tiny_last_batch": (tiny_last_batch, {**dict.fromkeys(NEW, P), "data.sampling": W}),
    "weighted_sampler": (weighted_sampler, dict.fromkeys(NEW, P)),
    "val_without_normalisation": (val_without_normalisation, {**dict.fromkeys(NEW, P), "data.eval_transforms": F_}),
    "random_val_transform": (random_val_transform, {**dict.fromkeys(NEW, P), "data.eval_transforms": W}),
    "declared_tta": (declared_tta, dict.fromkeys(NEW, P)),
    "accuracy_on_imbalanced_labels": (accuracy_on_imbalanced_labels, {**dict.fromkeys(NEW, P), "model.eval_metric": W}),
    "balanced_accuracy_on_imbalanced_labels": (balanced_accuracy_on_imbalanced_labels, dict.fromkeys(NEW, P)),
    "metric_closing_over_the_original_model": (metric_closing_over_the_original_model,
                                               {**dict.fromkeys(NEW, P), "model.eval_metric": F_}),
    "metric_that_raises": (metric_that_raises, {**dict.fromkeys(NEW, P), "model.eval_metric": F_}),
    "model_left_in_eval_mode": (model_left_in_eval_mode, {**dict.fromkeys(NEW, P), "loop.train_mode": F_}),
    "eval_inside_step": (eval_inside_step, {**dict.fromkeys(NEW, P), "loop.train_mode": F_}),
    "frozen_backbone": (frozen_backbone, dict.fromkeys(NEW, P)),
    "metric_in_train_mode": (metric_in_train_mode, {**dict.fromkeys(NEW, P), "loop.train_mode": W}),
}
