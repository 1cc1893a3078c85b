"""The corpus of ports (issue 28): every healthy port passes every check but ``perf.*`` without a FAIL or ERROR, and
every planted bug is flagged by its check id with its cause. See ``tests/ports/__init__.py``."""

from __future__ import annotations

import pytest
import torch

from ports import FAMILIES, Bug, Port, all_ports, available, diagnose, healthy_checks, heldout, missing_causes
from tropt.result import Status

PORTS = all_ports()
BUGS = [(p, b) for p in PORTS for b in p.bugs]

# The longest parts of the corpus, marked ``slow`` (``make test`` runs them, ``make test-fast`` leaves them out): each
# took 45-180 s of the 1609 s corpus run on the shared 2-core machine (``pytest tests/ports --durations=15``), together
# nearly half of it. Every family keeps at least one healthy port and its planted bugs in the fast run; these
# still run in full, with the same checks, in ``make test``, under ``-m slow`` and in benchmarks/corpus_rates.py.
SLOW_HEALTHY = frozenset({
    # seq2seq keeps the nn.Transformer tutorial (nn_transformer_translation)
    "fairseq_update_freq_sample_size", "bart_translation_num_items", "t5_seq2seq_eval_loss",
    "mae_finetune_stochastic_depth",  # masked keeps mae_pretrain
    "lbfgs_closure", "lbfgs_closure_dropout",  # rnn_lm keeps five ports, and the LBFGS zero_grad bug
    "gpt2_run_clm_no_trainer", "ddpm_lucidrains_trainer",
})
SLOW_BUGS = frozenset({"t5_constant_source"})  # seq2seq keeps its other planted bugs
# The held-out probes' ports (tests/ports/heldout) are slow too, but for the planted bugs that are the known
# answer of a fix made for them and costs one check: the collator that drops the attention mask (loop.accumulation
# names "the loss reads the padding", not per-micro-batch item counts), and the VQ-VAE whose EMA codebook moves in eval
# mode (loop.train_mode names the buffers the eval forward changes, not "GPU atomics").
_HELDOUT_DEFAULT = frozenset({"collator_drops_attention_mask", "codebook_ema_in_eval"})
SLOW_HEALTHY = SLOW_HEALTHY | heldout.port_names()
SLOW_BUGS = SLOW_BUGS | (heldout.bug_names() - _HELDOUT_DEFAULT)


def _params(items: list, ids: list[str], slow: frozenset[str], key) -> list:
    """``items`` as pytest params, those whose ``key`` is in ``slow`` marked slow."""
    return [pytest.param(*(it if isinstance(it, tuple) else (it,)), id=i,
                         marks=[pytest.mark.slow] if key(it) in slow else []) for it, i in zip(items, ids, strict=True)]


def _skip_unavailable(port: Port) -> None:
    reason = available(port)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("port", _params(PORTS, [p.name for p in PORTS], SLOW_HEALTHY, lambda p: p.name))
def test_healthy_port_has_no_fail_or_error(port: Port) -> None:
    _skip_unavailable(port)
    torch.manual_seed(0)
    results = diagnose(port.build(), healthy_checks())
    alarms = {cid: f"{r.status.value}: {r.summary}" for cid, r in results.items()
              if r.status in (Status.FAIL, Status.ERROR)}
    assert not alarms, f"false alarms on the healthy port {port.name} ({port.upstream}): {alarms}"


@pytest.mark.parametrize(("port", "bug"), _params(BUGS, [f"{p.name}-{b.name}" for p, b in BUGS], SLOW_BUGS,
                                                  lambda pb: pb[1].name))
def test_planted_bug_is_flagged_with_its_cause(port: Port, bug: Bug) -> None:
    _skip_unavailable(port)
    torch.manual_seed(0)
    # Only the check that must flag it (and any the bug declares): what is asserted, at a fifth of the cost of all
    # of stages 2-4 (benchmarks/corpus_rates.py runs those, and reports the other checks' FAILs too).
    results = diagnose(bug.build(), list(bug.checks or (bug.check,)))
    r = results[bug.check]
    assert r.status in (Status.FAIL, Status.WARN), f"{bug.name}: {bug.check} is {r.status.value}: {r.summary}"
    assert not missing_causes(bug, r), f"{bug.name}: cause not named; missing {missing_causes(bug, r)} in {r.summary}"


def test_every_port_names_its_upstream_and_family() -> None:
    for p in PORTS:
        assert p.family in FAMILIES, p.name
        assert "/" in p.upstream, f"{p.name}: upstream must name the public file it paraphrases"
        assert p.build.__doc__, f"{p.name}: the builder's docstring says what the port follows"
    assert len({p.name for p in PORTS}) == len(PORTS), "port names are unique"
    names, bugs = {p.name for p in PORTS}, {b.name for _, b in BUGS}
    assert names >= SLOW_HEALTHY and bugs >= SLOW_BUGS, "a slow mark names a port or bug that no longer exists"
    # every family keeps a healthy port in the default (not slow) run
    assert {p.family for p in PORTS if p.name not in SLOW_HEALTHY} == {p.family for p in PORTS}
