"""Fixtures of the stage-1 check tests."""

from __future__ import annotations

import pytest
from support.split_tables import make_table


@pytest.fixture
def clean():
    return make_table(600, 0, 0, "2023-01-01", "2023-12-31"), make_table(300, 1, 10_000, "2024-01-01", "2024-06-30")
