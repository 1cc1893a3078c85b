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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import TroptError, require
from ..result import Report

# Report kinds and their notebooks; a kind is offered (CLI choices, help) only when its notebook ships.
NOTEBOOKS = {"diagnose": "diagnose.ipynb", "data": "data_checks.ipynb", "compare": "compare.ipynb",
             "optimize": "optimize.ipynb"}
KERNEL_NAME = "tropt-python"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def _shipped(kind: str) -> Path:
    return Path(str(resources.files("tropt") / "notebooks" / NOTEBOOKS[kind]))


def available_reports() -> list[str]:
    """The report kinds whose notebook ships with this installation (what ``tropt report`` offers)."""
    return [kind for kind in NOTEBOOKS if _shipped(kind).is_file()]


def notebook_path(kind: str) -> Path:
    """The shipped notebook for a report kind (see :func:`available_reports`)."""
    if kind not in available_reports():
        raise TroptError(f"unknown report kind {kind!r}", f"choose one of: {', '.join(available_reports())}")
    return _shipped(kind)


def declared_parameters(notebook: Path) -> list[str]:
    """The names the notebook's ``parameters``-tagged cell assigns at top level (what ``-p NAME`` may set)."""
    import ast

    nbformat = require("nbformat", "report")
    nb = nbformat.read(str(notebook), as_version=4)
    names: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            for node in ast.parse(cell.source).body:
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, ast.AnnAssign) else [])
                names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in names]
    return names


def check_parameters(kind: str, parameters: Mapping[str, Any]) -> None:
    """Refuse parameter names the notebook does not declare, before any kernel starts.

    papermill writes ``NAME = value`` into the notebook verbatim, so a name that is not a plain identifier would run
    as code; a declared-but-misspelt name (``lable``) would only warn into the kernel log and leave checks SKIP.
    """
    valid = [n for n in declared_parameters(notebook_path(kind)) if n != "output_dir"]
    for name in parameters:
        if name == "output_dir":
            raise TroptError("parameter 'output_dir' is set by tropt report itself",
                             "choose the output directory with -o OUT_DIR")
        if not (isinstance(name, str) and name.isidentifier() and name in valid):
            shown = name if isinstance(name, str) and len(name) <= 40 else f"{str(name)[:40]}..."
            raise TroptError(f"the {kind} report has no parameter {shown!r}", f"valid parameters: {', '.join(valid)}")


@dataclass
class _Kernel:
    """The private kernelspec of one report run, and the kernel managers started from it."""

    name: str
    manager_class: type
    managers: list = field(default_factory=list)

    def kill(self) -> None:
        """Kill any kernel still running (an interrupted run never leaves one behind)."""
        for km in self.managers:
            process = getattr(getattr(km, "provisioner", None), "process", None)
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def _manager_class(runtime_dir: str, started: list) -> type:
    """nbclient's kernel manager, writing its connection file (it holds the HMAC key) into ``runtime_dir``."""
    import uuid

    from jupyter_client.manager import AsyncKernelManager

    class _PrivateKernelManager(AsyncKernelManager):
        async def _async_pre_start_kernel(self, **kw):
            if not self.connection_file:  # default: a mkstemp file in $TMPDIR that outlives a killed run
                self.connection_file = os.path.join(runtime_dir, f"kernel-{uuid.uuid4().hex}.json")
            started.append(self)
            return await super()._async_pre_start_kernel(**kw)

    return _PrivateKernelManager


