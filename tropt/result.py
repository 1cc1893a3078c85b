"""The result model: :class:`Status`, :class:`CheckResult` and :class:`Report`.

Values first, display second: a check returns data; HTML/Markdown/JSON renderings live here because they are
plain text formats of the same data, while drawing lives in :mod:`tropt.plots`.
"""

from __future__ import annotations

import contextlib
import html
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd

from .output import (
    cap_text,
    cost_line,
    md_id,
    md_text,
    read_json,
    shorten,
    terminal_line,
    write_json,
    write_text_atomic,
)


class Status(str, Enum):
    """Outcome of one check. A report's status is its worst result (see :attr:`rank`)."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"

    @property
    def rank(self) -> int:
        """Severity: SKIP < PASS < WARN < ERROR < FAIL (a shown defect outranks a check that could not run)."""
        return _RANK[self]

    def __str__(self) -> str:
        return self.value


_RANK = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}
_COLOUR = {
    Status.PASS: "#1a7f37",
    Status.WARN: "#9a6700",
    Status.FAIL: "#cf222e",
    Status.ERROR: "#8250df",
    Status.SKIP: "#6e7781",
}
HTML_MAX_ROWS = 10  # evidence rows shown inline; the rest is counted ("N more rows")


def json_safe(value: Any) -> Any:
    """Convert numpy/torch scalars, arrays and non-finite floats to plain JSON values (NaN/inf -> None)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (pd.Timestamp, np.datetime64)):
        return str(pd.Timestamp(value))
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()] if value.ndim else json_safe(value.item())
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return str(value)


def _frame_to_dict(df: pd.DataFrame) -> dict:
    return {
        "columns": [str(c) for c in df.columns],
        "index": json_safe(list(df.index)),
        "index_name": None if df.index.name is None else str(df.index.name),
        "dtypes": {str(c): str(t) for c, t in df.dtypes.items()},
        "data": json_safe(df.to_numpy(dtype=object).tolist()),
    }


def _frame_from_dict(d: Mapping) -> pd.DataFrame:
    try:
        df = pd.DataFrame(d["data"], columns=d["columns"], index=d.get("index"))
    except UnicodeEncodeError:  # a lone surrogate (a non-UTF-8 file name) that Arrow strings cannot hold
        index = None if d.get("index") is None else pd.Index(d["index"], dtype=object)
        df = pd.DataFrame(d["data"], columns=pd.Index(d["columns"], dtype=object), index=index, dtype=object)
    df.index.name = d.get("index_name")
    for col, dtype in d.get("dtypes", {}).items():
        if col in df.columns and dtype != "object":
            # e.g. an int column that held a None: keep what JSON gave
            with contextlib.suppress(TypeError, ValueError):
                df[col] = df[col].astype(dtype)
    return df


def _fmt(value: Any) -> str:
    """A number as people read it: large values plain with thousands separators (106,088, not 1.061e+05), tiny
    ones in scientific notation (relative errors), the rest to 4 significant digits."""
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.3e}"
        if abs(value) >= 1e4 and math.isfinite(value):
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value)


