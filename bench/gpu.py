"""One command for a lent GPU: profile the example models' blocks there, then run the emulated
benchmark with those measured costs. Runs on CPU too (`--device cpu`, the default without CUDA).

1. Profile on `--device` (tessel.runtime.profiler: threads pinned, the fastest run once a quarter agree
   within 10%, warnings with the spread): the GPT example on the M shape with its head (`mllm`),
   the two-branch encoder (`kshape`), and a Hugging Face GPT-2 from a config on `mllm`
   (vocabulary-parallel embedding and head: their whole cost over the ranks, ideal sharding).
2. Each profile becomes the library placement with measured durations, in integer units of a
   quarter of the median one-device forward (memory: the library's, one unit per micro-batch).
3. tessel (memory of 1F1B's peak) and 1F1B on it, run on emulated devices (bench/realized.py's
   worker: real processes, gloo, sleeping the durations; 1 unit = `--unit-ms` of sleep, time
   dilated so short GPU kernels stay far above a sleep's wake-up jitter): realized and predicted.
4. GPT-2: tessel's M shape against the plain pipeline torch can express (one stage per rank, the
   whole embedding in the first, the whole head in the last: their measured whole cost), run by
   our executor with 1F1B and by torch's Schedule1F1B on the same emulated stages.

Writes bench/results/gpu-<device>.md.

    .venv/bin/python bench/gpu.py [--device cuda] [--ranks 4] [--unit-ms 40] [--steps 5]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realized  # noqa: E402
from runtime import ratio_interval, verdict  # noqa: E402

from tessel import library  # noqa: E402
from tessel.builder import Stage, build_stages  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.methods import run_method  # noqa: E402
from tessel.placement import Placement, make_placement  # noqa: E402
from tessel.runtime.dataflow import dataflow  # noqa: E402
from tessel.runtime.emulate import replay_makespan  # noqa: E402
from tessel.runtime.launch import Options, launch  # noqa: E402
from tessel.runtime.networks import Config, example  # noqa: E402
from tessel.runtime.profiler import Profile, profile  # noqa: E402
from tessel.schedule import Schedule  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def profile_example(kind: str, placement: str, ranks: int, device: str, cfg: Config, size: int) -> Profile:
    p = library.build(placement, ranks)
    ex = example(kind, p, cfg)
    batch = ex.batch(size)
    inputs = {b: [batch[f] for f in ex.feeds[b]] for b in ex.flow.forwards}
    return profile(p, {b: ex.whole(b) for b in ex.flow.forwards}, inputs, device=device, repeats=10, warmup=3)


def profile_gpt2(ranks: int, device: str, layers: int, dim: int, vocab: int, seq: int, size: int) -> Profile:
    from tessel.runtime.hf import LABELS, TOKENS, GPT2Blocks, gpt2_batch, gpt2_config
    p = library.build("mllm", ranks)
    cfg = gpt2_config(layers, dim, max(4, dim // 32), vocab, seq)
    blocks = GPT2Blocks(dataflow(p), cfg)
    modules = {b: blocks(b, None) for b in blocks.chain}
    batch = gpt2_batch(cfg, size, seq, seed=0)
    inputs = {blocks.chain[0]: (batch[TOKENS],), blocks.chain[-1]: (batch[LABELS],)}
    return profile(p, modules, inputs, device=device, repeats=10, warmup=3)


def in_units(library_p: Placement, measured: Placement) -> tuple[Placement, float]:
    """The library placement with the measured durations in integer units (ms per unit returned)."""
    one = [float(b.duration) for b in measured.blocks if b.kind == "forward" and len(b.devices) == 1]
    unit = statistics.median(one) / 4
    blocks = [b.__class__(b.id, b.kind, max(1, round(float(measured.by_id[b.id].duration) / unit)), b.memory,
                          b.devices, b.grad_of) for b in library_p.blocks]
    return make_placement(f"{library_p.name}-profiled", library_p.devices, blocks, library_p.edges), unit


def plain_gpt2(m_shape: Placement, ranks: int) -> Placement:
    """One stage per rank: the whole embedding (its cost on every rank, summed) before the first
    layers, the whole head after the last (untied, as torch pipelining runs it)."""
    by = m_shape.by_id
    embed_f, embed_b = (float(by[x].duration) * ranks for x in ("fA0", "bA1"))
    head_f, head_b = (float(by[x].duration) * ranks for x in ("fA1", "bA0"))
    stages = []
    for i in range(ranks):
        f, b = float(by[f"f{i}"].duration), float(by[f"b{ranks - 1 - i}"].duration)
        if i == 0:
            f, b = f + embed_f, b + embed_b
        if i == ranks - 1:
            f, b = f + head_f, b + head_b
        stages.append(Stage(f"s{i}", (i,), round(f), round(b), 0, 1, (f"f{i}", f"b{i}", f"w{i}")))
    return build_stages(f"vshape-gpt2-{ranks}", ranks, stages, [(f"s{i}", f"s{i + 1}") for i in range(ranks - 1)])


def emulate(scheds: dict[str, Schedule], unit_ms: float, steps: int, features: int) -> dict[str, Any]:
    import tempfile
    ranks = next(iter(scheds.values())).placement.devices
    docs = {k: s.to_dict() for k, s in scheds.items()}
    with tempfile.TemporaryDirectory() as csv_dir:  # torch's runtime reads our exported CSV there
        res: dict[str, Any] = launch(realized.worker, ranks, (docs, unit_ms, steps, features, csv_dir),
                                     Options(timeout=1800, pg_timeout=300))[0]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--unit-ms", type=float, default=40.0, help="sleep per placement unit")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--gpt2", default="12,128,8192,64", metavar="LAYERS,DIM,VOCAB,SEQ")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/gpu.py: --device cuda: CUDA is not available here", file=sys.stderr)
        return 2
    started, load = time.time(), os.getloadavg()[0]
    layers, dim, vocab, seq = (int(x) for x in args.gpt2.split(","))
    big = Config(vocab=2048, dim=256, heads=8, ffn=1024, seq=64, layers=2, features=256, patch=48)
    profiles = {
        "gpt (example, mllm)": ("mllm", profile_example("gpt", "mllm", args.ranks, args.device, big, 8)),
        "encoder (kshape example)": ("kshape", profile_example("kshape", "kshape", args.ranks, args.device, big, 8)),
        "gpt2 (Hugging Face, mllm)": ("mllm", profile_gpt2(args.ranks, args.device, layers, dim, vocab, seq, 2)),
    }
    lines = [f"# Profiled on {args.device}, run on emulated devices", "",
             f"`.venv/bin/python bench/gpu.py --device {args.device} --ranks {args.ranks} --unit-ms {args.unit_ms:g} "
             f"--steps {args.steps}`; {platform.machine()}, {os.cpu_count()} cores"
             + (f", {torch.cuda.get_device_name()}" if args.device.startswith("cuda") else "")
             + f" (load average {load:.1f} at the start). torch {torch.__version__}. {args.micro_batches} "
               f"micro-batches; emulated devices: 1 placement unit = {args.unit_ms:g} ms of sleep; realized = "
               f"median of {args.steps} steps after one warm-up, with a 95% bootstrap interval.", ""]
    m_shape_gpt2: Placement | None = None
    rows = []
    for name, (lib, prof) in profiles.items():
        placement, unit = in_units(library.build(lib, args.ranks), prof.placement)
        if name.startswith("gpt2"):
            m_shape_gpt2 = placement
        costs = ", ".join(f"{b.id} {b.duration}" for b in placement.blocks)
        lines += [f"- {name}: 1 unit = {unit:.4g} ms measured ({args.unit_ms / unit:.3g}x dilated); costs {costs}"
                  + (f"; {len(prof.warnings)} profiler warnings (first: {prof.warnings[0]})" if prof.warnings else "")]
        scheds = realized.schedules_on(placement, args.micro_batches, args.time_limit, ("1f1b",))
        res = emulate(scheds, args.unit_ms, args.steps, args.features)
        for k, s in scheds.items():
            pred = replay_makespan(s) * args.unit_ms / 1e3
            med, lo, hi = realized.median_interval(res["times"][k])
            rows.append((name, k, float(s.makespan), pred, med, med / pred, lo / pred, hi / pred))
        print(f"{name}: done", flush=True)
    lines += ["", "| model | method | makespan (units) | predicted (s) | realized (s) | realized / predicted | "
              "95% interval |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {a} | {k} | {mk:g} | {p:.3f} | {m:.3f} | {r:.3f} | [{lo:.3f}, {hi:.3f}] |"
              for a, k, mk, p, m, r, lo, hi in rows]
    if m_shape_gpt2 is not None:
        lines += gpt2_versus_plain(m_shape_gpt2, args)
    lines += ["", f"Run: {time.time() - started:.0f} s.", ""]
    out = args.output or str(RESULTS / f"gpu-{args.device.split(':')[0]}.md")
    atomic_write(out, "\n".join(lines))
    print("\n".join(lines))
    return 0


def gpt2_versus_plain(m_shape: Placement, args: argparse.Namespace) -> list[str]:
    """tessel's M shape (our executor) vs the plain pipeline with 1F1B (ours and torch's Schedule1F1B)."""
    n = args.micro_batches
    plain = plain_gpt2(m_shape, args.ranks)
    m = realized.schedules_on(m_shape, n, args.time_limit, ("1f1b",))
    one = {"1f1b": run_method("1f1b", plain, n)}
    res_m = emulate(m, args.unit_ms, args.steps, args.features)
    res_v = emulate(one, args.unit_ms, args.steps, args.features)
    pred_t, pred_v = replay_makespan(m["tessel"]), replay_makespan(one["1f1b"])
    r, lo, hi = ratio_interval(res_m["times"]["tessel"], res_v["times"]["1f1b"])
    lines = ["", "## GPT-2: tessel's M shape vs the plain pipeline (1F1B), profiled costs, emulated devices", "",
             f"Plain pipeline: {', '.join(f'{b.id} {b.duration}' for b in plain.blocks)}.", "",
             "| comparison | predicted (units) | predicted ratio | realized (s) | realized ratio | 95% interval | verdict |",
             "|---|---|---|---|---|---|---|",
             f"| tessel M shape / our 1F1B plain pipeline | {pred_t:g} / {pred_v:g} | {pred_t / pred_v:.3f} | "
             f"{statistics.median(res_m['times']['tessel']):.3f} / {statistics.median(res_v['times']['1f1b']):.3f} | "
             f"{r:.3f} | [{lo:.3f}, {hi:.3f}] | {verdict(lo, hi)} |"]
    tr = res_v.get("torch") or {}
    if tr:
        t = tr["times"]
        for other in [k for k in t if k != "ours"]:
            r2, lo2, hi2 = ratio_interval(res_m["times"]["tessel"], t[other])
            lines.append(f"| tessel M shape / torch {other} plain pipeline (wall clock) | {pred_t:g} / {pred_v:g} | "
                         f"{pred_t / pred_v:.3f} | {statistics.median(res_m['times']['tessel']):.3f} / "
                         f"{statistics.median(t[other]):.3f} | {r2:.3f} | [{lo2:.3f}, {hi2:.3f}] | {verdict(lo2, hi2)} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
