"""Batch reports: execute a parameterized notebook with papermill, convert it to standalone HTML, gate on it.

``run_report("diagnose", {"setup": "file.py:make_setup"}, "out/")`` writes ``out/report.ipynb``,
``out/report.html`` and ``out/findings.json`` (the notebook writes the findings itself). A failing cell still
leaves the executed notebook and its HTML, and the outcome names the cell and its error in one line.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import TroptError, require
from ..result import Report

NOTEBOOKS = {"diagnose": "diagnose.ipynb", "data": "data_checks.ipynb", "compare": "compare.ipynb"}
KERNEL_NAME = "tropt-python"


def notebook_path(kind: str) -> Path:
    """The shipped notebook for a report kind ("diagnose", "data" or "compare")."""
    if kind not in NOTEBOOKS:
        raise TroptError(f"unknown report kind {kind!r}", f"choose one of: {', '.join(NOTEBOOKS)}")
    path = Path(str(resources.files("tropt") / "notebooks" / NOTEBOOKS[kind]))
    if not path.is_file():
        raise TroptError(f"the {kind} notebook is missing from this installation ({path})", "reinstall tropt")
    return path


@contextmanager
def current_interpreter_kernel() -> Iterator[str]:
    """A kernelspec for *this* interpreter (so a venv runs its own packages), registered for the block only."""
    with tempfile.TemporaryDirectory(prefix="tropt-kernel-") as tmp:
        spec_dir = Path(tmp) / "kernels" / KERNEL_NAME
        spec_dir.mkdir(parents=True)
        (spec_dir / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"tropt ({sys.executable})", "language": "python",
        }))
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = tmp + (os.pathsep + old if old else "")
        try:
            yield KERNEL_NAME
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


@contextmanager
def _kernel_stderr_to(path: Path) -> Iterator[None]:
    """Send the kernel's stderr (it inherits ours: ZMQ and profiler chatter) to a log file for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@dataclass
class ReportOutcome:
    """What a report run produced: paths, the findings, timings, and the failing cell if any."""

    notebook: Path
    html: Path
    findings: Path | None
    report: Report | None
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    comparison: Path | None = None  # the compare report's comparison.json
    escalated: bool = False  # a compare decision said "escalate: budget"

    def exit_code(self, fail_on: str = "fail") -> int:
        """0 ok, 1 the findings fail the gate (compare: a decision escalates), 2 the notebook itself failed."""
        if self.error is None and self.comparison is not None:
            return 1 if self.escalated and fail_on != "never" else 0
        if self.error is not None or self.report is None:
            return 2
        return 1 if self.report.failed(fail_on) else 0


def _failure_line(exc: Exception) -> str:
    """One line naming the failing cell and its error (instead of papermill's traceback wall)."""
    ename, evalue = getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", str(exc))
    index, source = getattr(exc, "cell_index", None), (getattr(exc, "source", "") or "").strip()
    evalue = " ".join(str(evalue).split())
    if index is None:
        return f"{ename}: {evalue}"
    first = source.splitlines()[0][:60] if source else ""
    return f"cell {index} ({first!r}) failed: {ename}: {evalue}"


def to_html(notebook: Path, html: Path, *, no_input: bool = False) -> None:
    """Convert an executed notebook to one standalone HTML file (images embedded, no network resources)."""
    nbconvert = require("nbconvert", "report")
    nbformat = require("nbformat", "report")
    templates = str(resources.files("tropt.report") / "templates")
    exporter = nbconvert.HTMLExporter(extra_template_basedirs=[templates], template_name="tropt_offline", embed_images=True,
                                      exclude_input=no_input, exclude_input_prompt=no_input, exclude_output_prompt=no_input)
    body, _ = exporter.from_notebook_node(nbformat.read(str(notebook), as_version=4))
    html.write_text(body, encoding="utf-8")


def run_report(kind: str, parameters: Mapping[str, Any], output_dir: str | os.PathLike, *, no_input: bool = False,
               timeout_s: int = 900) -> ReportOutcome:
    """Execute the ``kind`` notebook with ``parameters`` into ``output_dir``; never raises for a failing cell."""
    papermill = require("papermill", "report")
    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    params = dict(parameters)
    params["output_dir"] = str(out)
    source = notebook_path(kind)
    nb_path, html_path, findings = out / "report.ipynb", out / "report.html", out / "findings.json"
    comparison = out / "comparison.json"
    for stale in (findings, comparison):
        if stale.exists():
            stale.unlink()  # never report a stale result from an earlier run
    timings: dict[str, float] = {}
    error = None
    start = time.perf_counter()
    with current_interpreter_kernel() as kernel, _kernel_stderr_to(out / "kernel.log"):
        try:
            papermill.execute_notebook(str(source), str(nb_path), parameters=params, kernel_name=kernel,
                                       progress_bar=False, log_output=False, execution_timeout=timeout_s, cwd=os.getcwd())
        except papermill.PapermillExecutionError as exc:
            error = _failure_line(exc)
        except Exception as exc:  # noqa: BLE001 - kernel died, timeout, ...: still write what exists
            error = _failure_line(exc)
    timings["execute_s"] = time.perf_counter() - start
    start = time.perf_counter()
    if nb_path.exists():
        to_html(nb_path, html_path, no_input=no_input)
    timings["html_s"] = time.perf_counter() - start
    report = Report.from_json(str(findings)) if findings.exists() and error is None else None
    if report is not None:
        timings["checks_s"] = sum(r.duration_s or 0.0 for r in report)
    outcome = ReportOutcome(nb_path, html_path, findings if findings.exists() else None, report, error, timings)
    if comparison.exists() and error is None:
        from ..experiments.comparison import Comparison

        outcome.comparison = comparison
        outcome.escalated = any(v.startswith("escalate") for v in Comparison.from_json(str(comparison)).decision()["verdict"])
    return outcome
