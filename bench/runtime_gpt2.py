"""GPT-2 (Hugging Face, random weights from a config): tessel's searched schedule against 1F1B,
ours and torch.distributed.pipelining's Schedule1F1B, on the same stages.

The model is cut into an embedding, `ranks` runs of transformer layers and an LM head + loss.
Four variants run in the same processes, in turn every step (the order rotates by one each step,
so each variant holds each position equally often and machine noise hits them alike):

- `tessel`: the M shape (`mllm`): embedding and head vocabulary-parallel on every rank (tied, as
  in GPT-2), the layers pipelined; the schedule tessel searched on this placement with the block
  costs measured here, within the memory 1F1B's order needs on it. Our executor.
- `1f1b-M`: the same blocks, the same sharding, 1F1B's order. Our executor. tessel / 1f1b-M
  isolates the schedule.
- `ours-V` and `torch`: the plain pipeline torch pipelining can express (one stage per rank, a
  chain): the whole embedding in stage 0, the whole head + loss in the last stage (untied: one
  copy each, as torch pipelining does), the same layers per stage. 1F1B by our executor and by
  torch's `Schedule1F1B`. ours-V / torch isolates the executor.

Schedule1F1B cannot run the M shape: its stages are a chain with one rank each, and a
vocabulary-parallel embedding or head is one block on every rank (its all-reduces need every rank
to run it for the same micro-batch). So tessel / torch compares tessel with what torch offers for
this model: the same model, layers and ranks, but the embedding and head unsharded at the ends.

A step is forward + backward of every micro-batch (gradients zeroed first, no optimizer), timed
on rank 0 between two barriers. Ratio = median(a) / median(b) over the timed steps, with a 95%
bootstrap interval (steps resampled in pairs, bench/runtime.py); "on par" only when the interval
contains 1, "faster"/"slower" only when it lies wholly below/above. Writes
bench/results/runtime_gpt2.md.

    .venv/bin/python bench/runtime_gpt2.py [--ranks 2,4] [--steps 40] [--micro-batches 8]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime import _timed, ratio_interval, verdict  # noqa: E402

from tessel.baselines import BASELINES  # noqa: E402
from tessel.builder import Stage, build_stages  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.methods import run_method  # noqa: E402
from tessel.placement import Placement  # noqa: E402
from tessel.runtime.dataflow import dataflow  # noqa: E402
from tessel.runtime.hf import LABELS, TOKENS, Embedding, GPT2Blocks, Layers, gpt2_batch, gpt2_config, gpt2_model  # noqa: E402
from tessel.runtime.launch import Options, launch  # noqa: E402
from tessel.runtime.pipeline import Pipeline  # noqa: E402
from tessel.schedule import Schedule, schedule_from_dict  # noqa: E402

OUT = Path(__file__).parent / "results" / "runtime_gpt2.md"
VARIANTS = ("tessel", "1f1b-M", "ours-V", "torch")
PAIRS = (("tessel", "1f1b-M", "schedule: same blocks and sharding, our executor"),
         ("ours-V", "torch", "executor: plain pipeline, 1F1B both"),
         ("tessel", "torch", "tessel vs torch Schedule1F1B (M shape vs plain pipeline)"))
UNIT = 4  # a pipeline stage's forward, in the placement's cost units


@dataclass(frozen=True)
class Model:
    layers: int = 12
    dim: int = 128
    heads: int = 4
    vocab: int = 8192
    seq: int = 64
    micro_batch_size: int = 2

    def config(self, vocab: int | None = None) -> Any:
        return gpt2_config(self.layers, self.dim, self.heads, vocab or self.vocab, self.seq)


def mllm_ids(p: int) -> list[tuple[str, tuple[int, ...], tuple[str, str, str]]]:
    """The block ids of library.mllm: fA0 (bA1) on all, f{i} (b{p-1-i}) on device i, fA1 (bA0) on all."""
    every = tuple(range(p))
    return ([("embed", every, ("fA0", "bA1", "wA1"))]
            + [(f"s{i}", (i,), (f"f{i}", f"b{p - 1 - i}", f"w{p - 1 - i}")) for i in range(p)]
            + [("head", every, ("fA1", "bA0", "wA0"))])


def gpt2_placement(p: int, ms: Mapping[str, tuple[float, float]]) -> Placement:
    """The M shape with the measured costs (ms of forward and backward per block) in units of a
    `UNIT`-th of a pipeline stage's forward; memory: 1 per pipeline micro-batch, as library.mllm."""
    unit = ms["stage"][0] / UNIT

    def u(t: float) -> int:
        return max(1, round(t / unit))

    stages = []
    for name, devices, ids in mllm_ids(p):
        f, b = ms[name if name in ("embed", "head") else "stage"]
        stages.append(Stage(name, devices, u(f), u(b), 0, 0 if len(devices) > 1 else 1, ids))
    return build_stages(f"gpt2-mllm-{p}", p, stages, [(a.name, b.name) for a, b in zip(stages, stages[1:])])


