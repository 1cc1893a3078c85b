"""The verdict first: one function orders a report's findings, and every surface renders that order.

:func:`verdict` is the only place that decides what a person reads first: FAILs by contract stage (a leak before
an optimizer change), then ERRORs (a check that could not run proves nothing; checks that could not run for one
and the same reason are one finding), then WARNs, each with its one-line summary and its first fix; PASS and SKIP
collapse into one line. Within a status and a stage, findings sort by
:func:`severity`. The HTML report, ``Report._repr_html_``, ``Report.to_markdown``, the CLI text and the Dashboard
all call :func:`verdict` and only format what it returns.
"""

from __future__ import annotations

import html
import math
import os
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .result import _COLOUR, CheckResult, Report, Status, _badge, _fmt

# Metrics that measure how bad a finding is, strongest evidence first, and how each maps to [0, 1].
# fraction: already in [0, 1] (leaked rows, dead units); error: a relative error e -> e / (1 + e);
# speedup: a factor s >= 1 -> 1 - 1/s (2x -> 0.5, 10x -> 0.9).
_SEVERITY_KEYS: tuple[tuple[str, str], ...] = (
    ("leaked_fraction", "fraction"),
    ("overlap_fraction", "fraction"),
    ("affected_fraction", "fraction"),
    ("max_pair_fraction", "fraction"),
    ("target_fraction", "fraction"),
    ("zero_fraction", "fraction"),
    ("loss_fraction", "fraction"),
    ("fraction", "fraction"),
    ("max_rel_error", "error"),
    ("global_rel_error", "error"),
    ("pre_clip_max_rel_error", "error"),
    ("final_rel_error", "error"),
    ("final_param_max_rel_error", "error"),
    ("after_load_rel_error", "error"),
    ("rel_error", "error"),
    ("speedup_vs_fp32", "speedup"),
    ("speedup", "speedup"),
)
_DEFAULT_SEVERITY = 0.5  # a finding with no measured size sorts between a small and a large one

# The order statuses are read in; PASS and SKIP are not findings.
_FINDING_ORDER = (Status.FAIL, Status.ERROR, Status.WARN)


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def severity(result: CheckResult) -> tuple[float, str | None]:
    """How bad a finding is, in [0, 1], and the metric it was read from (None when none applies).

    Normalised so findings of one status compare: a fraction as is (the leaked fraction), a relative error ``e``
    as ``e / (1 + e)``, a speed-up ``s`` as ``1 - 1/s``. Without such a metric the score is 0.5.
    """
    for key, kind in _SEVERITY_KEYS:
        x = _number(result.metrics.get(key))
        if x is None or isinstance(result.metrics.get(key), bool):
            continue
        if kind == "fraction":
            return min(max(x, 0.0), 1.0), key
        if kind == "error":
            x = abs(x)
            return x / (1.0 + x), key
        if x > 1.0:
            return 1.0 - 1.0 / x, key
        return 0.0, key
    return _DEFAULT_SEVERITY, None


def _stage(check: str) -> int:
    from .registry import PUBLIC_IDS

    return PUBLIC_IDS.get(check, 99)


def _contract_index(check: str) -> int:
    from .registry import _ORDER

    return _ORDER.get(check, len(_ORDER))


@dataclass(frozen=True)
class Finding:
    """One non-passing result as the verdict shows it."""

    result: CheckResult
    severity: float
    severity_metric: str | None
    same: tuple[str, ...] = ()  # other checks that could not run for the very same reason (one Setup error)

    @property
    def check(self) -> str:
        return self.result.check

    @property
    def summary(self) -> str:
        """The result's summary, naming the other checks it stands for when several ERRORed alike."""
        if not self.same:
            return self.result.summary
        return f"{self.result.summary} (the same error in {len(self.same)} more check(s): {', '.join(self.same)})"

    @property
    def status(self) -> Status:
        return self.result.status

    @property
    def first_fix(self) -> str | None:
        return self.result.advice[0] if self.result.advice else None

    @property
    def key_number(self) -> str | None:
        """``metric=value`` of the number the severity was read from (the key number shown in the summary)."""
        if self.severity_metric is None:
            return None
        return f"{self.severity_metric}={_fmt(self.result.metrics[self.severity_metric])}"


