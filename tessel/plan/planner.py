"""`plan()`: choose the placement and the schedule together.

Every candidate placement (tessel.plan.candidates) is checked against memory first (weights,
then one micro-batch's activations), its lower bound computed, and the hand-made baselines run
on the placements they belong to (1F1B on each tensor x pipeline split, TP, Chimera). A
candidate whose lower bound is not below the best baseline's makespan cannot win and is not
searched. The rest are searched by increasing bound: mode `fast` on the best few, mode `tessel`
on the best of those, each within its share of the time limit. The plan is the fastest schedule
found, baselines included, so it is never slower than a baseline it evaluated.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..baselines import BaselineError
from ..bounds import lower_bound, period_lower_bound
from ..costmodel import ModelSpec
from ..errors import TesselError
from ..methods import run_method
from ..schedule import Schedule
from ..search.budget import Clock
from .candidates import Candidate, Cluster, candidates

log = logging.getLogger(__name__)
Progress = Callable[[int, int, str], None]   # (done, total, what is running)
FAST_SHARE = 0.6         # of the time limit, for mode fast; the rest for mode tessel
MIN_SEARCH_SECONDS = 2.0  # a search given less than this is not started


@dataclass(frozen=True)
class Row:
    """One evaluation of one candidate: a baseline, a search mode, or why it was pruned."""
    candidate: Candidate
    method: str                    # "1f1b", "gpipe", "chimera", "fast", "tessel", or "-" (pruned)
    status: str                    # "ok", "pruned", "failed"
    reason: str = ""
    makespan: float | None = None  # ms for all micro-batches
    seconds: float = 0.0
    schedule: Schedule | None = field(default=None, compare=False, repr=False)

    @property
    def period_bound(self) -> float:
        """Busiest device's load per real micro-batch (ms)."""
        return float(period_lower_bound(self.candidate.placement)) / self.candidate.replicas

    @property
    def peak(self) -> tuple[float, float] | None:
        """(peak, budget) in MiB on the device nearest its budget."""
        if self.schedule is None:
            return None
        peaks, budget = self.schedule.peak_memory, self.candidate.budget
        d = max(range(len(peaks)), key=lambda k: peaks[k] / max(budget[k], 1))
        return float(peaks[d]), float(budget[d])


@dataclass(frozen=True)
class Plan:
    """The ranked evaluations; `best` is the chosen plan, `why` says why in figures."""
    model: str
    devices: int
    micro_batches: int
    rows: tuple[Row, ...]
    best: Row
    best_baseline: Row | None
    why: str
    seconds: float


def plan(spec: ModelSpec, cluster: Cluster, micro_batches: int = 64, time_limit: float = 90.0,
         fast_top: int = 6, tessel_top: int = 2, tp: Sequence[int] | None = None,
         given: Candidate | None = None, progress: Progress | None = None, clock: Clock | None = None) -> Plan:
    """The fastest plan found for `spec` on `cluster` within `time_limit` seconds of search, or
    within `clock` (a command's wall clock, search.command_clock: the CLI's, from its start)."""
    if micro_batches < 1:
        raise TesselError(f"micro_batches must be >= 1, got {micro_batches}")
    if time_limit <= 0:
        raise TesselError(f"time limit must be > 0 seconds, got {time_limit}")
    clock = clock or Clock(time_limit)
    t0 = clock.t0
    cands = _unique([*([given] if given else []), *candidates(spec, cluster, tp)])
    rows = [_memory_check(c, micro_batches) for c in cands]
    fits = [c for c, r in zip(cands, rows) if r is None]
    out: list[Row] = [r for r in rows if r is not None]
    total = len([c for c in fits if c.baseline]) + min(fast_top, len(fits)) + tessel_top
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(min(done, total), total, what)

    for c in fits:
        if c.baseline:
            out.append(_baseline(c, micro_batches))
            tick(f"{c.baseline} on {c.name}")
    best_base = _best(out)
    searchable = sorted(fits, key=lambda c: _bound(c, micro_batches))
    if best_base is not None and best_base.makespan is not None:
        ceiling = best_base.makespan
        for c in [c for c in searchable if _bound(c, micro_batches) >= ceiling]:
            out.append(Row(c, "-", "pruned", f"not searched: lower bound {_bound(c, micro_batches):.1f} ms "
                                             f">= best baseline {ceiling:.1f} ms"))
        searchable = [c for c in searchable if _bound(c, micro_batches) < ceiling]
    deadline = clock.deadline
    fast_rows = _search_all(searchable[:fast_top], "fast", micro_batches,
                            t0 + clock.limit * FAST_SHARE, tick)
    out += fast_rows
    top = [r.candidate for r in sorted((r for r in fast_rows if r.status == "ok"), key=_key)][:tessel_top]
    out += _search_all(top, "tessel", micro_batches, deadline, tick)
    for c in searchable[fast_top:]:
        out.append(Row(c, "-", "pruned", f"not searched: lower bound {_bound(c, micro_batches):.1f} ms, "
                                         f"not among the {fast_top} lowest"))
    ranked = tuple(sorted(out, key=_rank))
    best = _best(out)
    if best is None:
        raise TesselError(f"no candidate placement of {spec.name} fits {cluster.devices} devices: "
                         + "; ".join(sorted({r.reason for r in out})[:3]))
    return Plan(spec.name, cluster.devices, micro_batches, ranked, best, best_base,
                explain(best, best_base, ranked), time.perf_counter() - t0)


