"""The fork server that local workers start from, and what it preloads (torch-free to import).

Every worker of a local job forks from one server process that has already imported what workers
need, so no rank pays for imports of its own. Starting the server first thing, before the caller
imports torch itself, lets both import side by side.
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver

# torch.autograd.backward with given gradients imports torch.fx's symbolic shapes (sympy): seconds
# per process when left to each rank
PRELOAD = ["tessel.runtime.launch", "tessel.runtime.executor", "tessel.runtime.train", "tessel.runtime.models",
           "torch.fx.experimental.symbolic_shapes"]


def context() -> mp.context.ForkServerContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_early() -> None:
    """Start the fork server and its imports now, in parallel with whatever the caller does next."""
    context()
    multiprocessing.forkserver.ensure_running()
