"""The fork server that local workers start from, and what it preloads (torch-free to import).

Every worker of a local job forks from one server process that has already imported what workers
need, so no rank pays for imports of its own. Starting the server first thing, before the caller
imports torch itself, lets both import side by side.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
from typing import Any

from ..errors import LimitError

log = logging.getLogger(__name__)

PROCESSES_PER_CORE = 4    # ranks mostly wait on each other: a few per core still make progress
MIN_PROCESSES = 8         # what any machine may run (tests and examples use up to 8 ranks)
RANK_BYTES = 256 * 2**20  # a rank's resident memory with torch loaded (measured ~63-200 MiB), rounded up

# the workers' imports; none of them, nor a training step, imports sympy (torch.fx's symbolic
# shapes, see executor.autograd_backward), torch._dynamo (torch.optim) or transformers: a test checks
PRELOAD = ["tessel.runtime.launch", "tessel.runtime.executor", "tessel.runtime.train", "tessel.runtime.networks"]


def context() -> mp.context.ForkServerContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_early() -> None:
    """Start the fork server and its imports now, in parallel with whatever the caller does next."""
    context()
    multiprocessing.forkserver.ensure_running()


def alive() -> bool:
    """Whether this process's fork server is running (False when it was never started)."""
    server: Any = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return False
    try:  # not waitpid: multiprocessing reaps its server itself
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop() -> None:
    """End the fork server now, if this process started one (nothing otherwise).

    For a process about to exit: left alone, the server notices and tears torch down, a second
    during which it still holds the caller's output open (a pipe reader waits for it). It is
    killed, as its workers are done: it has nothing to flush. (Reaches into multiprocessing's
    forkserver module: its own stop waits for that teardown.)"""
    server: Any = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or not hasattr(server, "_stop_unlocked") or not hasattr(server, "_lock"):
        return
    with server._lock:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop_unlocked()  # closes its pipe, reaps it, removes its socket file
    log.info("stopped the fork server (pid %d)", pid)


def capacity(nprocs: int) -> None:
    """Refuse more processes than this machine holds: PROCESSES_PER_CORE per core (at least
    MIN_PROCESSES) and RANK_BYTES each within the memory available now."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    most = max(MIN_PROCESSES, PROCESSES_PER_CORE * cores)
    if nprocs > most:
        raise LimitError(f"{nprocs} processes on {cores} cores: more than the {most} this machine runs "
                         f"({PROCESSES_PER_CORE} per core); fewer devices or replicas, or --oversubscribe")
    free = _available_memory()
    if free is not None and nprocs * RANK_BYTES > free:
        raise LimitError(f"{nprocs} processes need about {nprocs * RANK_BYTES / 2**30:.1f} GiB "
                         f"({RANK_BYTES // 2**20} MiB each), more than the {free / 2**30:.1f} GiB available; "
                         "fewer devices or replicas, or --oversubscribe")


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
