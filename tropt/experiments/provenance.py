"""Where a decision came from: the selection split is not a final split by content, a plan's diagnosis and
comparison describe one Setup, and the plan carries what a re-run needs (:func:`rerun_record`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import TroptError
from .candidates import BASELINE

if TYPE_CHECKING:
    from ..setup import Setup


def _split_fingerprint(setup: Setup, data: Any) -> str | None:
    """The content hash of a split as the runs read it (the Setup's val_data when ``data`` is None)."""
    from ..identity import loader_fingerprint

    target = setup if data is None else setup.replace(val_data=data)
    try:
        return loader_fingerprint(target, "val")[0]
    except Exception:  # noqa: BLE001 - an unreadable split fails in the runs themselves, with its own message
        return None


def refuse_final_as_selection(setup: Setup, select_name: str, select_data: Any, final: Mapping[str, Any]) -> None:
    """Refuse a selection split whose content equals a final (reporting-only) split's: choosing on it leaks that
    split into the choice whatever it is named (compare already refuses a selection split named like "test")."""
    if not final:
        return
    mine = _split_fingerprint(setup, select_data)
    if mine is None:
        return
    for name, data in final.items():
        if _split_fingerprint(setup, data) == mine:
            raise TroptError(
                f"compare: the selection split {select_name!r} has the same content as the final split {name!r} "
                f"(data fingerprint {mine}): choosing a candidate on it leaks {name!r} into the choice, so its score "
                "no longer estimates performance on new data",
                f"select on a validation split distinct from {name!r} (Setup.val_data or splits={{'val': ...}}), and "
                f"evaluate the winner on {name!r} once, after the choice")


def _who(identity: Mapping[str, Any]) -> str:
    keys = ("config_hash", "data_fingerprint", "code_hash")
    return ", ".join(f"{k} {identity[k]}" for k in keys if identity.get(k)) or "no identity"


def refuse_mixed_setups(diagnosis: Mapping[str, Any], comparison: Mapping[str, Any]) -> None:
    """Refuse a plan whose diagnosis and comparison ran on different Setups (their configuration hashes differ),
    naming both identities."""
    mine, theirs = diagnosis.get("config_hash"), comparison.get("config_hash")
    if mine and theirs and mine != theirs:
        raise TroptError(
            f"OptimizationPlan: the diagnosis ran on one Setup ({_who(diagnosis)}) and the comparison on another "
            f"({_who(comparison)}): a plan built from both would adopt a change tested on a Setup the findings do not "
            "describe",
            "diagnose and compare the same Setup (tropt.optimize does both), or pass the findings.json and "
            "comparison.json of one run")


def plain(v: Any) -> bool:
    """A value a plan can hold as it is (a factory, a module or data is given again by the user's setup)."""
    return v is None or isinstance(v, (bool, int, float, str))


def rerun_record(comp: Any, name: str | None) -> dict[str, Any]:
    """What ``tropt.experiments.rerun`` needs to re-evaluate the adopted change from the plan alone: its overrides
    (plain values as they are; a factory or module by description, given again by the user's setup function), the
    seeds, budget, eval_every, reinit, selection rule, early stopping, guardrails, threads, identities and the
    scores of every selection run of the baseline and the candidate."""
    meta = comp.meta
    plain = (meta.get("plain_overrides") or {}).get(name, {}) if name else {}
    described = (meta.get("candidates") or {}).get(name, {}) if name else {}
    scores: dict[str, dict[str, Any]] = {}
    for r in comp.records:
        if r.get("phase", "select") == "select" and r["candidate"] in (BASELINE, name):
            scores.setdefault(r["candidate"], {})[str(r["seed"])] = r.get("score")
    keys = ("seeds", "budget", "eval_every", "reinit", "select", "select_split", "metric", "higher_is_better",
            "early_stopping", "guardrails", "threads", "compared_at", "comparison_id", "prune")
    return {
        "candidate": name,
        "overrides": dict(plain),
        "given_by_setup": {k: v for k, v in described.items() if k not in plain},
        **{k: meta.get(k) for k in keys},
        "identity": {k: (meta.get("identity") or {}).get(k) for k in ("config_hash", "data_fingerprint", "code_hash")},
        "candidate_identity": (meta.get("candidate_identities") or {}).get(name) if name else None,
        "scores": scores,
    }
