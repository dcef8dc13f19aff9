"""One schedule for every rank: made on group rank 0, broadcast as JSON, its hash checked everywhere.

A search may give different (equally good) schedules in different processes; ranks that run
different schedules wait for each other forever. So one rank makes it and the others read it.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..schedule import Schedule, schedule_from_dict


def schedule_digest(s: Schedule) -> str:
    return hashlib.sha256(_bytes(s)).hexdigest()


def _bytes(s: Schedule) -> bytes:
    return json.dumps(s.to_dict(), sort_keys=True, separators=(",", ":"), default=str).encode()


def broadcast_schedule(make: Callable[[], Schedule], group: Any, device: torch.device) -> Schedule:
    """`make()` on group rank 0, the same schedule on every rank of `group` (collective)."""
    rank = dist.get_rank(group)
    data = _bytes(make()) if rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, group=group, group_src=0)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if rank == 0 else
           torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    dist.broadcast(buf, group=group, group_src=0)
    text = bytes(buf.cpu().tolist()) if rank else data
    schedule = schedule_from_dict(json.loads(text), "the schedule broadcast by rank 0", check=True)
    digest = torch.frombuffer(bytearray(hashlib.sha256(_bytes(schedule)).digest()), dtype=torch.uint8)
    first = digest.to(device)
    dist.broadcast(first, group=group, group_src=0)
    if not torch.equal(first.cpu(), digest):
        raise RuntimeError(f"rank {rank}: the schedule read differs from rank 0's (hash mismatch)")
    return schedule
