"""tropt.integrations.accelerate: a user's accelerate loop runs inside tropt's steps unchanged, also under loop.ddp."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

accelerate = pytest.importorskip("accelerate")

from support import real_loops as rl  # noqa: E402 - after the importorskip, as the imports below

import tropt  # noqa: E402
from tropt.result import Status  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(setup, checks) -> dict:
    return {r.check: r for r in tropt.diagnose(setup, checks=checks, progress=False).results}


def test_accelerate_told_moved_and_still_importable_from_training():
    from tropt.integrations.accelerate import accelerate_told
    from tropt.training import accelerate_told as old

    assert old is accelerate_told


def test_importing_the_integration_does_not_import_accelerate():
    code = ("import sys, tropt.integrations.accelerate, tropt.setup, tropt.loop.ddp; "
            "assert 'accelerate' not in sys.modules, 'accelerate was imported'")
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_accumulate_loop_passes_accumulation():
    r = run(rl.accelerate_setup(), ["loop.accumulation"])["loop.accumulation"]
    assert r.status is Status.PASS, r.summary


@pytest.mark.parametrize("told", [True, False])
def test_under_ddp_the_accelerator_is_told_it_is_distributed(monkeypatch, told):
    # accelerator.accumulate(model) wraps the non-synchronising micro-batches in model.no_sync() only when accelerate
    # believes it runs distributed: told, the 4 micro-batches all-reduce once; untold, 4 times.
    if not told:
        monkeypatch.setattr("tropt.loop.ddp.tell_distributed", lambda rank, world: None)
    r = run(rl.accelerate_setup(), ["loop.ddp"])["loop.ddp"]
    assert r.status is Status.PASS, r.summary
    assert r.metrics["synchronised_backward_passes"] == (1 if told else 4), r.summary
    assert ("wasted communication" in r.summary) is (not told)


def test_under_ddp_an_hf_trainer_counts_tokens_over_all_processes(monkeypatch, tmp_path):
    # The Trainer all-gathers num_items_in_batch and scales the loss by accelerator.num_processes when accelerate says
    # it runs distributed; untold, each process normalises by its own token count and the gradients differ.
    transformers = pytest.importorskip("transformers")
    from test_hf_setup import Sequences, gpt2, pad

    from tropt.integrations.hf import setup_from_trainer

    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16,
                                          gradient_accumulation_steps=2, report_to=[], use_cpu=True, max_steps=10,
                                          save_strategy="no", logging_strategy="no")
    setup = setup_from_trainer(transformers.Trainer(model=gpt2(), args=args, train_dataset=Sequences(),
                                                    data_collator=pad))
    told = run(setup, ["loop.ddp"])["loop.ddp"]
    assert told.status is Status.PASS, told.summary
    monkeypatch.setattr("tropt.loop.ddp.tell_distributed", lambda rank, world: None)
    # The cause is predicted from the Trainer's own step run on each process's share (its num_items_in_batch is
    # not loss_fn's token count: here it counts 260 label tokens where the model's own mean shifts to 228), not from
    # loss_fn.
    untold = run(setup, ["loop.ddp"])["loop.ddp"]
    assert untold.status is Status.WARN and untold.metrics["cause"] == "per-process mean", untold.summary
    assert untold.summary.startswith("latent") and "normalises its loss by its own item count" in untold.summary
    declared = run(setup.replace(distributed=True), ["loop.ddp"])["loop.ddp"]
    assert declared.status is Status.FAIL and declared.metrics["cause"] == "per-process mean", declared.summary
