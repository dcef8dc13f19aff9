"""Chrome trace-event JSON of a schedule, for Perfetto (ui.perfetto.dev) and chrome://tracing.

One process per device (named `device D`), holding one complete event (`"ph": "X"`) per task on
that device (a block on several devices appears once in each of their processes) and a counter
track `memory` with the device's level after every change (rule 4 order). A `memory limit`
counter draws the limit when the schedule has one.

Time: trace timestamps are microseconds. One unit of the placement's time maps to `us_per_unit`
microseconds: by default from `schedule.meta["time_unit"]` (`s`, `ms`, `us`, `ns`) when the
schedule names its unit, else 1 unit = 1 us, so the numbers shown equal the schedule's numbers.
The mapping is written into the file's `otherData`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import TesselError
from ..io import atomic_write
from ..schedule import EPS, Schedule

US_PER = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}
# reserved colour names of the trace viewer (catapult), close to the Gantt chart's kind colours
CNAME = {"forward": "rail_response", "backward": "rail_idle", "weight": "rail_load",
         "other": "generic_work"}


def us_per_unit(s: Schedule) -> float:
    unit = s.meta.get("time_unit")
    if unit is None:
        return 1.0
    if unit not in US_PER:
        raise TesselError(f"schedule meta time_unit {unit!r} is not one of {', '.join(US_PER)}")
    return US_PER[unit]


def trace_events(s: Schedule, scale: float | None = None) -> list[dict[str, Any]]:
    """The events of the trace: metadata, then per device its tasks and memory counter."""
    k = us_per_unit(s) if scale is None else scale
    events: list[dict[str, Any]] = []
    for d in range(s.placement.devices):
        events += _device_meta(d)
        events += _task_events(s, d, k)
        events += _memory_counter(s, d, k)
    return events


def _device_meta(d: int) -> list[dict[str, Any]]:
    return [{"name": "process_name", "ph": "M", "pid": d, "tid": 0, "args": {"name": f"device {d}"}},
            {"name": "process_sort_index", "ph": "M", "pid": d, "tid": 0, "args": {"sort_index": d}},
            {"name": "thread_name", "ph": "M", "pid": d, "tid": 0, "args": {"name": "tasks"}}]


def _task_events(s: Schedule, d: int, k: float) -> list[dict[str, Any]]:
    by = s.placement.by_id
    out = []
    for t in s.device_tasks(d):
        b = by[t.block]
        out.append({"name": f"{b.id}#{t.micro_batch}", "cat": b.kind, "ph": "X", "pid": d, "tid": 0,
                    "ts": t.start * k, "dur": b.duration * k, "cname": CNAME[b.kind],
                    "args": {"block": b.id, "micro_batch": t.micro_batch, "kind": b.kind,
                             "memory": b.memory, "devices": list(b.devices)}})
    return out


def _memory_counter(s: Schedule, d: int, k: float) -> list[dict[str, Any]]:
    """The level after all changes at each time: at equal times releases come before allocations,
    so the last value at a time is the highest the device holds then."""
    t0 = min(t.start for t in s.tasks)
    points: list[list[float]] = [[t0, 0]]
    for time, delta in s.memory_events(d):
        if abs(time - points[-1][0]) > EPS:
            points.append([time, points[-1][1]])
        points[-1][1] += delta
    out = [{"name": "memory", "ph": "C", "pid": d, "tid": 0, "ts": time * k, "args": {"memory": level}}
           for time, level in points]
    if s.memory_limit is not None:
        lim = s.memory_limit[d]
        out += [{"name": "memory limit", "ph": "C", "pid": d, "tid": 0, "ts": time * k,
                 "args": {"limit": lim}} for time in (t0, t0 + s.makespan)]
    return out


def trace_document(s: Schedule, scale: float | None = None) -> dict[str, Any]:
    k = us_per_unit(s) if scale is None else scale
    other = {"placement": s.placement.name, "method": str(s.meta.get("method", "")),
             "micro_batches": s.micro_batches, "makespan": s.makespan, "us_per_unit": k,
             "time_unit": str(s.meta.get("time_unit", "placement unit"))}
    return {"traceEvents": trace_events(s, k), "otherData": other}


def write_trace(schedule: Schedule, path: str | Path, scale: float | None = None) -> Path:
    """Write the trace JSON (see the module doc for the time mapping); return the path."""
    atomic_write(path, json.dumps(trace_document(schedule, scale), separators=(",", ":")))
    return Path(path)
