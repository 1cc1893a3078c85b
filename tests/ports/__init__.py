"""The corpus of ports (issue 28): small CPU ports of widely used public training loops, one module per family.

Each family module (``tests/ports/<family>.py``) defines ``PORTS: list[Port]``. A port is paraphrased from its
upstream (the file named in ``Port.upstream`` and in its builder's docstring), never copied; it uses a tiny model and
generated data so the whole corpus runs in the suite. Each family plants at least one documented bug (``Bug``) that
its check id must flag with its cause. ``tests/ports/heldout/`` holds the ports first written as held-out probes, each
filed under its corpus family by :func:`ports.heldout.ported`; :func:`all_ports` includes them.

How the corpus is judged (``tests/ports/test_corpus.py``, ``benchmarks/corpus_rates.py``):

- a healthy port is diagnosed with every check except ``perf.*`` (timing checks: their verdicts depend on the load
  of the machine) under ``budget="quick"`` and one torch thread: any FAIL or ERROR is a false alarm;
- a planted bug is diagnosed with the checks of stages 2-4 (or ``Bug.checks``): it is *flagged* when ``Bug.check``
  is FAIL or WARN, and its *cause is named* when every text of ``Bug.causes`` appears in that result's summary,
  advice or metrics.

Run the corpus before every change to a check's verdicts.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FAMILIES = (
    "image_classification",  # EMA, mixup, AMP
    "detection",  # fine-tuning with frozen stages and frozen BatchNorm
    "gan",  # two optimizers in one step, gradient penalties
    "diffusion",  # a stochastic step: noise and timesteps per sample
    "contrastive",  # in-batch negatives: image-text and self-supervised
    "masked",  # masked autoencoders, stochastic depth
    "causal_lm",
    "seq2seq",  # encoder-decoder translation and summarisation
    "rnn_lm",  # recurrent language models: carried hidden state
    "tabular",  # recommendation and tabular models
    "rl",  # policy gradients with a rollout or replay buffer
    "finetune",  # layer-wise LR decay, adapters
)

BUDGET = "quick"


@dataclass(frozen=True)
class Bug:
    """A documented bug planted in a port: ``build()`` returns the broken Setup, which ``check`` must flag (FAIL or
    WARN) with every text of ``causes`` in its summary, advice or metrics."""

    name: str
    check: str
    causes: tuple[str, ...]
    build: Callable[[], Any]
    source: str = ""  # where the bug is documented (an upstream issue, a forum thread, a paper)
    checks: tuple[str, ...] | None = None  # the checks to run; default: stages 2-4


@dataclass(frozen=True)
class Port:
    """A healthy port: ``build()`` returns its Setup; every check but ``perf.*`` must give no FAIL and no ERROR."""

    name: str
    family: str
    upstream: str  # the public file (repository and path) it paraphrases
    build: Callable[[], Any]
    bugs: tuple[Bug, ...] = ()
    needs: tuple[str, ...] = ()  # optional modules (transformers, accelerate): the port is skipped without them
    notes: dict[str, str] = field(default_factory=dict)  # check id -> why a WARN is expected on the healthy port


def all_ports(families: tuple[str, ...] = FAMILIES) -> list[Port]:
    """Every port of the corpus, family by family (a family module not written yet contributes none)."""
    out: list[Port] = []
    for fam in families:
        try:
            mod = importlib.import_module(f"ports.{fam}")
        except ModuleNotFoundError as exc:
            if exc.name != f"ports.{fam}":
                raise
            continue
        out += list(mod.PORTS)
    from ports.heldout import ported  # the held-out probes' ports, filed under their corpus families

    out += [p for p in ported() if p.family in families]
    return out


def available(port: Port) -> str | None:
    """None when the port's optional modules import, else the reason it is skipped."""
    for name in port.needs:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"{name} not importable: {exc}"
    return None


def check_ids(stages: set[int] | None = None, exclude_prefix: str | None = None) -> list[str]:
    """The registered check ids, optionally of some stages and without a prefix."""
    import tropt

    df = tropt.list_checks()
    ids = [cid for cid, st in zip(df["id"], df["stage"]) if stages is None or int(st) in stages]
    return [cid for cid in ids if not (exclude_prefix and cid.startswith(exclude_prefix))]


def diagnose(setup: Any, checks: list[str]) -> dict:
    """``tropt.diagnose`` at the corpus budget with one thread, as {check id: CheckResult}."""
    import tropt

    kw: dict[str, Any] = {"checks": checks, "budget": BUDGET, "progress": False}
    if "threads" in inspect.signature(tropt.diagnose).parameters:
        kw["threads"] = 1
    return {r.check: r for r in tropt.diagnose(setup, **kw).results}


def healthy_checks() -> list[str]:
    return check_ids(exclude_prefix="perf.")


def bug_checks(bug: Bug) -> list[str]:
    return list(bug.checks) if bug.checks else check_ids(stages={2, 3, 4})


def missing_causes(bug: Bug, result: Any) -> list[str]:
    """The texts of ``bug.causes`` absent from the result's summary, advice and metrics."""
    metrics = result.metrics or {}
    try:
        metric_text = json.dumps(metrics, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        metric_text = str(metrics)
    hay = " ".join([str(result.summary), " ".join(map(str, result.advice or [])), metric_text])
    return [t for t in bug.causes if t not in hay]
