"""Schedule layer: the result value, its figures, unroll and JSON I/O (its four validity rules: rules.py)."""
from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from . import bounds
from . import placement as _doc
from .bulk import paused_gc
from .dust import settle
from .errors import LimitError, PlacementError, ScheduleError, quote
from .io import atomic_write, read_document
from .numeric import EPS as EPS
from .numeric import snap as _num
from .placement import MAX_VALUE, Number, Placement, check_fields, in_range, placement_from_dict
from .rules import Violation as Violation
from .rules import violations

__all__ = ["Schedule", "ScheduleError", "Task", "Repetend", "Violation", "schedule_from_dict", "check_task_count"]

FORMAT, VERSION = "tessel-schedule", 1
# most (block, micro-batch) tasks one schedule holds; a longer run is a searched schedule of
# fewer micro-batches unrolled where it is used (Schedule.unroll)
MAX_TASKS = 2_000_000


def check_task_count(placement: Placement, micro_batches: int) -> None:
    """Raise LimitError when N x blocks is over MAX_TASKS, saying how to go larger."""
    tasks = micro_batches * len(placement.blocks)
    if tasks > MAX_TASKS:
        most = max(1, MAX_TASKS // len(placement.blocks))
        raise LimitError(f"{micro_batches:,} micro-batches x {len(placement.blocks):,} blocks = {tasks:,} tasks, "
                         f"more than the {MAX_TASKS:,} accepted; use at most {most:,} micro-batches "
                         "(a repetend repeats unchanged: unroll it where the schedule runs)")


@dataclass(frozen=True)
class Task:
    block: str
    micro_batch: int
    start: Number


@dataclass(frozen=True)
class Repetend:
    """The steady state: the tasks starting in [start, end) repeat every `period`."""
    period: Number
    start: Number
    end: Number

    def holds(self, start: Number) -> bool:
        """Whether a task starting at `start` is in the window [start, end)."""
        return self.start - EPS <= start < self.end - EPS


@dataclass(frozen=True)
class Kernel:
    """One instance of the repetend's window: the tasks inside it, which recur every period
    `shift` micro-batches on. Unroll, search, baselines and charts all read it from here."""
    repetend: Repetend
    tasks: tuple[Task, ...]
    blocks: int

    @property
    def shift(self) -> int:
        """Micro-batches the window advances per period: its tasks per block."""
        return len(self.tasks) // self.blocks

    @property
    def whole(self) -> bool:
        """Whether the window holds a whole, non-zero number of micro-batches' tasks."""
        return self.shift >= 1 and len(self.tasks) % self.blocks == 0


def windows(times: Sequence[Number], period: Number, size: int) -> Iterator[tuple[int, int]]:
    """Candidate repetend windows among sorted task starts: index ranges [i, j) where
    [times[i], times[i] + period) holds exactly `size` tasks; each distinct start once, earliest
    first. Searches and baselines pick among these and confirm with a real unroll."""
    i = 0
    while i < len(times):
        j = bisect_left(times, times[i] + period - EPS)
        if j - i == size:
            yield i, j
        i = bisect_right(times, times[i])


def normalise_limit(limit: Number | Sequence[Number] | None, devices: int) -> tuple[Number, ...] | None:
    """Per-device limits from one number or a list; NaN, infinite or negative limits are refused
    (a NaN limit would otherwise switch the memory rule off)."""
    if limit is None:
        return None
    lim = (limit,) if isinstance(limit, (int, float)) else tuple(limit)
    for x in lim:
        if not in_range(x, 0, MAX_VALUE):
            raise ScheduleError(f"memory limit must be a number in 0..{MAX_VALUE:g}, got {quote(x)}")
    if len(lim) == 1:
        return lim * devices
    if len(lim) != devices:
        raise ScheduleError(f"memory limit has {len(lim)} values for {devices} devices")
    return lim


@dataclass(frozen=True)
class Schedule:
    placement: Placement
    micro_batches: int
    tasks: tuple[Task, ...]
    memory_limit: tuple[Number, ...] | None = None
    repetend: Repetend | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    # ---- construction ----------------------------------------------------------------------
    @staticmethod
    def build(placement: Placement, micro_batches: int, starts: Mapping[tuple[str, int], Number],
              memory_limit: Number | Sequence[Number] | None = None, repetend: Repetend | None = None,
              meta: Mapping[str, Any] | None = None, check: bool = True) -> Schedule:
        """Make a schedule from {(block, micro_batch): start}, shifted to begin at 0, validated."""
        t0 = min(starts.values()) if starts else 0
        with paused_gc():
            tasks = tuple(Task(b, m, _num(s - t0)) for (b, m), s in
                          sorted(starts.items(), key=lambda kv: (kv[1], kv[0][1], kv[0][0])))
        rep = None if repetend is None else Repetend(repetend.period, _num(repetend.start - t0),
                                                     _num(repetend.end - t0))
        s = Schedule(placement, micro_batches, tasks, normalise_limit(memory_limit, placement.devices),
                     rep, dict(meta or {}))
        s.__dict__["_in_start_order"] = True  # sorted just above: each device's tasks are in its order
        if check:
            s.validate()
        return s

    def with_meta(self, **kw: Any) -> Schedule:
        s = replace(self, meta={**self.meta, **kw})
        # the same tasks: the figures computed so far hold (at 524k tasks they take seconds)
        s.__dict__.update((k, v) for k, v in self.__dict__.items() if isinstance(getattr(Schedule, k, None), cached_property))
        return s

    # ---- lookups -----------------------------------------------------------------------------
    @cached_property
    def start(self) -> dict[tuple[str, int], Number]:
        return {(t.block, t.micro_batch): t.start for t in self.tasks}

    def end(self, block: str, micro_batch: int) -> Number:
        return self.start[(block, micro_batch)] + self.placement.by_id[block].duration

    def device_tasks(self, device: int) -> list[Task]:
        """Tasks on one device in start order: the per-device order a runtime executes."""
        if self._in_start_order:  # no sort of what is sorted (half a second at 524k tasks)
            return list(self._on_device[device])
        return sorted(self._on_device[device], key=lambda t: (t.start, t.micro_batch, t.block))

    @cached_property
    def _in_start_order(self) -> bool:
        """Whether the tasks are known to be in device_tasks' order: set by build, not known else."""
        return False

    @cached_property
    def _on_device(self) -> list[list[Task]]:
        """Each device's tasks, in one pass over the tasks (per-device scans were quadratic: 4,096
        devices x 524k tasks took minutes)."""
        k = self.placement.devices
        out: list[list[Task]] = [[] for _ in range(k)]
        on = {b.id: tuple(out[d].append for d in b.devices if 0 <= d < k) for b in self.placement.blocks}
        for t in self.tasks:  # a bound append per device: no lookups in the loop over 524k tasks
            for add in on[t.block]:
                add(t)
        return out

    def device_orders(self) -> list[list[Task]]:
        return [self.device_tasks(d) for d in range(self.placement.devices)]

    # ---- the four rules ------------------------------------------------------------------------
    def violations(self, limit: int = 10) -> list[Violation]:
        """Broken rules, first ones first; empty when the schedule is valid. Rules 2-4 are only
        checked once rule 1 holds (they need every task, once, at a real start)."""
        return violations(self, limit)

    def errors(self, limit: int = 10) -> list[str]:
        """The broken rules as `rule N: ...` lines."""
        return [str(v) for v in self.violations(limit)]

    def validate(self) -> Schedule:
        errs = self.violations()
        if errs:
            raise ScheduleError("; ".join(str(v) for v in errs[:3]), errs[0].rule)
        return self

    # ---- figures -----------------------------------------------------------------------------
    def memory_events(self, device: int) -> list[tuple[Number, Number]]:
        """(time, delta) in rule-4 order: releases at block ends, allocations at block starts."""
        by, ev = self.placement.by_id, []
        for t in self._on_device[device]:
            b = by[t.block]
            if b.memory:
                ev.append((t.start + b.duration, 0, b.memory) if b.memory < 0 else (t.start, 1, b.memory))
        ev.sort()
        return [(time, mem) for time, _, mem in ev]

    def _peaks(self) -> list[tuple[Number, Number]]:
        """Per device, its peak memory and when it is first reached (rule 4 and the figures)."""
        return self._peak_at

    @cached_property
    def _peak_at(self) -> list[tuple[Number, Number]]:
        out = []
        for d in range(self.placement.devices):
            level: Number = 0
            peak: Number = 0
            at: Number = 0
            for time, mem in self.memory_events(d):
                level += mem
                if level > peak + EPS:
                    peak, at = level, time
            out.append((_num(peak), at))
        return out

    @cached_property
    def peak_memory(self) -> tuple[Number, ...]:
        return tuple(p for p, _ in self._peaks())

    @cached_property
    def makespan(self) -> Number:
        by = self.placement.by_id
        return _num(max(t.start + by[t.block].duration for t in self.tasks) - min(t.start for t in self.tasks))

    @cached_property
    def lower_bound(self) -> Number:
        return _num(bounds.lower_bound(self.placement, self.micro_batches))

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound

    @cached_property
    def busy(self) -> tuple[Number, ...]:
        return tuple(_num(self.micro_batches * x) for x in self.placement.loads)

    @property
    def bubble(self) -> float:
        return 1.0 - sum(self.busy) / (self.placement.devices * self.makespan)

    def figures(self) -> dict[str, Any]:
        return {"micro_batches": self.micro_batches, "makespan": self.makespan,
                "lower_bound": self.lower_bound, "ratio": round(self.ratio, 4),
                "bubble": round(self.bubble, 4), "peak_memory": list(self.peak_memory),
                "memory_limit": None if self.memory_limit is None else list(self.memory_limit),
                "period": None if self.repetend is None else self.repetend.period}

    # ---- unroll ------------------------------------------------------------------------------
    def kernel(self, repetend: Repetend | None = None) -> Kernel | None:
        """The window of `repetend` (default: this schedule's) with its tasks; None without one."""
        rep = repetend or self.repetend
        if rep is None:
            return None
        return Kernel(rep, tuple(t for t in self.tasks if rep.holds(t.start)), len(self.placement.blocks))

    def unroll(self, micro_batches: int, check: bool = True) -> Schedule:
        """Repeat the repetend so the schedule covers `micro_batches`, without any search."""
        if self.repetend is None:
            m, n = micro_batches, self.micro_batches
            raise ScheduleError(f"this schedule (made by {self.meta.get('method', '?')}) is for {n} micro-batches and "
                                f"carries no repetend to unroll to {m}: make it for {m} instead (the same search, "
                                f"baseline or plan with -n {m}), or run it with {n}")
        check_task_count(self.placement, micro_batches)  # refused at once, not after building them
        return unroll(self, micro_batches, check)

    # ---- I/O ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        head, tail = self._fields()
        tasks = [{"block": t.block, "micro_batch": t.micro_batch, "start": t.start} for t in self.tasks]
        return {**head, "tasks": tasks, **tail}

    def _fields(self) -> tuple[dict[str, Any], dict[str, Any]]:  # to_dict's fields before its tasks, and after
        head: dict[str, Any] = {"format": FORMAT, "version": VERSION, "placement": self.placement.to_dict()}
        if self.memory_limit is not None:
            lim = self.memory_limit
            head["memory_limit"] = lim[0] if len(set(lim)) == 1 else list(lim)
        head["micro_batches"] = self.micro_batches
        tail: dict[str, Any] = {}
        if self.repetend is not None:
            r = self.repetend
            tail["repetend"] = {"period": r.period, "start": r.start, "end": r.end}
        tail["meta"] = dict(self.meta)
        return head, tail

    def save(self, path: str | Path) -> None:
        """to_dict as compact JSON, the tasks written straight from the Task values: the bytes
        json.dumps writes for their dicts, without making 524k of them (seconds at 4,096 devices)."""
        head, tail = self._fields()
        with paused_gc():
            text = f'{_dumps(head)[:-1]},"tasks":[{_tasks_json(self.tasks)}],{_dumps(tail)[1:]}'
        atomic_write(path, text)

    @staticmethod
    def load(path: str | Path, check: bool = False) -> Schedule:
        try:
            doc = read_document(path)
        except PlacementError as e:
            raise ScheduleError(str(e)) from None
        return schedule_from_dict(doc, str(path), check)

    def ascii(self, width: int = 200) -> str:
        from .render import render_ascii
        return render_ascii(self, width)


def _dumps(x: Any) -> str:
    return json.dumps(x, indent=None, separators=(",", ":"), default=str)


def _tasks_json(tasks: Sequence[Task]) -> str:
    """The tasks as json.dumps writes their dicts: exact ints and finite floats as their repr, as
    it does; anything else through json.dumps itself."""
    heads: dict[str, str] = {}  # per block: the text up to its micro-batch
    parts = []
    for t in tasks:
        head = heads.get(t.block)
        if head is None:
            head = heads[t.block] = f'{{"block":{_dumps(t.block)},"micro_batch":'
        m, s = t.micro_batch, t.start
        if type(m) is int and (type(s) is int or (type(s) is float and math.isfinite(s))):
            parts.append(f'{head}{m!r},"start":{s!r}}}')
        else:
            parts.append(f'{head}{_dumps(m)},"start":{_dumps(s)}}}')
    return ",".join(parts)


def _require(doc: Mapping[str, Any], key: str, types: tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise ScheduleError(f"{where}: missing field {key!r}")
    v = doc[key]
    if not isinstance(v, types) or isinstance(v, bool):
        raise ScheduleError(f"{where}: field {key!r} has the wrong type ({type(v).__name__})")
    if isinstance(v, str) and len(v) > 200:
        raise ScheduleError(f"{where}: field {key!r} is longer than 200 characters: {quote(v)}")
    return v


def schedule_from_dict(doc: Any, source: str = "schedule", check: bool = False) -> Schedule:
    """Read a v1 schedule document strictly; structural problems raise ScheduleError (rule 0).

    Only the placement, limits, micro-batch count and tasks are taken as given: every figure is
    recomputed from them. The stored repetend is a claim, kept only when unrolling one more
    period by it gives a valid schedule (else dropped, and meta["repetend_claim"] says why)."""
    source = quote(source).strip("'\"")
    if not isinstance(doc, Mapping):
        raise ScheduleError(f"{source}: a schedule must be a JSON object")
    version = doc.get("version")
    if doc.get("format") != FORMAT or type(version) is not int or version != VERSION:
        raise ScheduleError(f"{source}: not a {FORMAT} version {VERSION} document "
                            f"(format {quote(doc.get('format'))}, version {quote(version)})")
    check_fields(doc, _doc.SCHEDULE_FIELDS, source, ScheduleError)
    try:
        placement = placement_from_dict(_require(doc, "placement", (dict,), source), f"{source}: placement")
    except PlacementError as e:
        raise ScheduleError(str(e)) from None
    n = _require(doc, "micro_batches", (int,), source)
    if n < 1:
        raise ScheduleError(f"{source}: micro_batches must be >= 1, got {quote(n)}")
    check_task_count(placement, n)
    tasks = _tasks_from_doc(_require(doc, "tasks", (list,), source), placement, n, source)
    limit = doc.get("memory_limit")
    if limit is not None and not (isinstance(limit, (int, float)) or
                                  (isinstance(limit, list) and all(isinstance(x, (int, float)) for x in limit))):
        raise ScheduleError(f"{source}: memory_limit must be a number or a list of numbers")
    meta = doc.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise ScheduleError(f"{source}: meta must be an object")
    s = Schedule(placement, n, tuple(tasks), normalise_limit(limit, placement.devices), None, dict(meta))
    s = _with_claimed_repetend(s, doc.get("repetend"), source)
    return s.validate() if check else s


def _tasks_from_doc(items: list[Any], placement: Placement, n: int, source: str) -> list[Task]:
    if len(items) > n * len(placement.blocks):
        raise ScheduleError(f"{source}: {len(items):,} tasks for {n} micro-batches of "
                            f"{len(placement.blocks)} blocks (rule 1: each task appears once)", 1)
    tasks = []
    for i, t in enumerate(items):
        where = f"{source}: tasks[{i}]"
        if not isinstance(t, Mapping):
            raise ScheduleError(f"{where} must be an object")
        check_fields(t, _doc.TASK_FIELDS, where, ScheduleError)
        tasks.append(Task(_require(t, "block", (str,), where), _require(t, "micro_batch", (int,), where),
                          _require(t, "start", (int, float), where)))
    return tasks


def _with_claimed_repetend(s: Schedule, rep: Any, source: str) -> Schedule:
    if rep is None:
        return s
    where = f"{source}: repetend"
    if not isinstance(rep, Mapping):
        raise ScheduleError(f"{where} must be an object")
    values = [_require(rep, k, (int, float), where) for k in ("period", "start", "end")]
    if not all(in_range(v, 0, MAX_VALUE) for v in values) or not values[0] > 0 or values[2] < values[1]:
        raise ScheduleError(f"{where}: period, start and end must be numbers with 0 < period and "
                            f"0 <= start <= end <= {MAX_VALUE:g}, got {quote(values)}")
    claimed = replace(s, repetend=Repetend(*values))
    why = _repetend_doubt(claimed)
    return claimed if why is None else s.with_meta(repetend_claim=f"ignored: {why}")


def _repetend_doubt(s: Schedule) -> str | None:
    """Why the repetend is not what it claims, or None: valid, and valid unrolled one period more."""
    if s.violations(1):
        return "the schedule is invalid"
    kernel = s.kernel()
    try:
        s.unroll(s.micro_batches + max(kernel.shift if kernel else 1, 1), check=True)
    except ScheduleError as e:
        return str(e)[:200]
    return None


def unroll(s: Schedule, micro_batches: int, check: bool = True) -> Schedule:
    """Warm-up as is, the kernel [start, end) repeated, the cool-down shifted after it."""
    kernel = s.kernel()
    assert kernel is not None
    rep, shift = kernel.repetend, kernel.shift
    if not kernel.whole:
        raise ScheduleError(f"repetend [{rep.start}, {rep.end}) holds {len(kernel.tasks)} tasks, "
                            f"not a whole number of micro-batches of {kernel.blocks} blocks")
    extra = micro_batches - s.micro_batches
    if extra % shift:
        raise ScheduleError(f"this repetend advances {shift} micro-batches per period: "
                            f"{micro_batches} is not {s.micro_batches} plus a multiple of {shift}")
    reps = extra // shift + 1
    if reps < 0:
        raise ScheduleError(f"cannot unroll below {s.micro_batches - shift} micro-batches")
    starts: dict[tuple[str, int], Number] = {}
    for t in s.tasks:
        if t.start < rep.start - EPS:
            starts[(t.block, t.micro_batch)] = t.start
        elif t.start < rep.end - EPS:
            for j in range(reps):
                starts[(t.block, t.micro_batch + j * shift)] = t.start + j * rep.period
        else:
            starts[(t.block, t.micro_batch + (reps - 1) * shift)] = t.start + (reps - 1) * rep.period
    meta = {**s.meta, "unrolled_from": s.micro_batches}
    out = Schedule.build(s.placement, micro_batches, starts, s.memory_limit, rep if reps > 0 else None, meta, False)
    if moved := settle(s.placement, out.tasks):  # a shifted release ends a hair after what follows (tessel.dust)
        out = Schedule.build(s.placement, micro_batches, {**out.start, **moved}, s.memory_limit, out.repetend, meta, False)
    return out.validate() if check else out

