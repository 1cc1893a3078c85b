"""Stage 5 — dynamics: loss-curve diagnosis (``dynamics.loss_curve``) and the LR range test (``dynamics.lr_range``).

:func:`diagnose_curves` classifies curves you already have (arrays, DataFrames, CSV, TensorBoard / CSV-logger
exports, MLflow runs, W&B offline runs) without a Setup.
"""

from __future__ import annotations

from .curves import CurveThresholds, classify_curve
from .logs import read_curve, read_mlflow, read_tensorboard, read_wandb
from .loss_curve import check_loss_curve, diagnose_curves
from .lr_range import check_lr_range

__all__ = [
    "CurveThresholds",
    "check_loss_curve",
    "check_lr_range",
    "classify_curve",
    "diagnose_curves",
    "read_curve",
    "read_mlflow",
    "read_tensorboard",
    "read_wandb",
]
