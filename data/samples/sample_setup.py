"""A small, correct training setup on the bundled churn sample: ``make_setup()`` returns a ``tropt.Setup``.

Used by ``make demo`` (``tropt diagnose --setup data/samples/sample_setup.py:make_setup``) and the tests. The
model and loop are correct on purpose; the data defects live in the CSVs (see README.md here).
"""

from __future__ import annotations

import os

import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

import tropt

HERE = os.path.dirname(os.path.abspath(__file__))
NUMERIC = ["age", "tenure_months", "monthly_spend", "support_calls"]
PLANS = ["basic", "plus", "pro"]


def features(df: pd.DataFrame, mean: pd.Series, std: pd.Series) -> torch.Tensor:
    """Standardised numeric columns plus a one-hot plan, as float32."""
    num = (df[NUMERIC] - mean) / std
    onehot = pd.get_dummies(pd.Categorical(df["plan"], categories=PLANS), dtype=float)
    return torch.tensor(pd.concat([num.reset_index(drop=True), onehot], axis=1).to_numpy(), dtype=torch.float32)


def load(split: str) -> pd.DataFrame:
    return pd.read_csv(os.path.join(HERE, f"{split}.csv"), parse_dates=["signup_date"])


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def balanced_accuracy(model: nn.Module, loader) -> float:
    """Mean recall over the two classes: a constant prediction scores 0.5 whatever the churn rate."""
    preds, labels = [], []
    for x, y in loader:
        preds.append(model(x).argmax(1))
        labels.append(y)
    p, t = torch.cat(preds), torch.cat(labels)
    return sum(float(((p == c) & (t == c)).sum()) / max(int((t == c).sum()), 1) for c in (0, 1)) / 2


def make_setup(seed: int = 0, batch_size: int = 64) -> tropt.Setup:
    train, test = load("train"), load("test")
    mean, std = train[NUMERIC].mean(), train[NUMERIC].std()
    x_train, x_test = features(train, mean, std), features(test, mean, std)
    y_train = torch.tensor(train["churned"].to_numpy(), dtype=torch.long)
    y_test = torch.tensor(test["churned"].to_numpy(), dtype=torch.long)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(x_train.shape[1], 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=batch_size,
                                         shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_test, y_test), batch_size=256)
    return tropt.Setup(
        model,
        loss_fn,
        lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=1e-4),
        loader,
        val_data=val,
        scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200),
        accumulation_steps=2,
        grad_clip=1.0,
        num_classes=2,
        metric=tropt.Metric(balanced_accuracy),
        seed=seed,
    )
