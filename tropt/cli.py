"""The ``tropt`` command line: ``tropt checks``, ``tropt diagnose``, ``tropt report``, ``tropt suggest`` and
``tropt plan``.

Everything it prints goes through :func:`echo`: a value from the user's data (a label, a split name, a path) reaches
the terminal with its control characters escaped, so it can neither set the window title nor forge a line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import TroptError
from .output import terminal_line, terminal_text, write_text_atomic


def echo(text: object = "", *, err: bool = False) -> None:
    """Print ``text`` to stdout (``err``: stderr) for a terminal: control characters escaped, flushed at once."""
    print(terminal_text(text), file=sys.stderr if err else sys.stdout, flush=True)


def result_line(result, width: int = 26) -> str:
    """One check's line: status, id, summary (what ``tropt diagnose`` prints as each check finishes); one line
    whatever the summary holds."""
    from .verdict import _MARK

    return f"{_MARK[result.status.value]}  {terminal_line(result.check):<{width}}  {terminal_line(result.summary)}"


def format_report(report) -> str:
    """The verdict as plain text: the overall status, what to fix first in order (each with its first fix), PASS
    and SKIP on one line, then the report status (see :func:`tropt.verdict.summary_lines`)."""
    from .verdict import summary_lines

    counts = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
    return "\n".join([*summary_lines(report),
                      f"\nreport status: {report.status.value.upper()} ({counts or 'no checks'})"])


def _parse_splits(items: Sequence[str] | None) -> dict[str, str] | None:
    if not items:
        return None
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise TroptError(f"--split {item!r} is not NAME=PATH",
                             "e.g. --split train=data/train.csv --split test=data/test.csv")
        out[name] = path
    return out


def _cmd_checks(args: argparse.Namespace) -> int:
    from .registry import list_checks

    df = list_checks()
    if df.empty:
        echo("no checks are implemented in this version")
        return 0
    for stage, rows in df.groupby("stage", sort=True):
        echo(f"stage {stage}: {rows['stage_name'].iloc[0]}")
        for _, row in rows.iterrows():
            echo(f"  {row['id']:<26} {row['title']} — {row['description']}")
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from .diagnosis import diagnose
    from .loading import load_setup
    from .report.outputs import check_output_file

    for flag, path in (("--json", args.json), ("--html", args.html)):
        if path:
            check_output_file(path, flag)  # before any check runs: a bad path must not cost the run
    setup = load_setup(args.setup) if args.setup else None
    if setup is not None and args.seed is not None:
        setup = setup.replace(seed=args.seed)
    echo("checks, as they finish:")
    report = diagnose(setup, _parse_splits(args.split), label=args.label, group=args.group, time=args.time,
                      checks=args.checks, task=args.task, progress=False, budget=args.budget,
                      on_result=lambda r: echo(result_line(r)))
    echo()
    echo(format_report(report))
    from .budgets import oversubscribed

    note = oversubscribed()
    if note:
        echo(f"note: {note}")
    if args.json:
        report.to_json(args.json)
        echo(f"findings written to {args.json}")
    if args.html:
        report.to_html(args.html)
        echo(f"HTML report written to {args.html}")
    return 1 if report.failed(args.fail_on) else 0


def _parse_value(text: str):
    """A -p value: JSON when it parses (numbers, lists, objects, true/null), else the plain string."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import run_report

    params = {name: _parse_value(value) for name, value in (args.param or [])}
    outcome = run_report(args.kind, params, args.output, no_input=not args.show_input,
                         progress=not args.no_progress and sys.stderr.isatty())  # a bar in a CI log is noise
    if outcome.report is not None:
        echo(format_report(outcome.report))
    if outcome.error:
        echo(f"tropt: report failed: {outcome.error}", err=True)
    echo(f"notebook: {outcome.notebook}\nhtml:     {outcome.html}"
          + (f"\nfindings: {outcome.findings}" if outcome.findings else ""))
    if outcome.comparison is not None:
        from .experiments.comparison import Comparison

        echo(f"comparison: {outcome.comparison}\n{Comparison.from_json(str(outcome.comparison)).summary()}")
    if outcome.plan is not None:
        echo(f"plan:     {outcome.plan} ({outcome.plan.with_suffix('.html')}): {str(outcome.plan_outcome).upper()}")
    return outcome.exit_code(args.fail_on)


def _cmd_plan(args: argparse.Namespace) -> int:
    """``tropt plan``: the optimization plan from findings (and a comparison), as Markdown or standalone HTML."""
    from .experiments.plan import OptimizationPlan
    from .report.outputs import check_output_file

    out = str(args.output)
    if not out.endswith((".md", ".html", ".htm", ".json")):
        raise TroptError(f"-o {out}: the plan's format is chosen by the extension",
                         "use -o plan.md, plan.html or plan.json")
    check_output_file(out, "-o")
    plan = OptimizationPlan.from_report(args.findings, args.comparison)
    if out.endswith(".md"):
        write_text_atomic(out, plan.to_markdown())
    elif out.endswith(".json"):
        plan.to_json(out)
    else:
        plan.to_html(out)
    echo(f"plan: {plan.outcome.upper()} — {plan.outcome_reason}\nwritten to {out}")
    return 1 if plan.escalates else 0


