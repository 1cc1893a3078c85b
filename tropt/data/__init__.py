"""Stage 1: data leakage and split checks.

``check_splits(splits, label=, group=, time=)`` runs them all and returns a :class:`tropt.Report`; each check is
also a public function (``check_exact_duplicates``, ...). ``splits`` is an ordered mapping of named splits
(earlier first); each split may be a DataFrame, a numpy array / torch tensor (N, ...), a tuple (X, y), a
map-style torch Dataset or a path to a CSV/Parquet file (streamed in chunks).

``data.sampling`` (:func:`check_sampling`) and ``data.eval_transforms`` (:func:`check_eval_transforms`) run on a
:class:`tropt.Setup` instead: they read its own training and validation loaders.
"""

from __future__ import annotations

from ._common import infer_task
from .class_coverage import check_class_coverage
from .eval_transforms import check_eval_transforms
from .exact_duplicates import check_exact_duplicates
from .group_leakage import check_group_leakage
from .label_sanity import check_label_sanity
from .label_shift import check_label_shift
from .near_duplicates import check_near_duplicates
from .sampling import check_sampling
from .splits import CHECKS, check_splits
from .target_leakage import check_target_leakage
from .temporal_leakage import check_temporal_leakage

__all__ = [
    "CHECKS",
    "check_class_coverage",
    "check_eval_transforms",
    "check_exact_duplicates",
    "check_group_leakage",
    "check_label_sanity",
    "check_label_shift",
    "check_near_duplicates",
    "check_sampling",
    "check_splits",
    "check_target_leakage",
    "check_temporal_leakage",
    "infer_task",
]
