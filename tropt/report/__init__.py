"""Batch reports: parameterized notebooks executed by papermill into HTML and ``findings.json``."""

from .runner import ReportOutcome, notebook_path, run_report

__all__ = ["ReportOutcome", "notebook_path", "run_report"]
