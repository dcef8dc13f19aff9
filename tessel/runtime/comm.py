"""Process set-up for the runtime: env:// init, sub-groups, and stopping every rank when one fails.

A failing rank writes an abort note into the rendezvous store (hosted by the launcher, or by
torchrun's agent). Every rank runs a watcher thread that polls for that note; a rank blocked in a
receive or a collective cannot be interrupted from Python, so the watcher writes where that rank
stood, says why it stops and ends the process. The process-group timeout bounds any wait even
when no note comes (a peer that vanished).
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

ABORT_KEY = "tessel/abort"
POLL_SECONDS = 0.1


@dataclass
class Context:
    """One worker process: its rank, device and store; `where` says what it is doing now."""
    rank: int
    world: int
    device: torch.device
    store: Any
    timeout: timedelta
    where: str = "start-up"
    groups: dict[tuple[int, ...], Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    watcher: threading.Thread | None = None

    def aborted(self) -> str | None:
        if not self.store.check([ABORT_KEY]):
            return None
        return self.store.get(ABORT_KEY).decode()

    def group(self, devices: tuple[int, ...]) -> Any:
        return self.groups[tuple(sorted(devices))]


def init(timeout: float = 60.0, backend: str | None = None) -> Context:
    """Join the job described by the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    td = timedelta(seconds=timeout)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=td)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=td)
    ctx = Context(rank, world, device, store, td)
    ctx.watcher = threading.Thread(target=_watch, args=(ctx,), name="tessel-abort-watcher", daemon=True)
    ctx.watcher.start()
    return ctx


def shutdown(ctx: Context) -> None:
    """Leave the job cleanly (for a process that goes on or exits normally)."""
    ctx.done.set()
    if ctx.watcher is not None:
        ctx.watcher.join()
    dist.destroy_process_group()


def make_groups(ctx: Context, device_sets: list[tuple[int, ...]]) -> None:
    """One process group per device set of several devices; collective: every rank, same order."""
    for devs in sorted({tuple(sorted(d)) for d in device_sets if len(d) > 1}):
        ctx.groups[devs] = dist.new_group(list(devs), timeout=ctx.timeout)


def _watch(ctx: Context) -> None:
    while not ctx.done.wait(POLL_SECONDS):
        try:
            note = ctx.aborted()
        except Exception:  # the store is gone: the launcher ended; nothing left to coordinate
            return
        if note is None:
            continue
        origin, _, message = note.partition("|")
        if origin == str(ctx.rank):
            return
        stop = stop_note(ctx.rank, ctx.where, origin)
        try:
            ctx.store.set(f"tessel/stopped/{ctx.rank}", stop)
        except Exception:
            pass
        log.error("%s: %s", stop, message)
        os._exit(1)


def stop_note(rank: int, where: str, origin: str) -> str:
    """What a rank that stops because of another one's failure reports."""
    cause = "the launcher stopped the job" if origin == "launcher" else f"rank {origin} failed"
    return f"rank {rank} stopped at {where}: {cause}"
