"""The GPU path's figures (issue 32), in one JSON summary: run on a GPU machine by ``benchmarks/device_check.sh``.

    python benchmarks/device_check.py [--device cuda] [--out device_summary.json] [--quick]

It measures, on the device:

- a diagnosis (``budget="quick"``, every check but the data checks) of two small models, a vision CNN and a causal
  LM (a 2-layer GPT-2 built from ``GPT2Config`` when transformers is installed, else a tiny token model), each in
  bf16 (where the device supports it) and fp16 with a real ``GradScaler``: every result's status and summary, and
  the seconds each check took;
- the gradient monitor's overhead on step time (:class:`tropt.GradientMonitor` at its defaults), with device
  synchronisation before every clock read: plain, monitored, plain again, interleaved, three repeats;
- ``perf.precision`` and ``perf.memory`` alone, with their metrics.

``--device cpu`` runs the same on the CPU (a smoke test of the script itself; its numbers are not the GPU's).
The summary also records the device's name, capability, torch and CUDA versions, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tropt  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _images(n: int, batch: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(n)]


def _ce(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(64, 10))


def vision_setup(device: str, precision: str) -> tropt.Setup:
    torch.manual_seed(0)
    return tropt.Setup(cnn(), _ce, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                       train_data=_images(4, 64, 0), val_data=_images(2, 64, 1), device=device, num_classes=10,
                       precision=precision, use_scaler=precision == "fp16", grad_clip=1.0)


def _tokens(n: int, batch: int, seq: int, vocab: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(n)]


def lm_setup(device: str, precision: str) -> tuple[tropt.Setup, str]:
    torch.manual_seed(0)
    vocab, seq = 512, 64
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=128, n_layer=2, n_head=4, bos_token_id=0,
                         eos_token_id=0)
        model: nn.Module = GPT2LMHeadModel(cfg)

        def loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
            return m(input_ids=ids, labels=ids).loss

        name = "gpt2 (2 layers, n_embd 128)"
    except ImportError:
        model = nn.Sequential(nn.Embedding(vocab, 128), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, vocab))

        def loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
            logits = m(ids[:, :-1])
            return nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))

        name = "token MLP (transformers not installed)"
    setup = tropt.Setup(model, loss, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4),
                        train_data=_tokens(4, 8, seq, vocab, 0), val_data=_tokens(2, 8, seq, vocab, 1),
                        device=device, precision=precision, use_scaler=precision == "fp16", grad_clip=1.0)
    return setup, name


def diagnosis(setup: tropt.Setup) -> dict:
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    last = [time.perf_counter()]

    def on_result(r: Any) -> None:
        now = time.perf_counter()
        seconds[r.check] = round(now - last[0], 2)
        last[0] = now

    report = tropt.diagnose(setup, checks=["model", "loop", "dynamics", "perf"], budget="quick", progress=False,
                            on_result=on_result)
    return {"seconds": round(time.perf_counter() - t0, 1),
            "results": [{"check": r.check, "status": r.status.value, "summary": str(r.summary)[:400],
                         "seconds": seconds.get(r.check)} for r in report.results],
            "fail_or_error": [r.check for r in report.results if r.status.value in ("FAIL", "ERROR")]}


def monitor_overhead(device: torch.device, steps: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = cnn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = (t.to(device) for t in _images(1, 64, 0)[0])

    def run(monitored: bool) -> float:
        mon = tropt.GradientMonitor(model) if monitored else None
        if mon is not None:
            mon.__enter__()
        try:
            for i in range(steps + 5):
                if i == 5:
                    _sync(device)
                    t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                _ce(model, (x, y)).backward()
                opt.step()
            _sync(device)
            return (time.perf_counter() - t0) / steps
        finally:
            if mon is not None:
                mon.__exit__(None, None, None)

    ratios, plain_ms = [], []
    for _ in range(repeats):
        a, m, b = run(False), run(True), run(False)
        ratios.append(m / ((a + b) / 2) - 1)
        plain_ms.append(1e3 * (a + b) / 2)
    return {"steps": steps, "repeats": repeats, "plain_ms_per_step": [round(v, 3) for v in plain_ms],
            "overhead": [round(r, 4) for r in ratios], "overhead_median": round(statistics.median(ratios), 4)}


def single_checks(device: str) -> dict:
    import tropt.perf

    out = {}
    for name, fn in (("perf.precision", tropt.perf.check_precision), ("perf.memory", tropt.perf.check_memory)):
        r = fn(vision_setup(device, "fp32"), progress=False)
        out[name] = {"status": r.status.value, "summary": str(r.summary)[:600],
                     "metrics": json.loads(json.dumps(r.metrics, default=str))}
    return out


def device_info(device: torch.device) -> dict:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
                            "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    if device.type == "cuda":
        info.update(name=torch.cuda.get_device_name(device), capability=torch.cuda.get_device_capability(device),
                    cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported(),
                    memory_gib=round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1))
    return info


def _write(summary: dict, path: str) -> None:
    """Write the summary so far (after every part: a run cut short by a timeout still leaves its figures)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="device_summary.json")
    ap.add_argument("--quick", action="store_true", help="fewer monitor steps (a smoke test)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("device_check: CUDA is not available on this machine; use --device cpu for a smoke test",
              file=sys.stderr)
        return 2
    summary: dict[str, Any] = {"info": device_info(device), "diagnoses": {}, "errors": {}}
    bf16 = device.type != "cuda" or torch.cuda.is_bf16_supported()
    for precision in (["bf16"] if bf16 else []) + ["fp16"]:
        for kind in ("vision", "lm"):
            key = f"{kind}-{precision}"
            try:
                if kind == "vision":
                    setup, name = vision_setup(args.device, precision), "CNN (2 conv + BatchNorm)"
                else:
                    setup, name = lm_setup(args.device, precision)
                summary["diagnoses"][key] = {"model": name, **diagnosis(setup)}
            except Exception as exc:  # noqa: BLE001 - record and go on: the summary is the deliverable
                summary["errors"][key] = f"{type(exc).__name__}: {exc}"
            print(f"{key}: {summary['diagnoses'].get(key, {}).get('fail_or_error', summary['errors'].get(key))}",
                  flush=True)
            _write(summary, args.out)
    for key, fn in (("monitor", lambda: monitor_overhead(device, 50 if args.quick else 300, 3)),
                    ("checks", lambda: single_checks(args.device))):
        try:
            summary[key] = fn()
        except Exception as exc:  # noqa: BLE001
            summary["errors"][key] = f"{type(exc).__name__}: {exc}"
        _write(summary, args.out)
    summary["info"]["load_average_end"] = os.getloadavg()
    _write(summary, args.out)
    print(f"wrote {args.out}; monitor overhead median {summary.get('monitor', {}).get('overhead_median')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
