"""data.sampling and data.eval_transforms on the shared Setup cases: each planted defect is caught by exactly its
check."""

from __future__ import annotations

import pytest
from support.contract_support import caught_by_exactly

DATA_CASES = ["healthy", "class_sorted", "distributed_without_set_epoch", "distributed_with_set_epoch",
              "tiny_last_batch", "weighted_sampler", "val_without_normalisation", "random_val_transform",
              "declared_tta"]


@pytest.mark.parametrize("case", DATA_CASES)
def test_each_case_is_caught_by_exactly_its_check(case):
    caught_by_exactly(case)
