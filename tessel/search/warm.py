"""Warm starts: schedules a user brings (another generator's, an earlier run's) that the search
races like a baseline and polishes like one, so it never answers longer than what it was given.

Only each device's order is taken from such a schedule: it is timed again on this placement's
costs and latencies (as early as the order allows) and checked under this search's memory
limits, so a schedule another tool timed by its own cost model still starts the search, and one
that does not fit this placement is refused with the reason (which block, which device, which
limit)."""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import SearchError
from ..placement import Number, Placement
from ..schedule import Schedule, ScheduleError
from ..timing import DeadlockError, orders_of, schedule_from_orders


def warm_start(s: Schedule, p: Placement, n: int, limit: Number | Sequence[Number] | None, label: str) -> Schedule:
    """`s`'s per-device orders timed on `p` for `n` micro-batches under `limit`; SearchError
    naming what does not match (micro-batches, blocks, devices) or does not fit (a deadlock, the
    memory limit)."""
    where = f"start {label}"
    if s.micro_batches != n:
        raise SearchError(f"{where}: it has {s.micro_batches} micro-batches, the search {n}")
    theirs = {b.id: b for b in s.placement.blocks}
    for b in p.blocks:
        other = theirs.get(b.id)
        if other is None:
            raise SearchError(f"{where}: block {b.id!r} of placement {p.name!r} is not in it")
        if sorted(other.devices) != sorted(b.devices):
            raise SearchError(f"{where}: block {b.id!r} runs on device(s) {_devices(other.devices)} there, "
                              f"on {_devices(b.devices)} here")
    extra = sorted(set(theirs) - {b.id for b in p.blocks})
    if extra:
        raise SearchError(f"{where}: block {extra[0]!r} is not in placement {p.name!r}")
    try:
        return schedule_from_orders(p, n, orders_of(s), limit, None, {"method": f"start:{label}"})
    except DeadlockError as e:
        raise SearchError(f"{where}: its device orders deadlock on this placement ({e})") from None
    except ScheduleError as e:
        raise SearchError(f"{where}: timed on this placement it is not valid: {e}") from None


def _devices(ds: Sequence[int]) -> str:
    return ", ".join(str(d) for d in sorted(ds))