def _cmd_suggest(args: argparse.Namespace) -> int:
    """``tropt suggest``: the candidate interventions the findings point to (what ``tropt.suggest`` returns); exit 1
    when correctness FAILs block any comparison."""
    import json

    from .experiments.candidates import describe_overrides
    from .experiments.suggest import suggest

    setup = None
    if args.setup:
        from .loading import load_setup

        setup = load_setup(args.setup)
    out = suggest(args.findings, setup)
    if out.blocking:
        echo("blocked: fix these correctness FAILs first; nothing is worth comparing before them")
        for r in out.blocking:
            echo(f"  {result_line(r)}")
    else:
        echo(f"{len(out)} candidate(s) to compare (tropt report compare, or tropt.compare(setup, candidates)):"
             if len(out) else "no candidate follows from these findings")
        for name, s in out.details.items():
            echo(f"  {name}: {json.dumps(describe_overrides(s.overrides), default=str)}")
            echo(f"      {s.hypothesis} (from {s.finding}: {s.evidence})")
    for h in out.hypotheses:
        echo(f"  hypothesis, not compared: {h.name}: {h.hypothesis} ({h.why_not_compared or 'no override'})")
    if args.json:
        doc = {"blocking": [r.check for r in out.blocking],
               "candidates": {n: s.to_dict() for n, s in out.details.items()},
               "hypotheses": [h.to_dict() for h in out.hypotheses]}
        write_text_atomic(args.json, json.dumps(doc, indent=2, default=str))
    return 1 if out.blocking else 0


_EPILOG = {
    "checks": "example:\n  tropt checks",
    "diagnose": ("examples:\n"
                 "  tropt diagnose --setup data/samples/sample_setup.py:make_setup\n"
                 "  tropt diagnose --split train=data/samples/train.csv --split test=data/samples/test.csv \\\n"
                 "      --label churned --group customer_id --time signup_date --budget quick\n"
                 "  tropt diagnose --setup my_project.train:make_setup --checks loop,2 --json findings.json"),
}


