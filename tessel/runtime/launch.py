"""Local launcher: N worker processes on this machine, one rendezvous store, nothing left hanging.

The launcher hosts the TCPStore (as torchrun's agent does: TORCHELASTIC_USE_AGENT_STORE) so the
store outlives any worker; workers join with env:// and report their result or their failure
through it. The first failure (an exception, a crash, or the job timeout) is written as the abort
note every worker watches (see comm.py); workers still alive after a grace period are killed.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import comm

log = logging.getLogger(__name__)

GRACE_SECONDS = 5.0


class LaunchError(RuntimeError):
    """The job failed; the message leads with the first failure, then what every rank reported."""


@dataclass(frozen=True)
class Options:
    timeout: float = 300.0      # the whole job
    pg_timeout: float = 60.0    # any one collective or receive
    backend: str | None = None  # gloo on CPU, nccl with CUDA
    threads: int = 1            # torch threads per worker


def launch(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), options: Options = Options()) -> list[Any]:
    """Run `fn(ctx, *args)` on `nprocs` ranks; return each rank's result, or raise LaunchError.

    `fn` and `args` must be picklable (a module-level function).
    """
    if nprocs < 1:
        raise ValueError(f"cannot launch {nprocs} processes")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=options.pg_timeout))
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "tessel.runtime.executor"])
    procs = [ctx.Process(target=_worker, args=(r, nprocs, store.port, fn, tuple(args), options),
                         name=f"tessel-rank-{r}", daemon=True) for r in range(nprocs)]
    for p in procs:
        p.start()
    try:
        _supervise(procs, store, options)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    return _collect(procs, store)


def _supervise(procs: list[Any], store: Any, options: Options) -> None:
    deadline = time.monotonic() + options.timeout
    running = {p.sentinel: p for p in procs}
    failed_at: float | None = None
    while running:
        now = time.monotonic()
        if failed_at is None and now >= deadline:
            _abort(store, f"the job ran past its timeout of {options.timeout:g} s")
            failed_at = now
        limit = deadline if failed_at is None else failed_at + GRACE_SECONDS
        if now >= limit:
            return  # the caller kills who is left
        for s in mp.connection.wait(list(running), timeout=limit - now):
            p = running.pop(s)
            p.join()
            if p.exitcode != 0 and failed_at is None:
                failed_at = time.monotonic()
                _abort(store, f"rank {_rank(p)} exited with code {p.exitcode}")


def _abort(store: Any, message: str) -> None:
    store.compare_set(comm.ABORT_KEY, "", f"launcher|{message}")


def _rank(p: Any) -> int:
    return int(p.name.rsplit("-", 1)[1])


def _collect(procs: list[Any], store: Any) -> list[Any]:
    if all(p.exitcode == 0 for p in procs):
        return [pickle.loads(store.get(f"tessel/result/{r}")) for r in range(len(procs))]
    notes = []
    for r, p in enumerate(procs):
        for kind in ("error", "stopped"):
            if store.check([f"tessel/{kind}/{r}"]):
                notes.append(store.get(f"tessel/{kind}/{r}").decode())
                break
        else:
            notes.append(f"rank {r} exited with code {p.exitcode}" if p.exitcode
                         else f"rank {r} finished")
    first = notes[0]
    if store.check([comm.ABORT_KEY]):
        first = store.get(comm.ABORT_KEY).decode().partition("|")[2]
    raise LaunchError("\n".join([first] + [f"  {n}" for n in notes]))


def _worker(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, options: Options) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    torch.set_num_threads(options.threads)
    ctx = None
    try:
        ctx = comm.init(options.pg_timeout, options.backend)
        result = fn(ctx, *args)
        ctx.store.set(f"tessel/result/{rank}", pickle.dumps(result))
        # leave together, through the store: a collective here would time out on a slow peer
        ctx.where = "the end (waiting for the other ranks)"
        ctx.store.wait([f"tessel/result/{r}" for r in range(world)], timedelta(seconds=options.timeout))
    except BaseException as e:
        _fail(rank, ctx, port, options, e)
    os._exit(0)


def _fail(rank: int, ctx: comm.Context | None, port: int, options: Options, e: BaseException) -> None:
    """Report the failure and end the process at once (a clean exit could wait on peers)."""
    message = str(e) if str(e).startswith(f"rank {rank}:") else f"rank {rank}: {type(e).__name__}: {e}"
    try:
        store = ctx.store if ctx is not None else dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=options.pg_timeout))
        note = store.get(comm.ABORT_KEY).decode() if store.check([comm.ABORT_KEY]) else ""
        origin = note.partition("|")[0]
        if note and origin != str(rank):
            # a peer failed first and its exit broke our connection: ours is a consequence
            stop = comm.stop_note(rank, ctx.where if ctx is not None else "start-up", origin)
            log.error("%s", stop)
            store.set(f"tessel/stopped/{rank}", stop)
        else:
            log.error("%s\n%s", message, "".join(traceback.format_exception(e)[-6:]))
            store.set(f"tessel/error/{rank}", message)
            store.compare_set(comm.ABORT_KEY, "", f"{rank}|{message}")
    finally:
        os._exit(1)