@dataclass(frozen=True)
class Verdict:
    """A report's verdict: its status, the findings in the order to fix them, and what passed or was skipped."""

    status: Status
    findings: list[Finding] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        """The verdict as text (what ``print(tropt.verdict(report))`` shows): :func:`summary_lines`."""
        return "\n".join(summary_lines(self))

    @property
    def total(self) -> int:
        """How many checks the report holds (a grouped ERROR counts every check it stands for)."""
        return sum(1 + len(f.same) for f in self.findings) + len(self.passed) + len(self.skipped)

    @property
    def ran(self) -> int:
        """How many checks ran: every check that was not SKIPped."""
        return self.total - len(self.skipped)

    @property
    def unexamined_stages(self) -> list[tuple[int, str]]:
        """The contract stages (number, name) present in the report whose every check SKIPped: nothing was examined
        there, whatever the overall status says."""
        from .registry import STAGES

        checks = [c for f in self.findings for c in (f.check, *f.same)] + self.passed + self.skipped
        present = {_stage(c) for c in checks}
        examined = {_stage(c) for c in checks if c not in set(self.skipped)}
        return [(s, STAGES[s]) for s in sorted(present - examined) if s in STAGES]

    @property
    def headline(self) -> str:
        """The overall verdict in one sentence: the findings, how many checks ran, and the stages not examined.

        A report whose checks mostly SKIPped must not read as a clean bill of health: the skipped checks are counted
        apart, and a stage whose every check skipped is named as not examined."""
        n = {s: sum(1 + len(f.same) for f in self.findings if f.status is s) for s in _FINDING_ORDER}
        parts = [f"{n[s]} {s.value.upper()}" for s in _FINDING_ORDER if n[s]]
        total, ran, skipped = self.total, self.ran, len(self.skipped)
        stages = ", ".join(f"stage {s} {name}" for s, name in self.unexamined_stages)
        unexamined = f"not examined: {stages}" if stages else ""
        if not ran:
            if not total:
                return "nothing was checked: no checks in the report"
            return (f"nothing was checked: {'the 1 check' if total == 1 else f'all {total} checks'} skipped"
                    + (f" ({unexamined})" if unexamined else ""))
        counts = "; ".join(b for b in (f"{skipped} of {total} skipped" if skipped else "", unexamined) if b)
        if not parts:
            return (f"nothing to fix in the {ran} {'check that' if ran == 1 else 'checks that'} ran"
                    + (f" ({counts})" if counts else ""))
        ran_part = f"{ran} ran, {skipped} skipped" if skipped else ""
        detail = "; ".join(b for b in (ran_part, unexamined) if b)
        return f"{', '.join(parts)} of {total} checks" + (f" ({detail})" if detail else "") + "; fix them in this order"

    @property
    def rest_line(self) -> str:
        """PASS and SKIP collapsed into one line."""
        bits = []
        if self.passed:
            bits.append(f"{len(self.passed)} PASS ({', '.join(self.passed)})")
        if self.skipped:
            bits.append(f"{len(self.skipped)} SKIP ({', '.join(self.skipped)})")
        return "; ".join(bits)


def verdict_order(results: Iterable[CheckResult]) -> list[Finding]:
    """The non-passing results in the order to fix them: FAIL, ERROR, WARN; within each by contract stage, then
    by severity (highest first), then contract order. A symptom of a broken step is ranked after its root cause
    (:func:`rank_stage`)."""
    findings = []
    for r in results:
        if r.status in _FINDING_ORDER:
            score, metric = severity(r)
            findings.append(Finding(r, score, metric))
    findings.sort(key=lambda f: (_FINDING_ORDER.index(f.status), *rank_stage(f.result), -f.severity,
                                 _contract_index(f.check)))
    return _group_errors(findings)


def rank_stage(result: CheckResult) -> tuple[int, int]:
    """(stage, 0 or 1) a finding is ranked at: its contract stage, or, for a symptom of a broken step
    (``metrics["symptom_of"]``, see :func:`tropt.linking.link_findings`), right after the root cause it follows from."""
    root = result.metrics.get("symptom_of")
    if isinstance(root, str) and root != result.check:
        return max(_stage(result.check), _stage(root)), 1
    return _stage(result.check), 0


def _group_errors(findings: list[Finding]) -> list[Finding]:
    """ERRORs with the same summary and first fix (a Setup every check rejects for one reason) as one finding, at
    the place of the first: a person reads the reason once, not once per check."""
    out: list[Finding] = []
    first: dict[tuple, int] = {}
    for f in findings:
        key = (f.result.summary, f.first_fix)
        if f.status is Status.ERROR and key in first:
            i = first[key]
            out[i] = Finding(out[i].result, out[i].severity, out[i].severity_metric, (*out[i].same, f.check))
            continue
        if f.status is Status.ERROR:
            first[key] = len(out)
        out.append(f)
    return out


def verdict(report: Report | Iterable[CheckResult]) -> Verdict:
    """The verdict of a report (or of a list of results): see :func:`verdict_order`."""
    results = list(report.results if isinstance(report, Report) else report)
    status = max((r.status for r in results), key=lambda s: s.rank, default=Status.SKIP)
    return Verdict(
        status,
        verdict_order(results),
        [r.check for r in results if r.status is Status.PASS],
        [r.check for r in results if r.status is Status.SKIP],
    )