def _report_epilog() -> str:
    """Each report notebook that ships, with its parameters (read from its ``parameters`` cell) and an example."""
    from .report.runner import available_reports, declared_parameters, notebook_path

    lines = ["report kinds and their parameters (-p NAME VALUE):"]
    for kind in available_reports():
        try:
            names = [n for n in declared_parameters(notebook_path(kind)) if n != "output_dir"]
        except TroptError as exc:  # the [report] extra is missing: say so instead of failing every command
            names = [f"(cannot read them: {exc})"]
        lines.append(f"  {kind}: {', '.join(names)}")
    lines += ["", "example:",
              "  tropt report diagnose -p setup data/samples/sample_setup.py:make_setup \\",
              "      -p splits '{\"train\": \"data/samples/train.csv\", \"test\": \"data/samples/test.csv\"}' \\",
              "      -p label churned -p budget quick -o reports/demo"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .report.runner import available_reports

    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="tropt", description="Diagnose PyTorch training setups.", formatter_class=raw,
                                     epilog="example:\n"
                                            "  tropt diagnose --setup data/samples/sample_setup.py:make_setup\n"
                                            "run `tropt COMMAND --help` for each command's options and examples")
    parser.add_argument("--version", action="version", version=f"tropt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("checks", help="list the implemented checks", epilog=_EPILOG["checks"], formatter_class=raw)
    p.set_defaults(func=_cmd_checks)
    p = sub.add_parser("diagnose", help="run the checks on a setup and/or data splits", epilog=_EPILOG["diagnose"],
                       formatter_class=raw, description="Run the checks; each check's line prints as it finishes, "
                       "then the verdict: what to fix first, in order.")
    p.add_argument("--setup", help="path/to/file.py:function or module:function returning a tropt.Setup")
    p.add_argument("--split", action="append", metavar="NAME=PATH", help="a data split (CSV/Parquet); repeat, in order")
    p.add_argument("--label", help="label column of the splits")
    p.add_argument("--group", help="group/entity id column of the splits")
    p.add_argument("--time", help="timestamp column of the splits")
    p.add_argument("--checks", help="comma-separated ids, prefixes (loop) or stage numbers; default all")
    p.add_argument("--task", choices=["classification", "regression"],
                   help="the label's task (default: inferred from the labels)")
    p.add_argument("--budget", choices=["quick", "standard", "thorough"], default="standard",
                   help="quick: fewer steps for a first answer in seconds; thorough: more steps and seeds "
                        "(default standard)")
    p.add_argument("--seed", type=int, help="override the Setup's seed")
    p.add_argument("--json", metavar="FILE", help="write findings as JSON")
    p.add_argument("--html", metavar="FILE", help="write a standalone HTML report")
    p.add_argument("--fail-on", choices=["fail", "warn", "never"], default="fail",
                   help="exit 1 at this status or worse (default fail; ERROR counts as fail)")
    p.add_argument("--no-progress", action="store_true",
                   help="accepted for compatibility: lines print as checks finish")
    p.set_defaults(func=_cmd_diagnose)
    kinds = available_reports()
    p = sub.add_parser("report", help="execute a report notebook into OUT_DIR/{report.ipynb,report.html,findings.json}",
                       epilog=_report_epilog(), formatter_class=raw)
    p.add_argument("kind", choices=kinds, help="which report notebook to run: " + ", ".join(kinds))
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="a notebook parameter; VALUE is JSON when it parses, else a string (repeat)")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR", help="where to write the report")
    p.add_argument("--show-input", action="store_true",
                   help="show the notebook's code cells in the HTML (hidden by default)")
    p.add_argument("--no-input", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar over the notebook's cells (shown when stderr is a terminal)")
    p.add_argument("--fail-on", choices=["fail", "warn", "never"], default="fail",
                   help="exit 1 at this status or worse")
    p.set_defaults(func=_cmd_report)
    p = sub.add_parser("suggest", help="the candidate interventions the findings point to",
                       description="Candidate interventions derived from findings.json (tropt.suggest), each with "
                                   "its hypothesis and the finding behind it. Exit 1 when correctness FAILs block "
                                   "any comparison.",
                       epilog="example: tropt suggest --findings reports/demo/findings.json "
                              "--setup data/samples/sample_setup.py:make_setup")
    p.add_argument("--findings", required=True, metavar="FILE",
                   help="findings.json written by tropt diagnose / a report")
    p.add_argument("--setup", help="the Setup the findings came from (path/to/file.py:function), for candidates "
                                   "that rebuild its DataLoader or optimizer")
    p.add_argument("--json", metavar="FILE", help="write the suggestions as JSON")
    p.set_defaults(func=_cmd_suggest)
    p = sub.add_parser("plan", help="write the optimization plan from findings.json (and comparison.json)",
                       description="The optimization plan: baseline, bottlenecks, prioritised interventions, adopted "
                                   "changes, stop/escalate conditions. Exit 1 when the plan ends in escalate.",
                       epilog="example: tropt plan --findings reports/demo/findings.json "
                              "--comparison reports/demo/comparison.json -o plan.html")
    p.add_argument("--findings", required=True, metavar="FILE",
                   help="findings.json written by tropt diagnose / a report")
    p.add_argument("--comparison", metavar="FILE", help="comparison.json written by tropt report compare / optimize")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="plan.md, plan.html or plan.json")
    p.set_defaults(func=_cmd_plan)
    _add_rerun(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 gate failed, 2 bad input or a failed report notebook,
    130/143 interrupted/terminated)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "diagnose" and not args.setup and not args.split:
            raise TroptError("tropt diagnose needs --setup and/or --split",
                             "e.g. tropt diagnose --setup data/samples/sample_setup.py:make_setup")
        return args.func(args)
    except TroptError as exc:
        echo(f"tropt: error: {exc}", err=True)
        return 2
    except OSError as exc:  # writing an output failed: bad input, not a failed gate (exit 1 means only that)
        echo(f"tropt: error: {exc}", err=True)
        return 2
    except KeyboardInterrupt as exc:
        import logging

        from .report.runner import Terminated

        # The interrupt kills the kernel under nbclient's running cell task; asyncio would log that task's
        # DeadKernelError ("Task exception was never retrieved", a traceback) at exit, after the line below.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)

        terminated = isinstance(exc, Terminated)
        where = f"; {args.output} holds the previous report, unchanged" if args.command == "report" else ""
        echo(f"tropt: {'terminated' if terminated else 'interrupted'}{where}", err=True)
        return 143 if terminated else 130


def _add_rerun(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rerun", help="re-run a plan's adopted change from plan.json and check its scores (exit 1: "
                                     "not reproduced)",
                       epilog="example: tropt rerun plan.json --setup my_setup.py:make")
    p.add_argument("plan", help="plan.json written by tropt plan / OptimizationPlan.to_json")
    p.add_argument("--setup", required=True, help="path/to/file.py:function returning the tropt.Setup of the plan")
    p.add_argument("--candidates", help="path/to/file.py:function returning {name: overrides} for the adopted "
                                        "change's factories or modules (values a plan cannot hold)")
    p.add_argument("--json", metavar="FILE", help="write the rows (plan score, re-run score) as JSON")
    p.set_defaults(func=_cmd_rerun)


def _cmd_rerun(args: argparse.Namespace) -> int:
    from .experiments.replay import run_cli

    return run_cli(args.plan, args.setup, args.candidates, args.json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
