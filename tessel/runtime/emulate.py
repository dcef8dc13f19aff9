"""Emulated devices: every task takes exactly its placement duration, by sleeping; messages are real.

A compute task of block b starts when its received inputs are in (and, for a block on several
devices, when every device of its set has reached it: an all-reduce of one number over the set's
group, as a collective would), runs the block's module (the `emulated` example model: elementwise,
microseconds), then sleeps until `duration(b) x unit_ms` after its start. The lowering, the
executor, the messages (real tensors of `features` floats per sample, torch.distributed) and the
processes are the real ones; only the compute is replaced. A sleeping rank uses no CPU, so 4-16
ranks fit on 2 cores and a step's time measures what the executor adds to the schedule: waiting
on messages, the order it posts them, lost overlap.

Latency: with `latency` on, a transferred tensor is ready `placement.latency x unit_ms` after its
producer ends, what the schedule assumes of an edge between different device sets.

`run_emulated(schedule, unit_ms)` runs it from Python; `tessel run --emulate UNIT_MS` from the CLI.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..errors import ExecutionError, UsageError
from ..placement import Placement
from ..schedule import Schedule
from ..timing import earliest_starts, orders_of
from .comm import Context
from .program import TAG_LIMIT, Instruction

STAMP_TAG = 2 * TAG_LIMIT  # a transfer's ready time travels with tag STAMP_TAG + its data tag
DEFAULT_FEATURES = 1024  # floats per sample of every activation (4 KiB)
WAITED = 1e-3  # s: a receive's wait() this long means its data was not in yet (an arrived one: ~10 us)


@dataclass(frozen=True)
class Emulation:
    """How devices are emulated: `unit_ms` milliseconds per placement time unit."""
    unit_ms: float
    latency: bool = True  # delay each transfer by the placement's latency
    # "device": tasks keep the device's clock, sends leave before the sleep with their ready time
    # (SleepingDevice); "wall": a task sleeps right after its inputs arrived and sends after it,
    # every wake-up of a sleeping process counted, latency left out (the model torch's runtime can
    # be given too: bench/realized.py)
    clock: str = "device"
    # device clock: how far a rank's host may run ahead of its device, in units (a GPU's host
    # queues work ahead of its kernels): it looks at the next task's inputs that early, so a
    # sleeping process that wakes late on a loaded host costs nothing until it is later than this
    ahead: float = 1.0

    def __post_init__(self) -> None:
        if not self.unit_ms > 0 or self.unit_ms > 60_000:
            raise UsageError(f"emulated time unit must be in (0, 60000] ms, got {self.unit_ms!r}")
        if not 0 <= self.ahead <= 1000:
            raise UsageError(f"emulated run-ahead must be in [0, 1000] units, got {self.ahead!r}")
        if self.clock not in ("device", "wall"):
            raise UsageError(f"emulated clock must be 'device' or 'wall', got {self.clock!r}")


class SleepingDevice:
    """The Pacer of one rank (see executor.Pacer): sleeps out each task's duration.

    Time is the device's: a task starts at the latest of its device's previous end, each input's
    ready time (its producer's end plus the latency, sent along as a stamp) and, for an input not
    in yet when the rank looks, the moment it arrives; a collective task at the latest of its
    devices' starts (an all-reduce of the maximum). A send is posted when its producer's block has
    run, before the sleep, as a GPU's host queues it behind the kernel; its stamp says when it is
    ready. A rank sleeps until its device's previous task ends (less the run-ahead, `ahead` units)
    before it looks at the next one's inputs, so wall time follows device time, and an input still missing then (a receive posted
    late, a producer whose process fell behind, a slow transport) delays the task in real time.
    A sleeping process's wake-up delay on a loaded host is not counted as device time.
    A stamp goes right after its data to the same peer and its receive right after the data's,
    so each pair's messages stay in posting order (NCCL ignores tags).
    """

    def __init__(self, placement: Placement, emulation: Emulation, ctx: Context) -> None:
        self.unit = emulation.unit_ms / 1e3
        self.duration = {b.id: float(b.duration) * self.unit for b in placement.blocks}
        self.devices = {b.id: b.devices for b in placement.blocks}
        self.delay = float(placement.latency) * self.unit if emulation.latency else 0.0
        self.wall = emulation.clock == "wall"
        self.ahead = emulation.ahead * self.unit
        self.ctx = ctx
        self.began = self.free_at = 0.0
        self.stamps: dict[tuple[int, int], tuple[Tensor, Any]] = {}  # (src, tag) -> ready time, its work
        self.posted: list[tuple[Any, Tensor]] = []

    def begin_step(self) -> None:
        self.free_at = time.perf_counter()

    def receive(self, src: int, tag: int) -> None:
        if self.wall:
            return
        buf = torch.zeros(1, dtype=torch.float64, device=self.ctx.device)
        self.stamps[(src, tag)] = (buf, dist.irecv(buf, src, tag=STAMP_TAG + tag))

    def send(self, post: Callable[[], Any], tensor: Tensor, dst: int, tag: int) -> None:
        if self.wall:
            self.posted.append((post(), tensor))
            return
        stamp = torch.tensor([self.free_at], dtype=torch.float64, device=self.ctx.device)
        self.posted += [(post(), tensor), (dist.isend(stamp, dst, tag=STAMP_TAG + tag), stamp)]

    def start(self, ins: Instruction, inputs: Sequence[tuple[int, int]], waits: Sequence[Any]) -> None:
        devs = self.devices[ins.block]
        if self.wall:
            for w in waits:
                w.wait()
            if len(devs) > 1:
                dist.all_reduce(torch.zeros(1, device=self.ctx.device), group=self.ctx.group(devs))
            self.began = time.perf_counter()
            return
        if len(devs) == 1:
            self.idle(self.ahead)  # the device is busy with the previous task until then
        arrived = _arrival(waits)
        begin = self.free_at
        for key in inputs:
            buf, work = self.stamps.pop(key)
            work.wait()
            begin = max(begin, float(buf) + self.delay)
        if arrived is not None:  # an input that arrived after its ready time holds the task until then
            begin = max(begin, arrived)
        if len(devs) > 1:
            # a collective task starts on all its devices together: they agree on the latest start
            # while the previous task runs out, as a GPU's host queues a collective ahead
            t = torch.tensor([begin], dtype=torch.float64, device=self.ctx.device)
            work = dist.all_reduce(t, dist.ReduceOp.MAX, group=self.ctx.group(devs), async_op=True)
            self.idle(self.ahead)
            work.wait()
            begin = float(t)
        self.began = begin

    def finish(self, ins: Instruction) -> None:
        # the task's outputs are ready at its end: stamps of its sends (posted next) say so
        self.free_at = self.began + self.duration[ins.block]
        if self.wall:
            self.idle()
        self.posted = [(w, x) for w, x in self.posted if not w.is_completed()]

    def idle(self, ahead: float = 0.0) -> None:
        """Sleep until `ahead` seconds before the device's last task ends: real time keeps up."""
        self._sleep(self.free_at - ahead - time.perf_counter())

    @staticmethod
    def _sleep(seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def drain(self) -> None:
        self.idle()
        for work, _ in self.posted:
            work.wait()
        self.posted = []
        if self.stamps:
            raise ExecutionError(f"rank {self.ctx.rank}: stamps of {sorted(self.stamps)[:3]} never read")


def _arrival(waits: Sequence[Any]) -> float | None:
    """When the last of the received inputs arrived, if the host had to wait for it; None if all
    were in when it looked.

    Awaited here, timed: gloo's works report is_completed() False until wait() is called, data in
    or not, so asking them first would count every late wake-up of a sleeping host as a late
    input. The stamps are awaited after: their delivery is the emulator's, not the schedule's."""
    looked = time.perf_counter()
    for w in waits:
        w.wait()
    now = time.perf_counter()
    return now if now - looked > WAITED else None


# ---- results -------------------------------------------------------------------------------------
def replay_makespan(schedule: Schedule) -> float:
    """The makespan of the schedule's per-device orders run as early as possible (the emulator's
    model: each task starts once its inputs, latency included, and its device are free)."""
    p = schedule.placement
    starts = earliest_starts(p, schedule.micro_batches, orders_of(schedule))
    return float(max(s + p.by_id[b].duration for (b, _), s in starts.items()))


@dataclass(frozen=True)
class EmulatedRun:
    """Step times (s, slowest rank, after a barrier) of an emulated run next to what the schedule predicts."""
    unit_ms: float
    makespan: float   # the schedule's, in placement units
    replay: float     # its orders run as early as possible, in placement units
    seconds: tuple[float, ...]
    order_errors: tuple[str, ...] = ()

    @property
    def predicted(self) -> float:
        """The predicted step time in seconds."""
        return self.replay * self.unit_ms / 1e3

    @property
    def ratio(self) -> float:
        """Median realized step / predicted step."""
        return statistics.median(self.seconds) / self.predicted


def run_emulated(schedule: Schedule, unit_ms: float, steps: int = 3, features: int = DEFAULT_FEATURES,
                 latency: bool = True, timeout: float = 300.0) -> EmulatedRun:
    """Run `schedule` on emulated devices (local processes, gloo): each step's time and the check
    that every rank ran the schedule's order. The first step (shape pass, warm-up) is not timed."""
    from .launch import Options
    from .networks import Config
    from .train import TrainJob, train
    emulation = Emulation(unit_ms, latency)
    job = TrainJob.of("emulated", schedule, steps=steps + 1, micro_batch_size=1, check=False,
                      config=Config(features=features), emulate=emulation)
    reports = train(job, Options(timeout=timeout))
    seconds = tuple(max(r.steps[i].seconds for r in reports) for i in range(1, steps + 1))
    errors = tuple(e for r in reports for e in r.order_errors)
    return EmulatedRun(unit_ms, float(schedule.makespan), replay_makespan(schedule), seconds, errors)