# ------------------------------------------------------------------------------------------------ renderings
_MARK = {"pass": "PASS ", "warn": "WARN ", "fail": "FAIL ", "error": "ERROR", "skip": "SKIP "}


def summary_lines(report: Report | Verdict | Iterable[CheckResult], width: int = 110) -> list[str]:
    """The verdict as plain-text lines (the CLI): headline, numbered findings with their first fix, the rest. Safe
    for a terminal: control characters in a value are escapes (:func:`tropt.output.terminal_line`)."""
    import textwrap

    from .output import terminal_line as t

    v = report if isinstance(report, Verdict) else verdict(report)
    lines = [f"verdict: {v.status.value.upper()}: {t(v.headline)}"]
    pad = max((len(t(f.check)) for f in v.findings), default=10)
    for i, f in enumerate(v.findings, 1):
        lines.append(f"{i:>2}. {_MARK[f.status.value]}  {t(f.check):<{pad}}  {t(f.summary)}")
        if f.first_fix:
            lines.append(textwrap.fill(t(f.first_fix), width, initial_indent=" " * (pad + 12) + "→ ",
                                       subsequent_indent=" " * (pad + 14)))
    if v.rest_line:
        lines.append(t(v.rest_line))
    return lines


def doc_url(check: str) -> str:
    """Where the "what this means" page of a check lives: ``$TROPT_DOCS_URL/<id>.md`` when that variable is set
    (e.g. a docs site), else the page shipped inside the installed package (a ``file://`` URL)."""
    base = os.environ.get("TROPT_DOCS_URL")
    if base:
        return f"{base.rstrip('/')}/{check}.md"
    from .checkdocs import check_doc_path

    return check_doc_path(check).as_uri()


def doc_link_html(check: str) -> str:
    """The "what this means" link of a check (empty for an unregistered id, which has no page)."""
    from .registry import PUBLIC_IDS

    if check not in PUBLIC_IDS:
        return ""
    return (f' <a class="tropt-doc" href="{html.escape(doc_url(check))}" target="_blank" rel="noopener">'
            "what this means</a>")


def summary_html(report: Report | Iterable[CheckResult]) -> str:
    """The verdict as an HTML block: the overall badge and headline, then what to fix first, in order."""
    e = html.escape
    v = verdict(report)
    rows = []
    for _i, f in enumerate(v.findings, 1):
        key = f' <span class="tropt-key">({e(f.key_number)})</span>' if f.key_number else ""
        fix = f'<div class="tropt-fix">→ {e(f.first_fix)}</div>' if f.first_fix else ""
        rows.append(
            f'<li class="tropt-finding" data-check="{e(f.check)}" data-status="{f.status.value}" '
            f'style="margin:4px 0;border-left:4px solid {_COLOUR[f.status]};padding-left:8px;'
            'list-style-position:inside">'
            f"{_badge(f.status)} <code>{e(f.check)}</code> {e(f.summary)}{key}{doc_link_html(f.check)}{fix}</li>"
        )
    rest = ""
    if v.passed or v.skipped:
        badges = " ".join(_badge(s) for s, ids in ((Status.PASS, v.passed), (Status.SKIP, v.skipped)) if ids)
        rest = f'<div class="tropt-rest" style="color:#57606a">{badges} {e(v.rest_line)}</div>'
    fixes = f'<ol class="tropt-fix-first" style="padding-left:0">{"".join(rows)}</ol>' if rows else ""
    return (
        f'<div class="tropt-verdict" data-status="{v.status.value}">'
        f'<div class="tropt-headline" style="font-size:115%;margin:4px 0">{_badge(v.status)} '
        f"<b>{e(v.headline)}</b></div>"
        f"{fixes}{rest}</div>"
    )


def summary_markdown(report: Report | Iterable[CheckResult]) -> list[str]:
    """The verdict as Markdown lines (every piece of text escaped as ``Report.to_markdown`` does)."""
    from .result import md_id, md_text

    v = verdict(report)
    lines = [f"**Verdict: {v.status.value.upper()}: {md_text(v.headline)}**", ""]
    for i, f in enumerate(v.findings, 1):
        key = f" ({md_text(f.key_number)})" if f.key_number else ""
        lines.append(f"{i}. **{f.status.value.upper()}** {md_id(f.check)} — {md_text(f.summary)}{key}")
        if f.first_fix:
            lines.append(f"   → {md_text(f.first_fix)}")
    if v.rest_line:
        lines += ["", md_text(v.rest_line)]
    return lines


class _CallableModule(types.ModuleType):
    """``tropt.verdict`` is the public function and the name of this module alike; importing the module (any
    rendering does) sets the package's attribute to the module, so the module calls the function: ``tropt.verdict
    (report)`` works whichever the attribute holds."""

    def __call__(self, report: Report | Iterable[CheckResult]) -> Verdict:
        return verdict(report)


sys.modules[__name__].__class__ = _CallableModule