@contextmanager
def _private_kernel() -> Iterator[_Kernel]:
    """A kernelspec for *this* interpreter (so a venv runs its own packages), registered for the block only.

    The spec and the kernel's connection file live in one temporary directory, removed on every exit path (with
    :func:`_terminate_as_interrupt`, SIGTERM too); a kernel still running at exit is killed. A run killed outright
    (SIGKILL) cannot clean up: the next run sweeps its directory and kernel (:mod:`tropt.report.stale`).
    """
    from .stale import PREFIX, mark_owner, sweep_stale

    sweep_stale()  # what a killed run (SIGKILL: no cleanup ran) left behind
    with tempfile.TemporaryDirectory(prefix=PREFIX) as tmp:
        mark_owner(tmp)
        spec_dir = Path(tmp) / "kernels" / KERNEL_NAME
        spec_dir.mkdir(parents=True)
        (spec_dir / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"tropt ({sys.executable})", "language": "python",
            # The report's figures must reach the notebook whatever the caller's environment says
            # (MPLBACKEND=Agg is common on CI and headless servers): the kernel always draws inline.
            "env": {"MPLBACKEND": INLINE_BACKEND},
        }))
        started: list[Any] = []
        kernel = _Kernel(KERNEL_NAME, _manager_class(tmp, started), started)
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = tmp + (os.pathsep + old if old else "")
        try:
            yield kernel
        finally:
            kernel.kill()
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


