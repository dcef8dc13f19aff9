"""One schedule on every rank: made once (rank 0) or read by each rank, its SHA-256 compared everywhere.

A search may give different (equally good) schedules in different processes, and ranks that run
different schedules wait for each other forever. So a method is run by rank 0 alone and its
schedule sent to the others as canonical JSON; a schedule file is read by every rank; either way
every rank compares the schedule's hash with the others' before the first step. `Pipeline` (over
its process group) and `tessel run` under torchrun (over the whole job, replicas included) both
come here; they differ only in the `Link` that carries the bytes.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ..errors import ScheduleError
from ..schedule import Schedule, schedule_from_dict
from . import comm


class Link(Protocol):
    """How the ranks that must agree talk: rank 0's bytes to all, and one comparison."""

    @property
    def rank(self) -> int: ...

    def share(self, data: bytes | None) -> bytes:
        """Rank 0's `data` on every rank (a collective; the other ranks pass None)."""
        ...

    def same(self, digest: bytes) -> bool:
        """Whether every rank passed the same digest (a collective)."""
        ...


@dataclass(frozen=True)
class GroupLink:
    """The ranks of one process group (None: the default group), tensors on `device`."""
    group: Any
    device: torch.device

    @property
    def rank(self) -> int:
        return int(dist.get_rank(self.group))

    def share(self, data: bytes | None) -> bytes:
        mine = data or b""
        size = torch.tensor([len(mine)], dtype=torch.int64, device=self.device)
        dist.broadcast(size, group=self.group, group_src=0)
        buf = (torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(self.device) if self.rank == 0 else
               torch.empty(int(size.item()), dtype=torch.uint8, device=self.device))
        dist.broadcast(buf, group=self.group, group_src=0)
        return mine if self.rank == 0 else bytes(buf.cpu().tolist())

    def same(self, digest: bytes) -> bool:
        mine = torch.tensor(list(digest), dtype=torch.int64, device=self.device)
        low, high = mine.clone(), mine.clone()
        dist.all_reduce(low, dist.ReduceOp.MIN, group=self.group)
        dist.all_reduce(high, dist.ReduceOp.MAX, group=self.group)
        return bool(torch.equal(low, mine) and torch.equal(high, mine))


@dataclass(frozen=True)
class JobLink:
    """Every rank of a job started by `comm.init`: its pipeline and its data-parallel replicas."""
    ctx: comm.Context

    @property
    def rank(self) -> int:
        return self.ctx.global_rank

    def share(self, data: bytes | None) -> bytes:
        return comm.share(self.ctx, data)

    def same(self, digest: bytes) -> bool:
        return comm.same_everywhere(self.ctx, digest)


def schedule_bytes(s: Schedule, meta: bool = True) -> bytes:
    """The canonical form that is sent and hashed: sorted keys, no spaces."""
    doc = s.to_dict()
    if not meta:
        doc.pop("meta", None)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()


def schedule_digest(s: Schedule) -> str:
    """SHA-256 of what every rank runs (placement, tasks, limits, repetend): not `meta`, whose
    timings differ between ranks that each made or read the same schedule."""
    return hashlib.sha256(schedule_bytes(s, meta=False)).hexdigest()


def agreed_schedule(make: Callable[[], Schedule], link: Link, *, every_rank: bool = False) -> Schedule:
    """The same schedule on every rank of `link` (a collective).

    `make()` runs on rank 0 only and its schedule is sent to the others, unless `every_rank`
    (each rank reads its own copy of a file). Raises ScheduleError on every rank when the ranks
    end up with different schedules, or (on the others) when rank 0's `make()` failed.
    """
    schedule = make() if every_rank else _from_rank0(make, link)
    digest = bytes.fromhex(schedule_digest(schedule))
    if not link.same(digest):
        raise ScheduleError(f"rank {link.rank}: the ranks hold different schedules (sha256 of this rank's: "
                            f"{digest.hex()[:16]}); give every rank the same schedule file")
    return schedule


def _from_rank0(make: Callable[[], Schedule], link: Link) -> Schedule:
    outcome, failure = None, None
    if link.rank == 0:
        try:
            outcome = b'{"schedule":' + schedule_bytes(make()) + b"}"
        except Exception as e:  # the others stop with rank 0's reason instead of waiting for a schedule
            failure, outcome = e, json.dumps({"error": str(e)}).encode()
    doc = json.loads(link.share(outcome))
    if failure is not None:
        raise failure
    if "error" in doc:
        raise ScheduleError(f"rank 0 could not make the schedule: {doc['error']}")
    # rank 0 too runs the decoded copy, so that every rank holds the very same values
    return schedule_from_dict(doc["schedule"], "the schedule sent by rank 0", check=True)