def measure(m: Model, p: int, reps: int = 7) -> dict[str, tuple[float, float]]:
    """Median ms of forward and backward of one micro-batch per block, on this process (1 thread):
    the embedding and head as one rank's vocabulary shard (vocab / p rows), a stage's layers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        flow = dataflow(gpt2_placement(p, {"stage": (UNIT, 1), "embed": (1, 1), "head": (1, 1)}))
        shard = GPT2Blocks(flow, m.config(m.vocab // p))  # group None: a vocab / p model's whole blocks
        full = GPT2Blocks(flow, m.config())
        batch = gpt2_batch(m.config(m.vocab // p), m.micro_batch_size, m.seq, seed=0)
        x = torch.randn(m.micro_batch_size, m.seq, m.dim)
        cases: dict[str, tuple[nn.Module, Callable[[nn.Module], Tensor]]] = {
            "embed": (shard("fA0", None), lambda mod: mod(batch[TOKENS])),
            "stage": (full("f0", None), lambda mod: mod(x.clone().requires_grad_())),
            "head": (shard("fA1", None), lambda mod: mod(x.clone().requires_grad_(), batch[LABELS])),
        }
        out = {}
        for name, (mod, fwd) in cases.items():
            ts: list[tuple[float, float]] = []
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                y = fwd(mod)
                t1 = time.perf_counter()
                y.backward(torch.ones_like(y))  # type: ignore[no-untyped-call]
                ts.append((t1 - t0, time.perf_counter() - t1))
            out[name] = (statistics.median(t[0] for t in ts[1:]) * 1e3, statistics.median(t[1] for t in ts[1:]) * 1e3)
        return out
    finally:
        torch.set_num_threads(threads)


class Last(nn.Module):
    """The plain pipeline's last stage: its layers, the final norm and the whole LM head (logits)."""

    def __init__(self, layers: nn.Module, ln_f: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.layers, self.ln_f, self.lm_head = layers, ln_f, lm_head

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.lm_head(self.ln_f(self.layers(x)))
        return out


def plain_stage(m: Model, flow: Any, rank: int, seed: int = 0) -> nn.Module:
    """Rank `rank`'s stage of the plain pipeline: the M shape's layers for that rank, with the whole
    embedding before the first and the whole head after the last."""
    model = gpt2_model(m.config(), seed)
    t = model.transformer
    mid = GPT2Blocks(flow, m.config()).chain[1:-1]
    layers = Layers([t.h[i] for i in GPT2Blocks(flow, m.config()).layers_of(mid[rank])])
    if rank == 0:
        return nn.Sequential(Embedding(t.wte, t.wpe), layers)
    if rank == len(mid) - 1:
        return Last(layers, t.ln_f, model.lm_head)
    return layers


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten())


