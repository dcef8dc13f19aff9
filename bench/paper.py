"""Paper-scale study: Tessel's schedules and `tessel plan`'s pick against 1F1B, 1F1B+, Chimera
and tensor parallelism, simulated on placements built by the analytic cost model
(tessel.costmodel), at 4-32 devices.

Two setups. `paper` follows the paper's public evaluation scripts (zhiqi-0/Tessel,
evaluation/*.sh): V100-32GB nodes of 8 (NVLink inside, one 100 Gb/s InfiniBand card per
node), GPT and mT5 with 1024k-1536k vocabularies and no LM head, fp16 weights with Adam
(8 bytes a parameter), recomputation on for every method, 128 micro-batches; FLAVA inference at
4 GPUs over batch sizes 1-128. `a100` is the earlier study: A100-80GB, tied LM heads, no
recomputation, mixed-precision Adam.

Every sentence of interpretation in the report is generated from the figures of the same run;
each table names the commit it was made from. `--check` recomputes a fast, deterministic subset
(the baselines' figures) and fails when the stored report no longer matches the code.

    .venv/bin/python bench/paper.py --setup paper          # writes bench/results/paper.md
    .venv/bin/python bench/paper.py --setup a100 -o /tmp/a100.md --devices 4 8
    .venv/bin/python bench/paper.py --check                # exit 1 when paper.md is stale
"""
from __future__ import annotations

import argparse
import logging
import math
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tessel import costmodel as cm
from tessel.baselines import BaselineError
from tessel.io import atomic_write
from tessel.methods import run_method
from tessel.placement import Placement
from tessel.plan import Cluster, plan
from tessel.plan.candidates import candidates
from tessel.plan.planner import _baseline, _memory_check
from tessel.schedule import Schedule
from tessel.simulate import simulate

log = logging.getLogger("bench.paper")
GIB = cm.GIB
RESULTS = Path(__file__).parent / "results"
PAPER_CLAIMS = {"train": 5.5, "infer": 0.38}  # up to 5.5x training speedup, 38% lower inference latency
BASELINES = ("1F1B", "1F1B pp", "1F1B+", "Chimera", "TP")


# ---- cases -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    key: str
    title: str
    shape: str                       # what Tessel's (the paper's) placement is
    training: bool
    micro_batches: Callable[[int], int]
    build: Callable[[int, str], cm.PlacedModel]   # (devices, layout) -> model
    spec: Callable[[int], cm.ModelSpec]
    config: Callable[[int], str]


@dataclass(frozen=True)
class Setup:
    name: str
    hardware: cm.Hardware
    cases: tuple[Case, ...]
    methods: tuple[str, ...]
    recompute: bool
    param_bytes: float | None


V100 = cm.hardware("v100-32g")
# layers, hidden, heads, vocabulary per device count (evaluation/{4,8,16,32}gpu.sh)
PAPER_GPT = {4: (32, 4096, 32, 1024_000), 8: (40, 6144, 48, 1024_000), 16: (48, 8192, 64, 1024_000),
             32: (80, 8192, 64, 1536_000)}
PAPER_MT5 = {4: (24, 1024, 16, 1024_000, 4), 8: (24, 3072, 24, 1024_000, 1), 16: (32, 6144, 48, 1536_000, 1),
             32: (40, 8192, 64, 1536_000, 1)}  # + micro-batch size
PAPER_FLAVA: dict[str, Any] = dict(hidden=4096, heads=32, image_seq=900, text_seq=1024, layers=24, fusion_layers=12, micro_batch=1)
FLAVA_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
GLOBAL_BATCH = 128


def _fp16(model: cm.PlacedModel) -> cm.PlacedModel:
    return replace(model, param_bytes=cm.FP16_ADAM_BYTES_PER_PARAM)


def _gpt_kw(d: int) -> dict[str, Any]:
    layers, hidden, heads, vocab = PAPER_GPT[d]
    return dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=2048, micro_batch=1,
                lm_head=False, recompute=True)