@contextmanager
def current_interpreter_kernel() -> Iterator[str]:
    """A kernelspec for *this* interpreter registered for the block only; yields its name (for papermill)."""
    with _private_kernel() as kernel:
        yield kernel.name


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived during a report run; raised like Ctrl-C so every cleanup runs."""


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """For the block, SIGTERM raises :class:`Terminated` (the default handler would exit without any cleanup)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def handler(signum, frame):
        raise Terminated("terminated (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block (moving the finished files into place is never cut half-way)."""
    import signal

    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - Windows
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


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
    plan: Path | None = None  # the optimize report's plan.md
    plan_outcome: str | None = None  # and how the plan ends ("escalate", "blocked", "adopt", ...)

    def exit_code(self, fail_on: str = "fail") -> int:
        """0 ok, 1 the findings fail the gate (compare: a decision escalates; optimize: also a plan that ends in
        escalate), 2 the notebook itself failed."""
        if self.error is None and self.plan is not None and self.report is not None:
            return 1 if self.report.failed(fail_on) or (self.plan_outcome == "escalate" and fail_on != "never") else 0
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


_NOISE_MIMETYPES = ("application/vnd.jupyter.widget-view+json",)


def strip_noise(nb) -> None:
    """Drop what reads as an error but is not a finding: stderr streams (library warnings such as tqdm's
    "IProgress not found", progress bars) and live widget views (a static page cannot show them); in place."""
    nb.metadata.pop("widgets", None)  # widget state makes the page fetch a widget manager from a CDN
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs = [
            o for o in cell.get("outputs", [])
            if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
            and not any(m in o.get("data", {}) for m in _NOISE_MIMETYPES)
        ]


def to_html(notebook: Path, html: Path, *, no_input: bool = True) -> None:
    """Convert an executed notebook to one standalone HTML file (images embedded, no network resources).

    Code cells are hidden unless ``no_input=False``; stderr blocks and widget views never show (:func:`strip_noise`);
    an error output does, so a failed cell is never hidden. The notebook's instructions are left out, wide tables
    scroll, and the "what this means" pages are embedded (:mod:`tropt.report.html_pages`).
    """
    nbconvert = require("nbconvert", "report")
    nbformat = require("nbformat", "report")
    templates = str(resources.files("tropt.report") / "templates")
    exporter = nbconvert.HTMLExporter(extra_template_basedirs=[templates], template_name="tropt_offline",
                                      embed_images=True, exclude_input=no_input, exclude_input_prompt=no_input,
                                      exclude_output_prompt=no_input)
    from .html_pages import SCROLL_CSS, drop_instructions, embed_doc_pages

    nb = nbformat.read(str(notebook), as_version=4)
    strip_noise(nb)
    drop_instructions(nb)
    embed_doc_pages(nb)
    body, _ = exporter.from_notebook_node(nb)
    html.write_text(body.replace("</head>", SCROLL_CSS + "</head>", 1), encoding="utf-8")


OUTPUT_FILES = ("report.ipynb", "report.html", "findings.json", "comparison.json", "plan.md", "plan.html", "plan.json",
                "kernel.log")


def run_report(kind: str, parameters: Mapping[str, Any], output_dir: str | os.PathLike, *, no_input: bool = True,
               timeout_s: int = 900, progress: bool = False) -> ReportOutcome:
    """Execute the ``kind`` notebook with ``parameters`` into ``output_dir``; never raises for a failing cell.

    Everything is checked before a kernel starts (parameter names, the output directory); the run writes into a
    hidden directory inside ``output_dir`` and its files replace the previous report's only when all are written,
    under a lock (a second run into the same directory refuses). Ctrl-C or SIGTERM leave the previous report as it
    was and remove the temporary kernelspec and connection file. ``no_input`` hides the code cells (the default);
    ``progress`` shows a bar over the notebook's cells on stderr.
    """
    from .outputs import check_output_dir, move_into_place, output_lock, staging_dir

    papermill = require("papermill", "report")
    check_parameters(kind, parameters)
    source = notebook_path(kind)
    out = check_output_dir(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TroptError(f"-o {output_dir} cannot be created ({exc.strerror or exc})",
                         "choose a writable location") from None
    with output_lock(out), _terminate_as_interrupt(), staging_dir(out) as work:
        error, timings = _execute(papermill, source, dict(parameters), work, no_input=no_input, timeout_s=timeout_s,
                                  progress=progress)
        with _signals_deferred():
            move_into_place(work, out, OUTPUT_FILES)
    findings = out / "findings.json"
    # Findings written before a later cell failed are still this run's (the run had its own directory): show them.
    report = Report.from_json(str(findings)) if findings.exists() else None
    if report is not None:
        timings["checks_s"] = sum(r.duration_s or 0.0 for r in report)
    outcome = ReportOutcome(out / "report.ipynb", out / "report.html", findings if findings.exists() else None, report,
                            error, timings)
    comparison = out / "comparison.json"
    if comparison.exists() and error is None:
        from ..experiments.comparison import Comparison

        outcome.comparison = comparison
        outcome.escalated = any(v.startswith("escalate")
                                for v in Comparison.from_json(str(comparison)).decision()["verdict"])
    if (out / "plan.json").exists() and error is None:
        outcome.plan = out / "plan.md"
        outcome.plan_outcome = json.loads((out / "plan.json").read_text(encoding="utf-8")).get("outcome")
    return outcome


def _execute(papermill, source: Path, params: dict, work: Path, *, no_input: bool, timeout_s: int,
             progress: bool = False) -> tuple[str | None, dict]:
    """Run the notebook into ``work`` (report.ipynb, report.html, findings.json, kernel.log); the failing cell's
    line."""
    params["output_dir"] = str(work)
    nb_path = work / "report.ipynb"
    timings: dict[str, float] = {}
    error = None
    start = time.perf_counter()
    # The bar writes to our stderr as it was before the kernel's chatter is sent to kernel.log.
    bar_file = os.fdopen(os.dup(2), "w") if progress else None
    bar = {"file": bar_file, "desc": "tropt report", "unit": "cell"} if progress else False
    with _private_kernel() as kernel, _kernel_stderr_to(work / "kernel.log"):
        try:
            papermill.execute_notebook(str(source), str(nb_path), parameters=params, kernel_name=kernel.name,
                                       kernel_manager_class=kernel.manager_class, progress_bar=bar, log_output=False,
                                       execution_timeout=timeout_s, cwd=os.getcwd())
        except papermill.PapermillExecutionError as exc:
            error = _failure_line(exc)
        except Exception as exc:  # noqa: BLE001 - kernel died, timeout, ...: still write what exists
            error = _failure_line(exc)
        finally:
            if bar_file is not None:
                bar_file.close()
    timings["execute_s"] = time.perf_counter() - start
    start = time.perf_counter()
    if nb_path.exists():
        to_html(nb_path, work / "report.html", no_input=no_input)
    timings["html_s"] = time.perf_counter() - start
    return error, timings