def _unique(cands: Iterable[Candidate]) -> list[Candidate]:
    """Candidates whose placements differ (auto recomputation often changes nothing)."""
    seen: set[str] = set()
    out = []
    for c in cands:
        doc = c.placement.to_dict()
        doc.pop("name")
        key = repr(doc)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _memory_check(c: Candidate, n: int) -> Row | None:
    """A pruned row when the weights, or one micro-batch's activations, exceed a device's memory."""
    for d, b in enumerate(c.budget):
        if b <= 0:
            return Row(c, "-", "pruned", f"weights leave {b} MiB for activations on device {d}")
    p = c.placement
    for d in range(p.devices):
        need = sum(max(x.memory, 0) for x in p.blocks_on(d))
        if need > c.budget[d]:
            return Row(c, "-", "pruned", f"one micro-batch keeps {need:.0f} MiB on device {d}, over its "
                                         f"budget {c.budget[d]} MiB")
    return None


def _bound(c: Candidate, n: int) -> float:
    return float(lower_bound(c.placement, math.ceil(n / c.replicas)))


def _baseline(c: Candidate, n: int) -> Row:
    assert c.baseline is not None
    t0 = time.perf_counter()
    try:
        s = run_method(c.baseline, c.placement, math.ceil(n / c.replicas), c.budget)
    except BaselineError as e:
        return Row(c, c.baseline, "failed", str(e), seconds=time.perf_counter() - t0)
    return Row(c, c.baseline, "ok", "", float(s.makespan), time.perf_counter() - t0, s)


def _search_all(cands: Sequence[Candidate], mode: str, n: int, deadline: float,
                tick: Callable[[str], None]) -> list[Row]:
    """Each candidate searched with an equal share of the time left before `deadline`."""
    rows = []
    for k, c in enumerate(cands):
        share = (deadline - time.perf_counter()) / (len(cands) - k)
        if share < MIN_SEARCH_SECONDS:
            rows.append(Row(c, mode, "failed", f"time limit: {share:.1f} s left for it"))
        else:
            rows.append(_search(c, mode, n, share))
        tick(f"{mode} on {c.name}")
    return rows


def _search(c: Candidate, mode: str, n: int, limit: float) -> Row:
    from ..search import search
    t0 = time.perf_counter()
    try:
        s = search(c.placement, math.ceil(n / c.replicas), memory=c.budget, mode=mode, clock=Clock(limit))
    except (ValueError, TimeoutError) as e:  # no schedule fits the budget, or none in time
        return Row(c, mode, "failed", str(e), seconds=time.perf_counter() - t0)
    return Row(c, mode, "ok", "", float(s.makespan), time.perf_counter() - t0, s)


def _key(r: Row) -> float:
    return r.makespan if r.makespan is not None else math.inf


def _rank(r: Row) -> tuple[int, float, str]:
    order = {"ok": 0, "failed": 1, "pruned": 2}[r.status]
    return order, _key(r) if r.status == "ok" else _bound(r.candidate, 1), r.candidate.name + r.method


def _best(rows: Sequence[Row]) -> Row | None:
    ok = [r for r in rows if r.status == "ok"]
    return min(ok, key=lambda r: (_key(r), r.method in ("fast", "tessel"))) if ok else None


def explain(best: Row, base: Row | None, rows: Sequence[Row]) -> str:
    """Why this plan, from the figures of this run."""
    ok = [r for r in rows if r.status == "ok"]
    pruned = sum(r.status == "pruned" for r in rows)
    what = f"{best.candidate.name} scheduled by {best.method}: {_key(best) / 1e3:.3f} s"
    lines = [f"chose {what}, the fastest of {len(ok)} schedules ({pruned} placements pruned before search)."]
    if base is not None and base.makespan is not None:
        if best is base or _key(best) >= _key(base):
            lines.append(f"No searched placement beat the best baseline ({base.method} on {base.candidate.name}), "
                         "so the plan is that baseline.")
        else:
            lines.append(f"It is {_key(base) / _key(best):.2f}x as fast as the best baseline, {base.method} on "
                         f"{base.candidate.name} ({_key(base) / 1e3:.3f} s).")
    bound = best.period_bound
    least = min(r.period_bound for r in ok)
    lines.append(f"Its period bound (busiest device's load) is {bound:.1f} ms per micro-batch"
                 + (" (the lowest of the evaluated placements)." if bound <= least + 1e-9
                    else f" (lowest evaluated: {least:.1f} ms, whose schedule was slower)."))
    if best.peak is not None:
        peak, budget = best.peak
        lines.append(f"Peak activation memory {peak / 1024:.1f} GiB of the {budget / 1024:.1f} GiB its weights "
                     "leave on the fullest device.")
    return " ".join(lines)
