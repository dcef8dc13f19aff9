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

log = logging.getLogger(__name__)

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
