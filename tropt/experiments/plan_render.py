"""How an :class:`~tropt.experiments.plan.OptimizationPlan` reads: Markdown and HTML (values only come in).

Sections, in order: the outcome, the baseline (with what the comparison was equal in), the bottlenecks (FAILs and
checks that could not run; never a WARN), the warnings, the prioritised interventions, cost and quality side by
side (a table, and in HTML the Pareto view drawn by :func:`tropt.plots.experiments.plot_cost_quality`), the adopted
changes, the stop and escalate conditions, notes and the run identity (the one data fingerprint of the plan).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .interventions import fmt, show

if TYPE_CHECKING:
    from .plan import OptimizationPlan

COST_HEADER = ("candidate", "changes", "verdict", "gain (95% CI)", "steps", "samples", "s/step", "s/run",
               "relative cost", "cost/run", "Pareto")


def _ci(r: dict) -> str:
    if r["name"] == "baseline":
        return "—"
    return f"{fmt(r.get('gain'))} ({fmt(r.get('ci_low'))}..{fmt(r.get('ci_high'))})"


def cost_cells(r: dict) -> list[str]:
    """One row of the cost-and-quality table, as text cells (see :data:`COST_HEADER`)."""
    rel = r.get("relative_cost")
    return [str(r["name"]), str(r.get("changes") or ""), str(r.get("verdict") or ""), _ci(r),
            fmt(r.get("steps")), fmt(r.get("samples")), fmt(r.get("seconds_per_step")), fmt(r.get("seconds")),
            f"{rel:.2f}×" if isinstance(rel, float) and rel == rel else "n/a", fmt(r.get("cost")),
            "yes" if r.get("pareto") else ""]


def _cost_note(plan: OptimizationPlan) -> str:
    front = [r["name"] for r in plan.costs if r.get("pareto")]
    return (f"Cost is reported beside the gain, never ranked by. Every cost is per run, the mean over its seeds. "
            f"Pareto front (no other candidate is both better and cheaper): {', '.join(front) or 'none'}.")


def markdown(plan: OptimizationPlan) -> str:
    """The plan as Markdown; every piece of user text is escaped."""
    from ..result import md_text as t

    def cell(x: str) -> str:
        return t(x).replace("|", "\\|")

    lines = [f"# tropt optimization plan — {t(plan.outcome.upper())}", "", t(plan.outcome_reason), ""]
    lines += ["## Baseline", ""] + [f"- **{t(k)}**: {t(show(v))}" for k, v in plan.baseline.items()]
    lines += ["", "## Bottlenecks (worst first)", ""]
    lines += [f"- **{t(b['status'].upper())}** `{t(b['check'])}` — {t(b['summary'])}"
              + (f" *Fix:* {t(b['fix'])}" if b.get("fix") else "")
              for b in plan.bottlenecks] or [f"_{t(plan.why_empty.get('bottlenecks', ''))}_"]
    if plan.warnings:
        lines += ["", "## Warnings (need judgement, not bottlenecks)", ""]
        lines += [f"- **WARN** `{t(w['check'])}` — {t(w['summary'])}" + (f" *Advice:* {t(w['fix'])}" if w.get("fix")
                                                                          else "") for w in plan.warnings]
    lines += ["", "## Prioritised interventions", ""]
    if not plan.interventions:
        lines.append(f"_{t(plan.why_empty.get('interventions', ''))}_")
    from .plan import INTERVENTION_FIELDS

    for iv in plan.interventions:
        lines += [f"### {iv['priority']}. {t(heading(iv))}", ""]
        for k in INTERVENTION_FIELDS[4:] + tuple(k for k in ("fix", "evidence") if iv.get(k)):
            lines.append(f"- **{k}**: {t(show(iv[k]))}")
        lines.append("")
    if plan.costs:
        lines += ["## Cost and quality", "", t(_cost_note(plan)), "",
                  "| " + " | ".join(COST_HEADER) + " |", "|" + "---|" * len(COST_HEADER)]
        lines += ["| " + " | ".join(cell(c) for c in cost_cells(r)) + " |" for r in plan.costs]
        lines.append("")
    lines += ["## Adopted changes", ""]
    lines += [f"- **{t(a['name'])}**: {t(show(a['changed']))} — {t(a['observed'])}"
              for a in plan.adopted] or [f"_{t(plan.why_empty.get('adopted', ''))}_"]
    lines += ["", "## Stop conditions", ""] + [f"- {t(c)}" for c in plan.stop_conditions]
    lines += ["", "## Escalate conditions", ""] + [f"- {t(c)}" for c in plan.escalate_conditions]
    if plan.notes:
        lines += ["", "## Notes", ""] + [f"- {t(n)}" for n in plan.notes]
    lines += ["", "## Run identity", ""] + [f"- {t(k)}: {t(show(v))}" for k, v in plan.identity.items()]
    return "\n".join(lines) + "\n"


def heading(iv: dict) -> str:
    """An intervention's title: its name, what it changes and where it comes from."""
    changed = show(iv.get("changed")) if iv.get("kind") == "compared candidate" else ""
    origin = iv.get("finding", "")
    origin = "your candidate" if origin == "your candidate" else f"from {origin}"
    return f"{iv['name']}" + (f" — {changed}" if changed else "") + f" ({iv['kind']}, {origin})"