@dataclass(frozen=True)
class CheckResult:
    """What one check found.

    Attributes
    ----------
    check
        The public check id, e.g. ``"loop.accumulation"``.
    status
        :class:`Status` of the finding.
    summary
        One line a person reads.
    metrics
        Flat dict of numbers and strings.
    tables
        Named evidence tables (the leaked rows, the layers, the steps that show the problem).
    advice
        The minimal intervention, as imperative sentences.
    series
        Named arrays for plots (loss curves, learning-rate sequences, ...).
    duration_s
        Wall time the check took (not part of its meaning; excluded from comparisons of findings).
    """

    check: str
    status: Status
    summary: str
    metrics: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        # What a person reads is capped (a 1 MB label value is not a 1 MB line); the tables keep every value.
        object.__setattr__(self, "summary", cap_text(str(self.summary)))
        object.__setattr__(self, "advice", [cap_text(str(a)) for a in self.advice])
        for key, value in self.metrics.items():
            if isinstance(value, (Mapping, list, tuple, np.ndarray)) and not isinstance(value, str):
                raise TypeError(f"CheckResult.metrics[{key!r}] must be a number or string, not {type(value).__name__}")

    # ---------------------------------------------------------------- identity
    @property
    def title(self) -> str:
        """The registered title of the check (the id when the check is not registered)."""
        from .registry import find_spec

        spec = find_spec(self.check)
        return spec.title if spec else self.check

    @property
    def ok(self) -> bool:
        """True for PASS and SKIP."""
        return self.status in (Status.PASS, Status.SKIP)

    # ---------------------------------------------------------------- serialisation
    def to_dict(self) -> dict:
        """A JSON-safe dict (tables in split orientation, arrays as lists, NaN/inf as None)."""
        return {
            "check": self.check,
            "status": self.status.value,
            "summary": self.summary,
            "metrics": json_safe(self.metrics),
            "tables": {name: _frame_to_dict(df) for name, df in self.tables.items()},
            "advice": list(self.advice),
            "series": {name: json_safe(np.asarray(v)) for name, v in self.series.items()},
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> CheckResult:
        """Inverse of :meth:`to_dict`."""
        return cls(
            check=d["check"],
            status=Status(d["status"]),
            summary=d["summary"],
            metrics=dict(d.get("metrics", {})),
            tables={name: _frame_from_dict(t) for name, t in d.get("tables", {}).items()},
            advice=list(d.get("advice", [])),
            series={name: np.asarray(v, dtype=float) for name, v in d.get("series", {}).items()},
            duration_s=d.get("duration_s"),
        )

    # ---------------------------------------------------------------- display
    def plot(self, ax=None):
        """Draw the result's picture on ``ax`` (a new figure when None); returns the Axes."""
        from .plots import plot_result

        return plot_result(self, ax=ax)

    def _repr_html_(self) -> str:
        return result_html(self, open_details=False)

    def __repr__(self) -> str:
        return f"<CheckResult {self.check} {self.status.value.upper()}: {self.summary}>"


def link_findings(results: list[CheckResult]) -> list[CheckResult]:
    """Resolve cross-references between results (``see_also``, root causes and their symptoms); defined in
    :mod:`tropt.linking`, kept here for the callers that import it from the result model."""
    from .linking import link_findings as link

    return link(results)


def _badge(status: Status) -> str:
    return (
        f'<span class="tropt-badge tropt-{status.value}" style="background:{_COLOUR[status]};color:#fff;'
        f'border-radius:3px;padding:1px 6px;font-size:85%;font-weight:600">{status.value.upper()}</span>'
    )


def _table_html(name: str, df: pd.DataFrame, max_rows: int = HTML_MAX_ROWS) -> str:
    from .output import shown_frame

    raw = df.head(max_rows)
    head = shown_frame(raw)
    # A column of sentences (a reason, an advice) gets room to read instead of wrapping one word per line.
    wide = {name: "22em" for i, name in enumerate(head.columns)
            if raw.iloc[:, i].dtype == object and max((len(str(v)) for v in head.iloc[:, i]), default=0) > 40}
    shown = head.to_html(border=0, classes="tropt-table", float_format=_fmt, escape=True, col_space=wide or None)
    more = len(df) - max_rows
    tail = f'<div class="tropt-more">{more} more rows</div>' if more > 0 else ""
    return (f'<div class="tropt-evidence" style="overflow-x:auto"><b>{html.escape(shorten(name))}</b> ({len(df)} rows)'
            f"{shown}{tail}</div>")


def result_html(r: CheckResult, open_details: bool = False, extra: str = "") -> str:
    """One result as HTML: badge, id, title and its "what this means" link, summary, advice; metrics and evidence
    inside a collapsed ``<details>`` (opened only when ``open_details`` and the result is not ok); ``extra`` is
    trusted HTML (a picture) added to the evidence."""
    from .verdict import doc_link_html

    e = html.escape
    parts = [
        f'<div class="tropt-result" data-check="{e(r.check)}" data-status="{r.status.value}" '
        f'style="border-left:4px solid {_COLOUR[r.status]};padding:4px 10px;margin:6px 0">',
        f"<div>{_badge(r.status)} <code>{e(r.check)}</code> <b>{e(r.title)}</b>{doc_link_html(r.check)}</div>",
        f'<div class="tropt-summary">{e(r.summary)}</div>',
    ]
    if r.advice:
        parts.append('<ul class="tropt-advice">' + "".join(f"<li>{e(a)}</li>" for a in r.advice) + "</ul>")
    body = []
    if r.metrics:
        rows = "".join(f"<tr><th>{e(shorten(k))}</th><td>{e(shorten(_fmt(v)))}</td></tr>"
                       for k, v in r.metrics.items())
        body.append(f'<table class="tropt-metrics">{rows}</table>')
    body.extend(_table_html(name, df) for name, df in r.tables.items())
    if extra:
        body.append(extra)
    if body:
        attr = " open" if open_details and not r.ok else ""
        parts.append(f"<details{attr}><summary>metrics and evidence</summary>{''.join(body)}</details>")
    parts.append("</div>")
    return "".join(parts)


REPORT_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;max-width:1100px;color:#1f2328}
table{border-collapse:collapse;font-size:90%;margin:4px 0} \
th,td{padding:2px 8px;border-bottom:1px solid #d0d7de;text-align:left}
code{background:#f6f8fa;padding:0 3px} .tropt-more{color:#6e7781;font-style:italic} .tropt-summary{margin:2px 0}
"""


@dataclass
class Report:
    """An ordered collection of :class:`CheckResult` (contract order) with the run identity.

    ``report["loop.accumulation"]`` returns one result; ``report.status`` is the worst status.
    """

    results: list[CheckResult] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> Status:
        """The worst status among the results (SKIP for an empty report)."""
        return max((r.status for r in self.results), key=lambda s: s.rank, default=Status.SKIP)

    def __getitem__(self, check: str) -> CheckResult:
        for r in self.results:
            if r.check == check:
                return r
        raise KeyError(f"no result for {check!r} in this report; it holds: {', '.join(self.checks) or 'nothing'}")

    def __contains__(self, check: object) -> bool:
        return check in self.checks

    def __iter__(self) -> Iterator[CheckResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def checks(self) -> list[str]:
        """The check ids in this report, in order."""
        return [r.check for r in self.results]

    def counts(self) -> dict[str, int]:
        """Number of results per status value."""
        return {s.value: sum(r.status is s for r in self.results) for s in Status}

    def failed(self, fail_on: str = "fail") -> bool:
        """Whether this report should fail a CI gate: ``fail_on`` is "fail", "warn" or "never".

        ERROR counts as failing whenever FAIL does: a check that could not run proves nothing.
        """
        if fail_on not in ("fail", "warn", "never"):
            from .errors import TroptError

            raise TroptError(f"fail_on={fail_on!r} is not one of fail, warn, never", "pass fail_on='fail'")
        threshold = {"fail": Status.ERROR.rank, "warn": Status.WARN.rank, "never": 99}[fail_on]
        return self.status.rank >= threshold

    # ---------------------------------------------------------------- tables and text
    def to_frame(self) -> pd.DataFrame:
        """One row per result: check, stage, title, status, summary, duration_s."""
        from .registry import find_spec

        rows = []
        for r in self.results:
            spec = find_spec(r.check)
            rows.append(
                {
                    "check": r.check,
                    "stage": spec.stage if spec else None,
                    "title": r.title,
                    "status": r.status.value,
                    "summary": r.summary,
                    "duration_s": r.duration_s,
                }
            )
        return pd.DataFrame(rows, columns=["check", "stage", "title", "status", "summary", "duration_s"])

    def to_dict(self) -> dict:
        """JSON-safe dict: ``status``, ``counts``, ``identity`` and ``results``."""
        return {
            "status": self.status.value,
            "counts": self.counts(),
            "identity": json_safe(self.identity),
            "results": [r.to_dict() for r in self.results],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Report:
        """Inverse of :meth:`to_dict`."""
        return cls(results=[CheckResult.from_dict(r) for r in d.get("results", [])],
                   identity=dict(d.get("identity", {})))

    def to_json(self, path=None, indent: int = 2) -> str:
        """Serialise to strict JSON; also write it to ``path`` when given (atomically, as :meth:`to_html`)."""
        return write_json(self.to_dict(), path, indent=indent)

    @classmethod
    def from_json(cls, text_or_path: str) -> Report:
        """Read a report written by :meth:`to_json` (a JSON string or a file path)."""
        return cls.from_dict(read_json(text_or_path))

    def to_markdown(self) -> str:
        """A Markdown summary: one table row per check, then advice and evidence sizes for non-passing ones.

        Every piece of text (summaries, advice, table names, cells, column names) is escaped, so a value holding HTML
        or Markdown renders as that text, never as markup.
        """
        from .verdict import summary_markdown

        t = md_text
        lines = [f"# tropt report — {self.status.value.upper()}", "", *summary_markdown(self), ""]
        lines += ["## All checks in contract order", "", "| status | check | summary |", "|---|---|---|"]
        for r in self.results:
            lines.append(f"| {r.status.value.upper()} | {md_id(r.check)} | {_md_cell(r.summary)} |")
        for r in self.results:
            if r.ok:
                continue
            lines += ["", f"## {r.status.value.upper()} {md_id(r.check)} — {t(r.title)}", "", t(r.summary)]
            lines += [f"- {t(a)}" for a in r.advice]
            for name, df in r.tables.items():
                lines += ["", f"**{t(shorten(name))}** ({len(df)} rows)", "", _markdown_table(df.head(HTML_MAX_ROWS))]
                if len(df) > HTML_MAX_ROWS:
                    lines.append(f"\n_{len(df) - HTML_MAX_ROWS} more rows_")
        cost = cost_line(self.identity or {})
        lines += ["", f"_{t(cost)}_"] if cost else []
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        """The verdict first (what to fix, in order), then every result in contract order, evidence collapsed."""
        from .verdict import summary_html

        details = "".join(result_html(r) for r in self.results)
        cost = cost_line(self.identity or {})
        foot = f'<p class="tropt-cost">{html.escape(cost)}</p>' if cost else ""
        return (
            f'<div class="tropt-report">{summary_html(self)}'
            f'<details class="tropt-all"><summary>all {len(self.results)} checks in contract order, with evidence'
            "</summary>"
            f"{details}</details>{foot}</div>"
        )

    def to_html(self, path=None, title: str = "tropt report") -> str:
        """A standalone HTML page (no external resources); also written to ``path`` when given (atomically: a
        failed write leaves the earlier file, and the :class:`~tropt.errors.TroptError` names the path)."""
        ident = ""
        if self.identity:
            rows = "".join(
                f"<tr><th>{html.escape(shorten(k))}</th><td>{html.escape(shorten(v))}</td></tr>"
                for k, v in self.identity.items()
            )
            ident = f"<details><summary>run identity</summary><table>{rows}</table></details>"
        page = (
            f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{REPORT_CSS}</style></head><body>{self._repr_html_()}{ident}</body></html>"
        )
        if path is not None:
            write_text_atomic(path, page)
        return page

    def log_to(self, target: Any, step: int = 0, *, prefix: str = "tropt", figures: bool = True) -> None:
        """Write this report where you already look: TensorBoard, MLflow or W&B (verdicts as text, status ranks and
        numeric metrics as scalars, each result's figure from :mod:`tropt.plots`).

        ``target``: a ``SummaryWriter`` or a log directory, ``"mlflow"`` (the active run) or an MLflow run,
        ``"wandb"`` or a W&B run, a Lightning logger, or a list of these (see
        :func:`tropt.sinks.as_sink`). Each framework is imported only when used.
        """
        from .sinks import as_sink, log_report

        sink = as_sink(target)
        try:
            log_report(self, sink, step, prefix=prefix, figures=figures)
        finally:
            sink.close()

    def __repr__(self) -> str:
        return f"<Report {self.status.value.upper()}: {len(self.results)} checks {self.counts()}>"

    def __str__(self) -> str:
        """What ``print(report)`` shows: the verdict (what to fix first), then one line per check in contract order;
        safe for a terminal (control characters escaped)."""
        from .verdict import verdict

        width = max((len(c) for c in self.checks), default=10)
        lines = [str(verdict(self)), ""]
        lines += [f"{r.status.value.upper():<5}  {terminal_line(r.check):<{width}}  {terminal_line(r.summary)}"
                  for r in self.results]
        return "\n".join(lines)


def _md_cell(value: Any) -> str:
    """A table cell: :func:`md_text` plus escaped pipes, so a value never splits into another column."""
    return md_text(value).replace("|", "\\|")


def _markdown_table(df: pd.DataFrame) -> str:
    cols = [shorten(df.index.name or "")] + [shorten(c) for c in df.columns]
    out = ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in df.iterrows():
        out.append("| " + " | ".join(_md_cell(shorten(_fmt(v))) for v in [idx, *row.tolist()]) + " |")
    return "\n".join(out)