def _grad_rel(a: nn.Module | list[nn.Parameter], b: nn.Module | list[nn.Parameter]) -> float:
    pa = list(a.parameters()) if isinstance(a, nn.Module) else a
    pb = list(b.parameters()) if isinstance(b, nn.Module) else b
    assert len(pa) == len(pb)
    worst = 0.0
    for p, q in zip(pa, pb):
        if p.grad is None or q.grad is None:
            return float("inf")
        worst = max(worst, float((p.grad - q.grad).norm() / q.grad.norm().clamp_min(1e-30)))
    return worst


def worker(ctx: Any, m: Model, docs: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    """Every variant on this rank, `warmup + steps` steps each in rotating order: rank 0's step
    times, the last loss of our three, and the largest relative gradient difference between the
    two M-shape variants and between the two plain ones after the last step."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    scheds = {k: schedule_from_dict(v) for k, v in docs.items()}
    p, n = ctx.world, scheds["tessel"].micro_batches
    flow = dataflow(scheds["tessel"].placement)
    pipes = {}
    for name, key in (("tessel", "tessel"), ("1f1b-M", "1f1b")):
        blocks = GPT2Blocks(flow, m.config())
        pipes[name] = Pipeline(blocks, scheds[key], micro_batches=n, feeds=blocks.feeds, ctx=ctx)
    ours_v = plain_stage(m, flow, ctx.rank)
    pipes["ours-V"] = Pipeline({f"f{ctx.rank}": ours_v}, scheds["1f1b-V"], loss_fn=cross_entropy, ctx=ctx)
    torch_v = plain_stage(m, flow, ctx.rank)
    schedule = Schedule1F1B(PipelineStage(torch_v, ctx.rank, p, ctx.device), n, loss_fn=cross_entropy,
                            scale_grads=True)
    batch = gpt2_batch(m.config(), n * m.micro_batch_size, m.seq, seed=1)

    losses: dict[str, float] = {}

    def ours(name: str) -> Callable[[], Any]:
        pipe = pipes[name]
        params = pipe.parameters()

        def run() -> None:
            for q in params:
                q.grad = None
            if name == "ours-V":
                losses[name] = pipe.step(batch[TOKENS], target=batch[LABELS])
            else:
                losses[name] = pipe.step(**batch)
        return run

    def run_torch() -> None:
        torch_v.zero_grad(set_to_none=True)
        args = (batch[TOKENS],) if ctx.rank == 0 else ()
        schedule.step(*args, target=batch[LABELS] if ctx.rank == p - 1 else None)

    runs = {v: ours(v) for v in VARIANTS[:3]} | {"torch": run_torch}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(warmup + steps):
        k = i % len(VARIANTS)
        for v in VARIANTS[k:] + VARIANTS[:k]:
            t = _timed(runs[v])
            if i >= warmup:
                times[v].append(t)
    return {"times": times, "losses": losses,
            "grad_M": _grad_rel(pipes["tessel"].parameters(), pipes["1f1b-M"].parameters()),
            "grad_V": _grad_rel(ours_v, torch_v)}


def schedules(m: Model, p: int, micro_batches: int, ms: Mapping[str, tuple[float, float]]) -> dict[str, Schedule]:
    """1F1B and tessel's schedule (within 1F1B's peak memory) on the M shape; 1F1B on the chain."""
    from tessel import library
    place = gpt2_placement(p, ms)
    one = BASELINES["1f1b"](place, micro_batches, None)
    tessel = run_method("tessel", place, micro_batches, max(one.peak_memory))
    return {"tessel": tessel, "1f1b": one,
            "1f1b-V": BASELINES["1f1b"](library.build("vshape", p), micro_batches, None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts (one run each)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("-o", "--output", default=str(OUT))
    a = ap.parse_args(argv)
    m = Model()
    load_before = os.getloadavg()[0]
    rows, notes = [], []
    for p in (int(x) for x in a.ranks.split(",")):
        ms = measure(m, p)
        s = schedules(m, p, a.micro_batches, ms)
        t0 = time.perf_counter()
        res = launch(worker, p, (m, {k: v.to_dict() for k, v in s.items()}, a.steps, a.warmup),
                     Options(timeout=1200, pg_timeout=300))
        wall = time.perf_counter() - t0
        times = res[0]["times"]
        med = {v: statistics.median(times[v]) * 1e3 for v in VARIANTS}
        label = f"{p}" + ("" if p <= (os.cpu_count() or 1) else " (oversubscribed)")
        for x, y, what in PAIRS:
            r, lo, hi = ratio_interval(times[x], times[y])
            rows.append(f"| {label} | {what} | {x} {med[x]:.1f} | {y} {med[y]:.1f} | {r:.3f} | [{lo:.3f}, {hi:.3f}] | "
                        f"{verdict(lo, hi).replace('ours', x)} |")
            print(rows[-1], flush=True)
        place = s["tessel"].placement
        costs = ", ".join(f"{b.id} {b.duration:g}" for b in place.blocks)
        measured = "; ".join(f"{k} {f:.2f}/{b:.2f}" for k, (f, b) in ms.items())
        notes.append(f"- {label} ranks: measured ms (forward/backward, one micro-batch, one rank's shard): {measured}. "
                     f"Placement costs: {costs}. Simulated makespan tessel {s['tessel'].makespan:g} vs 1F1B "
                     f"{s['1f1b'].makespan:g} ({s['tessel'].makespan / s['1f1b'].makespan:.3f}); peak memory "
                     f"tessel {list(s['tessel'].peak_memory)}, 1F1B {list(s['1f1b'].peak_memory)}. Largest "
                     f"relative gradient difference after the last step: tessel vs 1f1b-M "
                     f"{max(r['grad_M'] for r in res):.1g}, ours-V vs torch {max(r['grad_V'] for r in res):.1g}. "
                     f"Run: {wall:.0f} s.")
        print(notes[-1], flush=True)
    text = "\n".join([
        "# GPT-2: tessel's schedule vs 1F1B (ours and torch Schedule1F1B)",
        "",
        f"Hugging Face GPT-2 from a config (random weights): {m.layers} layers, dim {m.dim}, {m.heads} heads, "
        f"vocabulary {m.vocab}, sequence {m.seq}; the head costs about {m.vocab / (12 * m.dim):.1f} layers, as in "
        f"GPT-2 small (50257 / (12 x 768) = 5.5). {a.micro_batches} micro-batches of {m.micro_batch_size} "
        f"sequences; {a.steps} timed steps of each variant after {a.warmup} warm-up steps, in the same processes, "
        f"the order rotating every step. gloo, CPU, 1 thread per rank; {platform.machine()}, {os.cpu_count()} "
        f"cores SHARED with other work (load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at "
        f"the end). torch {torch.__version__}. Variants and what differs: see the docstring of "
        f"bench/runtime_gpt2.py. Ratio = median / median; 95% bootstrap interval, steps resampled in pairs.",
        "",
        "| ranks | comparison | a (ms) | b (ms) | a / b | 95% interval | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *notes,
        "",
        "How to read it. The schedule row is the only one that isolates tessel's schedule: its possible gain is "
        "the simulated makespan ratio in the notes (the bubble it removes on these measured costs), to be "
        "compared with the interval's width. The executor row compares two executors on one plain pipeline. "
        "The last row also changes the sharding: in the M shape every micro-batch's embedding and head run "
        "on all ranks at once, with all-reduces that make the ranks wait for each other, which costs most "
        "when the ranks cannot run concurrently (fewer free cores than ranks).",
        "",
        f"Reproduce: `.venv/bin/python bench/runtime_gpt2.py --ranks {a.ranks} --steps {a.steps} "
        f"--micro-batches {a.micro_batches}`",
        "",
    ])
    atomic_write(a.output, text)
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
