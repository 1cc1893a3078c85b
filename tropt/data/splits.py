"""Run every stage-1 check on a set of splits: :data:`CHECKS` and :func:`check_splits`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..result import Report
from .cache import session
from .class_coverage import check_class_coverage
from .exact_duplicates import check_exact_duplicates
from .group_leakage import check_group_leakage
from .label_sanity import check_label_sanity
from .label_shift import check_label_shift
from .load import load_splits
from .near_duplicates import check_near_duplicates
from .split_data import Options
from .target_leakage import check_target_leakage
from .temporal_leakage import check_temporal_leakage

CHECKS = {
    "data.exact_duplicates": check_exact_duplicates,
    "data.near_duplicates": check_near_duplicates,
    "data.group_leakage": check_group_leakage,
    "data.temporal_leakage": check_temporal_leakage,
    "data.target_leakage": check_target_leakage,
    "data.label_shift": check_label_shift,
    "data.class_coverage": check_class_coverage,
    "data.label_sanity": check_label_sanity,
}


def check_splits(splits: Mapping[str, Any], *, label=None, group=None, time=None, features=None,
                 near_duplicates: bool | str = "auto", progress: bool = True) -> Report:
    """Run every stage-1 check on ``splits`` (ordered: earlier splits first) and return a :class:`tropt.Report`.

    Each split is scanned once and shared between the checks. Bad input that concerns every check (columns that
    differ between splits, an unknown label/group/time column, an empty split, unhashable values) raises
    :class:`tropt.errors.DataError`; a check that fails for its own reasons becomes an ERROR result.
    """
    from ..diagnosis import run_check
    from ..identity import run_identity
    from ..registry import find_spec

    with session():
        load_splits(splits, Options.make(label, group, time, features), progress=progress, min_splits=2)
        options = {"label": label, "group": group, "time": time, "features": features, "progress": progress}
        results = []
        for cid in CHECKS:
            opts = dict(options)
            if cid == "data.near_duplicates":
                opts["enabled"] = near_duplicates
            spec = find_spec(cid)
            assert spec is not None  # every id in CHECKS is a registered check
            results.append(run_check(spec, splits, opts))
        # Inside the session: the data fingerprint reuses the scan the checks made.
        identity = run_identity(None, splits, checks=list(CHECKS), label=label, group=group, time=time,
                                features=features)
    return Report(results, identity)