def _mt5_kw(d: int) -> dict[str, Any]:
    layers, hidden, heads, vocab, mbs = PAPER_MT5[d]
    return dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, ffn=0, gated=False, enc_seq=1024,
                dec_seq=1024, micro_batch=mbs, lm_head=False, recompute=True)


def paper_cases() -> tuple[Case, ...]:
    hw = V100
    fp = cm.FP16_ADAM_BYTES_PER_PARAM
    return (
        Case("gpt", "GPT, no LM head (M shape)",
             "embedding vocabulary-parallel on all devices, the layers pipelined one stage per device", True,
             lambda d: GLOBAL_BATCH, lambda d, lay: _fp16(cm.gpt(d, lay, hw, **_gpt_kw(d))),
             lambda d: replace(cm.gpt_spec(d, hw, **_gpt_kw(d)), param_bytes=fp),
             lambda d: f"{PAPER_GPT[d][0]}L/{PAPER_GPT[d][1]}h/{PAPER_GPT[d][3] // 1000}k vocab"),
        Case("mt5", "mT5, no LM head (NN shape)",
             "the shared embedding on all devices before the encoder and the decoder, encoder and decoder "
             "pipelined on two device groups", True,
             lambda d: GLOBAL_BATCH // PAPER_MT5[d][4],
             lambda d, lay: _fp16(cm.mt5(d, lay, hw, **_mt5_kw(d))),
             lambda d: replace(cm.mt5_spec(d, hw, **_mt5_kw(d)), param_bytes=fp),
             lambda d: "{0}+{0}L/{1}h/{2}k vocab/mbs {3}".format(PAPER_MT5[d][0], PAPER_MT5[d][1],
                                                                PAPER_MT5[d][3] // 1000, PAPER_MT5[d][4])),
    )


def flava_case(hw: cm.Hardware) -> Case:
    return Case("flava", "FLAVA, inference (K shape)",
                "image and text encoders side by side on disjoint devices, fusion encoder on all devices",
                False, lambda d: 16, lambda d, lay: cm.flava(d, lay, hw, **PAPER_FLAVA),
                lambda d: cm.flava_spec(d, hw, **PAPER_FLAVA),
                lambda d: "24+24+12L/4096h, 900+1024 tokens")


def a100_cases() -> tuple[Case, ...]:
    hw = cm.A100
    return (
        Case("gpt", "GPT, hidden 8192, vocabulary 256k (M shape)",
             "embedding and LM head vocabulary-parallel on all devices, 2 layers per device pipelined", True,
             lambda d: 128, lambda d, lay: cm.gpt(d, lay, hw), lambda d: cm.gpt_spec(d, hw),
             lambda d: f"{2 * d}L/8192h/256k"),
        Case("mt5", "mT5-style encoder-decoder, vocabulary 250k (NN shape)",
             "shared embedding on all devices before the encoder and the decoder, LM head on all devices", True,
             lambda d: 128, lambda d, lay: cm.mt5(d, lay, hw), lambda d: cm.mt5_spec(d, hw),
             lambda d: f"{d}+{d}L/4096h/250k"),
        Case("flava", "FLAVA-like multimodal, inference latency (K shape)",
             "image and text encoders side by side on disjoint devices, fusion encoder on all devices", False,
             lambda d: 16, lambda d, lay: cm.flava(d, lay, hw), lambda d: cm.flava_spec(d, hw),
             lambda d: f"{d}+{d}+{max(1, d // 2)}L/4096h"),
        Case("alphafold", "AlphaFold-like, 3 recycling passes + 1 trained (recycling)",
             "Evoformer stack pipelined, every pass over the same stages", True,
             lambda d: 128, lambda d, lay: cm.alphafold_like(d, lay, hw), lambda d: cm.alphafold_spec(d, hw),
             lambda d: f"{math.ceil(48 / d) * d} Evoformer blocks"),
    )


def setups() -> dict[str, Setup]:
    methods = ("Tessel", "Plan", "1F1B", "1F1B+", "Chimera", "TP")
    return {"paper": Setup("paper", V100, paper_cases(), methods, True, cm.FP16_ADAM_BYTES_PER_PARAM),
            "a100": Setup("a100", cm.A100, a100_cases(), methods, False, None)}
FLAVA_METHODS = ("Tessel", "Plan", "1F1B", "1F1B pp", "TP")


# ---- running one method ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    method: str
    seconds: float | None  # iteration time (training) or batch latency (inference), simulated
    status: str            # "ok", "OOM", "n/a"
    note: str = ""
    schedule: Schedule | None = None
    search_seconds: float = 0.0


def _ok(method: str, s: Schedule, t0: float, note: str = "") -> Outcome:
    replay = simulate(s)  # the iteration as the devices run it: orders replayed, tasks as early as they can
    return Outcome(method, replay.makespan / 1e3, "ok", note, s, time.perf_counter() - t0)


def run_fixed(case: Case, d: int, n: int, method: str, args: argparse.Namespace) -> Outcome:
    """Tessel, 1F1B+, Chimera, TP: a method on a placement fixed by the method."""
    layout, how = {"Tessel": ("tessel", "search"), "1F1B+": ("tessel", "1f1b"),
                   "Chimera": ("chimera", "chimera"), "TP": ("tp", "1f1b")}[method]
    if not case.training and how != "search":
        how = "gpipe"
    if case.key == "alphafold" and method == "1F1B+":
        return Outcome(method, None, "n/a", "no sharded blocks: the same as 1F1B")
    model = case.build(d, layout)
    budget = model.memory_budget()
    if min(budget) <= 0:
        k = budget.index(min(budget))
        return Outcome(method, None, "OOM", f"weights {model.static_bytes()[k] / GIB:.1f} GiB on device {k}")
    t0 = time.perf_counter()
    try:
        s = _schedule(how, model.placement(), math.ceil(n / model.replicas), budget, args)
    except BaselineError as e:
        status = "OOM" if "memory" in str(e) or "limit" in str(e) else "n/a"
        return Outcome(method, None, status, _short(str(e)))
    except ValueError as e:  # the search's MemoryLimitError: no schedule fits the budget
        if "memory" not in str(e):
            raise
        return Outcome(method, None, "OOM", _short(str(e)))
    return _ok(method, s, t0)


def _schedule(how: str, p: Placement, n: int, budget: tuple[int, ...], args: argparse.Namespace) -> Schedule:
    """A baseline, or Tessel: mode `fast` and mode `tessel` each within the time limit, the
    better schedule kept (mode `tessel` may find no repetend in time)."""
    if how != "search":
        return run_method(how, p, n, budget)
    best = run_method("fast", p, n, budget, time_limit=args.time_limit)
    try:
        exact = run_method("tessel", p, n, budget, time_limit=args.time_limit)
    except (TimeoutError, ValueError) as e:
        log.info("tessel mode on %s: %s", p.name, e)
        return best.with_meta(tried="tessel mode: no repetend in time; fast kept")
    return min((best, exact), key=lambda s: s.makespan).with_meta(
        tried=f"fast {best.makespan / 1e3:.2f} s, tessel {exact.makespan / 1e3:.2f} s")


def searched_1f1b(case: Case, d: int, n: int, hw: cm.Hardware, tp: Sequence[int] | None = None,
                  name: str = "1F1B") -> Outcome:
    """1F1B (GPipe in inference) on the best tensor x pipeline split: every pipeline placement
    the planner enumerates (TP groups inside a node, stages balanced by cost), the fastest kept;
    `tp` = (1,) is the plain pipeline, one stage per device (the paper's FLAVA baseline)."""
    spec = case.spec(d)
    cluster = Cluster.of(hw, d)
    best: Outcome | None = None
    notes = []
    for c in candidates(spec, cluster, tp):
        if c.family not in ("pipeline", "recycle") or c.recompute != "as given":
            continue
        pruned = _memory_check(c, n)
        row = pruned or _baseline(c, n)
        if row.status != "ok" or row.schedule is None:
            notes.append(f"tp{c.tp}: {row.reason[:60]}")
            continue
        o = _ok(name, row.schedule, time.perf_counter(), f"tp {c.tp} x {d // c.tp} stages")
        if best is None or (o.seconds or math.inf) < (best.seconds or math.inf):
            best = o
    return best or Outcome(name, None, "OOM", _short("; ".join(notes)))


def run_plan(case: Case, d: int, n: int, hw: cm.Hardware, args: argparse.Namespace) -> Outcome:
    t0 = time.perf_counter()
    try:
        result = plan(case.spec(d), Cluster.of(hw, d), n, time_limit=args.plan_limit)
    except ValueError as e:
        return Outcome("Plan", None, "OOM", _short(str(e)))
    s = result.best.schedule
    assert s is not None
    return _ok("Plan", s, t0, f"{result.best.candidate.name} ({result.best.method})")


def run_point(case: Case, d: int, n: int, setup: Setup, args: argparse.Namespace,
              methods: Sequence[str]) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    for m in methods:
        if m == "1F1B":
            out[m] = searched_1f1b(case, d, n, setup.hardware)
        elif m == "1F1B pp":
            out[m] = searched_1f1b(case, d, n, setup.hardware, (1,), m)
        elif m == "Plan":
            out[m] = run_plan(case, d, n, setup.hardware, args)
        else:
            out[m] = run_fixed(case, d, n, m, args)
    return out


def _short(msg: str, width: int = 110) -> str:
    msg = msg.replace("|", "/")
    return msg if len(msg) <= width else msg[:width - 3] + "..."


# ---- report ----------------------------------------------------------------------------------------
Results = dict[str, dict[int, dict[str, Outcome]]]   # case -> devices (or batch) -> method -> outcome


def commit() -> str:
    """The commit the figures were made from, `+dirty` when files differ from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    # the reports themselves do not count: a rerun over a stale report is still the clean commit
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)bench/results") else "")


def cell(o: Outcome, digits: int = 2) -> str:
    return f"{o.seconds:.{digits}f}" if o.status == "ok" and o.seconds is not None else o.status


def best_baseline(res: dict[str, Outcome]) -> Outcome | None:
    ok = [res[m] for m in BASELINES if m in res and res[m].status == "ok"]  # those the row has
    return min(ok, key=lambda o: o.seconds or math.inf) if ok else None


def ratio(o: Outcome, ref: Outcome | None) -> float | None:
    if o.status != "ok" or ref is None or ref.status != "ok" or not o.seconds or not ref.seconds:
        return None
    return ref.seconds / o.seconds


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def case_table(case: Case, rows: dict[int, dict[str, Outcome]], methods: Sequence[str], sha: str,
               key: str = "devices", digits: int = 2) -> list[str]:
    unit = "Iteration time, s" if case.training else "Batch latency, s"
    heads = [key, "model", *methods, "Tessel vs best baseline", "Plan vs best baseline"]
    bases = [m for m in BASELINES if m in methods]
    out = [f"### {case.title}", "", f"Commit `{sha}`. Tessel's placement (the paper's): {case.shape}. "
           f"{unit} (lower is better); best baseline = the fastest of {', '.join(bases)}.", "",
           "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for d, res in rows.items():
        base = best_baseline(res)
        cells = [str(d), case.config(d if key == "devices" else 4), *(cell(res[m], digits) for m in methods),
                 _x(ratio(res["Tessel"], base)), _x(ratio(res["Plan"], base)) if "Plan" in res else "-"]
        out.append("| " + " | ".join(cells) + " |")
    notes = [f"- {d}, {m}: {o.status}{': ' + o.note if o.note else ''}" for d, res in rows.items()
             for m, o in res.items() if o.note and (o.status != "ok" or m in ("Plan", "1F1B", "1F1B pp"))]
    return out + ([""] + notes if notes else []) + [""]


def tessel_details(case: Case, rows: dict[int, dict[str, Outcome]]) -> list[str]:
    out = [f"Tessel's schedules, {case.key}:", "",
           "| point | mode | search s | period (ms) | period bound (ms) | ratio to lower bound | "
           "peak / budget (GiB, worst device) | modes tried |", "|---|---|---|---|---|---|---|---|"]
    for d, res in rows.items():
        o = res["Tessel"]
        if o.status != "ok" or o.schedule is None:
            out.append(f"| {d} | - | - | - | - | - | {o.status} | - |")
            continue
        s = o.schedule
        period = s.meta.get("period") or (s.repetend.period if s.repetend else None)
        lim = s.memory_limit or (0,) * s.placement.devices
        worst = max(range(s.placement.devices), key=lambda k: s.peak_memory[k] / max(lim[k], 1))
        out.append(f"| {d} | {s.meta.get('method', '?')} | {o.search_seconds:.1f} | "
                   f"{'-' if period is None else f'{float(period):.1f}'} | {float(max(s.placement.loads)):.1f} | "
                   f"{s.ratio:.3f} | {s.peak_memory[worst] / 1024:.1f} / {lim[worst] / 1024:.1f} | "
                   f"{s.meta.get('tried', '-')} |")
    return out + [""]


def _at(d: int, what: str) -> str:
    return f"At batch {d}" if what == "batch" else f"At {d} {what}"


def narrative(case: Case, rows: dict[int, dict[str, Outcome]], what: str = "devices") -> list[str]:
    """Sentences whose every claim is a comparison of this run's figures."""
    lines = []
    wins = ties = losses = 0
    plan_never_slower = True
    for d, res in rows.items():
        base = best_baseline(res)
        t, p = ratio(res["Tessel"], base), ratio(res.get("Plan", res["Tessel"]), base)
        if base is None:
            lines.append(f"{_at(d, what)} every baseline is out of memory or does not apply.")
            continue
        if t is None:
            lines.append(f"{_at(d, what)} Tessel on the paper's placement is {res['Tessel'].status}; "
                         f"the best baseline is {base.method} ({cell(base)} s).")
        else:
            wins, ties, losses = wins + (t > 1.005), ties + (0.995 <= t <= 1.005), losses + (t < 0.995)
            word = "faster than" if t > 1.005 else "slower than" if t < 0.995 else "as fast as"
            lines.append(f"{_at(d, what)} Tessel on the paper's placement is {word} the best baseline, "
                         f"{base.method} ({_x(t) if t >= 1 else f'{1 / t:.2f}x slower'}).")
        if "Plan" in res and res["Plan"].status == "ok":
            plan_never_slower &= (p or 0) >= 0.999
            lines[-1] += (f" `tessel plan` picks {res['Plan'].note}: {_x(p)} against the best baseline"
                          + (f", {_x(ratio(res['Plan'], res['Tessel']))} against Tessel's placement."
                             if res["Tessel"].status == "ok" else "."))
    summary = (f"**{case.key}:** Tessel beats the best baseline at {wins}, ties at {ties} and loses at {losses} "
               f"of {wins + ties + losses} points; the plan is "
               + ("never slower than the best baseline." if plan_never_slower
                  else "slower than the best baseline somewhere (see the table)."))
    return [summary, "", *[f"- {x}" for x in lines], ""]


def _gains(results: Results, cases: Sequence[Case], training: bool, who: str,
           against: Sequence[str]) -> list[tuple[float, str, str, int]]:
    """(speedup of `who` over a method, method, case, point) for every comparable pair."""
    out = []
    for key, rows in results.items():
        if next(c for c in cases if c.key == key).training != training:
            continue
        for d, res in rows.items():
            for m in against:
                r = ratio(res[who], res[m]) if who in res and m in res else None
                if r is not None:
                    out.append((r, m, key, d))
    return out


def _gain_text(r: float, training: bool) -> str:
    if training:
        return f"{r:.2f}x"
    cut = 1 - 1 / r
    return f"{cut:.0%} lower" if cut >= 0 else f"{-cut:.0%} higher"


def claims(results: Results, cases: Sequence[Case], sweeps: Sequence[str] = ()) -> list[str]:
    """The paper's headline claims beside the largest gains of this run, where they were, and
    how the same point compares with the strongest baseline."""
    table = ["## Against the paper's claims", "",
             "| paper's claim | method | largest gain in this run | against | where | against the best "
             "baseline there |", "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for training, claim in ((True, f"up to {PAPER_CLAIMS['train']}x training speedup"),
                            (False, f"up to {PAPER_CLAIMS['infer']:.0%} lower inference latency")):
        for who in ("Tessel", "Plan"):
            found = _gains(results, cases, training, who, BASELINES)
            if not found:
                continue
            r, m, key, d = max(found)
            rb = ratio(results[key][d][who], best_baseline(results[key][d]))
            where = f"{key} at {'batch ' if key in sweeps else ''}{d}"
            table.append(f"| {claim} | {who} | {_gain_text(r, training)} | {m} | {where} | "
                         f"{'-' if rb is None else _gain_text(rb, training)} |")
            if who == "Tessel":
                notes += _claim_notes(results, cases, training, r, m, key, d, rb)
    return table + [""] + notes + [""]


def _claim_notes(results: Results, cases: Sequence[Case], training: bool, r: float, m: str, key: str, d: int,
                 rb: float | None) -> list[str]:
    """Where and why this run's figure differs from the paper's, in this run's figures."""
    paper = PAPER_CLAIMS["train"] if training else PAPER_CLAIMS["infer"]
    reached = r / paper if training else (1 - 1 / r) / paper
    res = results[key][d]
    base = best_baseline(res)
    out = [f"- {'Training' if training else 'Inference'}: the largest gain here is {reached:.0%} of the paper's "
           f"figure, against {m} ({key} at {d}: {m} {cell(res[m])} s, Tessel {cell(res['Tessel'])} s)."]
    if base is not None and base.method != m and rb is not None:
        against = f"Tessel's speedup is {_gain_text(rb, training)}" if training else \
            f"Tessel's latency is {_gain_text(rb, training)}"
        out.append(f"  At that point the strongest baseline is {base.method} ({cell(base)} s); against it {against}, "
                   f"so the largest figure measures {m} at a point where {m} is not the strongest baseline.")
    paper_base = "1F1B" if training else "1F1B pp"  # the baseline the paper's claim is against
    vs = _gains(results, cases, training, "Tessel", (paper_base,))
    if vs:
        r1, _, k1, d1 = max(vs)
        out.append(f"  Against {paper_base} (the paper's baseline for this claim) the largest gain is "
                   f"{_gain_text(r1, training)} ({k1} at {d1}).")
    return out


def differences(setup: Setup) -> list[str]:
    """How this study's method differs from the paper's measurement (facts of the setup, not
    conclusions; the figures above say how much each matters where they can)."""
    hw = setup.hardware
    return [
        "## Where this study differs from the paper's measurements", "",
        "- Times are simulated from the analytic cost model (`tessel/costmodel/`): sustained "
        f"{hw.flops / 1e12:.0f} TFLOP/s for every GEMM shape, NCCL ring/tree all-reduce at "
        f"{hw.intra_bandwidth / 1e9:.0f} GB/s in a node and {hw.nic_bandwidth / 1e9:.1f} GB/s x "
        f"{hw.nics_per_node} NIC(s) across nodes, memory-bound kernels at {hw.hbm / 1e12:.1f} TB/s; the "
        "paper measures its runtime on the real cluster.",
        "- The 1F1B column is 1F1B on the best tensor x pipeline split the planner enumerates (TP groups "
        "inside a node, stages balanced by cost), the split noted per row; the paper's baseline searches "
        "such splits with its own policy. **1F1B pp** (FLAVA) is the plain pipeline, one stage per device, "
        "the baseline of the paper's FLAVA script.",
        "- The optimizer step and data-parallel gradient reduction are left out for every method.",
        "- Chimera here is two opposite pipelines of one device per stage with a model replica each; "
        "TP is every block over all devices (across nodes from 16 devices).", ""]


def flava_sweep(setup: Setup, args: argparse.Namespace, batches: Sequence[int]) -> dict[int, dict[str, Outcome]]:
    case = flava_case(setup.hardware)
    rows: dict[int, dict[str, Outcome]] = {}
    for n in batches:
        rows[n] = run_point(case, 4, n, setup, args, FLAVA_METHODS)
        print(f"flava-sweep {n:4d}  " + "  ".join(f"{m}={cell(o, 3)}" for m, o in rows[n].items()), flush=True)
    return rows


def setup_lines(setup: Setup, args: argparse.Namespace, sha: str) -> list[str]:
    hw = setup.hardware
    per = setup.param_bytes or cm.TRAIN_BYTES_PER_PARAM
    return [
        f"# Paper-scale study (simulated), setup `{setup.name}`", "",
        f"Generated by `bench/paper.py --setup {setup.name}` from commit `{sha}` on "
        f"{platform.node() or 'this machine'} (Python {platform.python_version()}). Costs come from the analytic "
        "model in `tessel/costmodel/` (formulas documented there), not from measurements. `bench/paper.py "
        "--check` recomputes the baselines' cells of a fast subset and fails when they no longer match.", "",
        f"Hardware: {hw.name}: sustained {hw.flops / 1e12:.0f} TFLOP/s, {hw.memory / GIB:.0f} GiB "
        f"({hw.reserved / GIB:.0f} GiB reserved), {hw.intra_bandwidth / 1e9:.0f} GB/s all-reduce bus bandwidth "
        f"inside a node of {hw.devices_per_node}, {hw.nics_per_node} x {hw.nic_bandwidth / 1e9:.1f} GB/s "
        f"network cards per node. Training keeps {per:g} bytes per parameter, inference 2; "
        f"recomputation {'on for every method' if setup.recompute else 'off'}.", "",
        "Methods: **Tessel** = `tessel.search` (modes `fast` and `tessel`, "
        f"{args.time_limit:g} s limit each, the better kept) on the paper's placement; **Plan** = "
        f"`tessel.plan` ({args.plan_limit:g} s limit): placement and schedule chosen together, its pick noted "
        "per row; **1F1B** = 1F1B (GPipe in inference) on the best tensor x pipeline split; **1F1B+** = 1F1B's "
        "order on the paper's placement; **Chimera** = two opposite pipelines; **TP** = every block "
        "tensor-parallel over all devices. OOM = the weights or the schedule's activations exceed the "
        "memory; n/a = the method does not apply.", ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--setup", choices=("paper", "a100"), default="paper")
    ap.add_argument("--devices", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--models", nargs="+", help="case keys to run (default all of the setup)")
    ap.add_argument("--batches", type=int, nargs="+", default=list(FLAVA_BATCHES), help="FLAVA sweep (paper setup)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="Tessel search limit per mode (s)")
    ap.add_argument("--plan-limit", type=float, default=60.0, help="tessel plan search limit (s)")
    ap.add_argument("--check", action="store_true", help="recompute the fast subset; exit 1 if the report is stale")
    ap.add_argument("-o", "--output", default=None, help="report path (default bench/results/paper.md "
                    "for the paper setup, paper-a100.md for a100)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    setup = setups()[args.setup]
    out = Path(args.output or RESULTS / ("paper.md" if setup.name == "paper" else f"paper-{setup.name}.md"))
    if args.check:
        return check(setup, out, args)
    t0, sha = time.perf_counter(), commit()
    results: Results = {}
    cases = [c for c in setup.cases if not args.models or c.key in args.models]
    for case in cases:
        results[case.key] = {}
        for d in args.devices:
            res = run_point(case, d, case.micro_batches(d), setup, args, setup.methods)
            results[case.key][d] = res
            print(f"{case.key:10s} {d:3d}  " + "  ".join(f"{m}={cell(o)}" for m, o in res.items()), flush=True)
    lines = setup_lines(setup, args, sha) + ["## Results", ""]
    for case in cases:
        lines += case_table(case, results[case.key], setup.methods, sha)
        lines += tessel_details(case, results[case.key]) + narrative(case, results[case.key])
    all_cases = list(cases)
    if setup.name == "paper" and (not args.models or "flava" in args.models):
        fl = flava_case(setup.hardware)
        sweep = flava_sweep(setup, args, args.batches)
        results["flava"] = sweep
        all_cases.append(fl)
        lines += ["## FLAVA inference at 4 GPUs over batch sizes (micro-batch 1)", ""]
        lines += case_table(fl, sweep, FLAVA_METHODS, sha, key="batch", digits=3)
        lines += tessel_details(fl, sweep) + narrative(fl, sweep, "batch")
    sweeps = ("flava",) if setup.name == "paper" and "flava" in results else ()
    lines += claims(results, all_cases, sweeps) + differences(setup)
    lines += [f"Total run time: {time.perf_counter() - t0:.0f} s.", ""]
    atomic_write(out, "\n".join(lines))
    print(f"wrote {out}")
    return 0


# ---- --check ---------------------------------------------------------------------------------------
CHECK_POINTS = {"paper": (("gpt", 4, ("1F1B", "1F1B+", "TP", "Chimera")), ("flava-sweep", 2, ("1F1B", "1F1B pp", "TP"))),
                "a100": (("gpt", 4, ("1F1B", "1F1B+", "TP", "Chimera")),)}


def stored_cells(report: str, title: str, key: str, point: int) -> dict[str, str]:
    """The cells of one row of the table under `### title`, by column header."""
    section = report.split(f"### {title}\n", 1)
    if len(section) < 2:
        return {}
    table = [ln for ln in section[1].split("\n### ")[0].splitlines() if ln.startswith("|")]
    if not table:
        return {}
    heads = [h.strip() for h in table[0].strip("|").split("|")]
    for ln in table[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if cells and cells[0] == str(point):
            return dict(zip(heads, cells))
    return {}


def check(setup: Setup, report_path: Path, args: argparse.Namespace) -> int:
    """Recompute the deterministic cells (baselines) of a fast subset and compare with the report."""
    if not report_path.exists():
        print(f"check: {report_path} does not exist", file=sys.stderr)
        return 1
    report = report_path.read_text()
    bad = []
    for key, point, methods in CHECK_POINTS[setup.name]:
        if key == "flava-sweep":
            case, d, n, digits = flava_case(setup.hardware), 4, point, 3
        else:
            case = next(c for c in setup.cases if c.key == key)
            d, n, digits = point, case.micro_batches(point), 2
        stored = stored_cells(report, case.title, "devices" if d == point else "batch", point)
        res = run_point(case, d, n, setup, args, methods)
        for m in methods:
            now = cell(res[m], digits)
            if stored.get(m) != now:
                bad.append(f"{case.key} at {point}, {m}: stored {stored.get(m, 'missing')}, code gives {now}")
    for b in bad:
        print(f"check: {b}", file=sys.stderr)
    print(f"check: {'STALE' if bad else 'ok'} ({report_path})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
