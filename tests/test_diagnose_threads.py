"""Two diagnose calls in two threads on one Setup take turns: neither restores torch's process-wide RNG (or thread
count) while the other's check runs, so a healthy loop stays PASS in both."""

from __future__ import annotations

import threading

from support.loop_cases import mlp_setup

import tropt


def test_a_second_thread_waits_for_the_first_diagnose_to_finish():
    """Thread A pauses in its first check (its callback waits up to 2 s for thread B to start a check). Taking
    turns, B starts only after A has returned; before, B's checks ran inside A's."""
    setup = mlp_setup(dropout=0.1)
    a_inside, b_started = threading.Event(), threading.Event()
    order: list[str] = []

    def a_callback(info):
        if info["index"] == 0:
            a_inside.set()
            b_started.wait(timeout=2.0)  # bounded: B cannot start while A holds the turn

    def b_callback(info):
        b_started.set()
        order.append("b check")

    def run_b():
        a_inside.wait(timeout=30)
        tropt.diagnose(setup, checks=["loop.resume"], progress=False, threads=1, callback=b_callback)

    b = threading.Thread(target=run_b)
    b.start()
    tropt.diagnose(setup, checks=["loop.resume"], progress=False, threads=1, callback=a_callback)
    order.append("a returned")
    b.join(timeout=120)
    assert order == ["a returned", "b check"]


def test_loop_resume_stays_pass_in_both_threads():
    """The issue's case: a Setup with dropout (the RNG matters), loop.resume three times in each of two threads."""
    setup = mlp_setup(dropout=0.1)
    out: dict[int, list] = {}

    def go(k):
        out[k] = [tropt.diagnose(setup, checks=["loop.resume"], progress=False, threads=1).results[0]
                  for _ in range(3)]

    threads = [threading.Thread(target=go, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(out) == [0, 1]
    for k, results in out.items():
        assert [r.status.value for r in results] == ["pass"] * 3, (k, [r.summary for r in results])