def pareto_svg(plan: OptimizationPlan) -> str:
    """The Pareto view as inline SVG (matplotlib's), or '' when it cannot be drawn (no matplotlib, no points)."""
    if not plan.costs:
        return ""
    try:
        import io

        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        from ..plots.experiments import plot_cost_quality

        fig, ax = plt.subplots(figsize=(6, 3.6))
        try:
            plot_cost_quality(plan.costs, plan.metric, plan.higher_is_better, ax=ax)
            buf = io.StringIO()
            fig.savefig(buf, format="svg", bbox_inches="tight")
        finally:
            plt.close(fig)
    except Exception:  # noqa: BLE001 - the table carries the same numbers
        return ""
    text = buf.getvalue()
    return text[text.find("<svg"):]


def html_body(plan: OptimizationPlan) -> str:
    """The plan as an HTML fragment (what a notebook shows); :meth:`OptimizationPlan.to_html` wraps it."""
    from .plan import ADOPTED, BLOCKED, ESCALATED, INTERVENTION_FIELDS

    e = lambda x: html.escape(show(x))  # noqa: E731
    colour = {BLOCKED: "#cf222e", ESCALATED: "#9a6700", ADOPTED: "#1a7f37"}.get(plan.outcome, "#6e7781")
    parts = [f'<div class="tropt-plan"><h1>tropt optimization plan — '
             f'<span style="color:{colour}">{e(plan.outcome.upper())}</span></h1>',
             f"<p>{e(plan.outcome_reason)}</p><h2>Baseline</h2><table>"]
    parts += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in plan.baseline.items()]
    parts.append("</table><h2>Bottlenecks (worst first)</h2><ol>")
    parts += [f"<li><b>{e(b['status'].upper())}</b> <code>{e(b['check'])}</code> — {e(b['summary'])}"
              + (f"<br><i>Fix:</i> {e(b['fix'])}" if b.get("fix") else "") + "</li>" for b in plan.bottlenecks]
    if not plan.bottlenecks:
        parts.append(f"<li><i>{e(plan.why_empty.get('bottlenecks', ''))}</i></li>")
    parts.append("</ol>")
    if plan.warnings:
        parts.append("<h2>Warnings (need judgement, not bottlenecks)</h2><ul>")
        parts += [f"<li><b>WARN</b> <code>{e(w['check'])}</code> — {e(w['summary'])}</li>" for w in plan.warnings]
        parts.append("</ul>")
    parts.append("<h2>Prioritised interventions</h2>")
    if not plan.interventions:
        parts.append(f"<p><i>{e(plan.why_empty.get('interventions', ''))}</i></p>")
    for iv in plan.interventions:
        parts.append(f"<h3>{iv['priority']}. {e(heading(iv))}</h3><table>")
        parts += [f"<tr><th>{k}</th><td>{e(iv[k])}</td></tr>"
                  for k in INTERVENTION_FIELDS[4:] + tuple(k for k in ("fix", "evidence") if iv.get(k))]
        parts.append("</table>")
    if plan.costs:
        parts.append(f'<h2>Cost and quality</h2><p>{e(_cost_note(plan))}</p><table class="tropt-costs"><tr>'
                     + "".join(f"<th>{e(h)}</th>" for h in COST_HEADER) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in cost_cells(r)) + "</tr>" for r in plan.costs]
        parts.append("</table>" + pareto_svg(plan))
    parts.append("<h2>Adopted changes</h2><ul>")
    parts += [f"<li><b>{e(a['name'])}</b>: {e(a['changed'])} — {e(a['observed'])}</li>" for a in plan.adopted]
    if not plan.adopted:
        parts.append(f"<li><i>{e(plan.why_empty.get('adopted', ''))}</i></li>")
    parts.append("</ul><h2>Stop conditions</h2><ul>" + "".join(f"<li>{e(c)}</li>" for c in plan.stop_conditions))
    parts.append("</ul><h2>Escalate conditions</h2><ul>"
                 + "".join(f"<li>{e(c)}</li>" for c in plan.escalate_conditions) + "</ul>")
    if plan.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in plan.notes) + "</ul>")
    parts.append("<details><summary>run identity</summary><table>"
                 + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in plan.identity.items())
                 + "</table></details></div>")
    return "".join(parts)

