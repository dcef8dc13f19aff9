"""Local launcher: N worker processes on this machine, one rendezvous store, nothing left hanging.

The launcher hosts the job's store (as torchrun's agent does) so the store outlives any worker;
workers report their result or their failure through it. The first failure (an exception, a
crash, or the job timeout) is written as the abort note every worker watches (see comm.py);
workers still alive after a grace period are killed, and so is every worker when the launcher is
interrupted (any exception, KeyboardInterrupt included). A worker whose launcher vanished (killed
outright) loses the store and ends itself (comm's watcher).

Security: the store listens on the address asked for only (loopback by default: the socket is
bound here and handed to the store), its keys live under a random namespace, and every value the
runtime reads back is signed with a per-job random key that reaches the workers only through their
spawn arguments. Results cross as JSON (`wire`), never pickled; gloo binds to the loopback
interface for a loopback job.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import secrets
import signal
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import PrefixStore, TCPStore

from ..errors import LaunchError as LaunchError
from . import comm, forkserver, wire

log = logging.getLogger(__name__)

GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class Options:
    timeout: float = 300.0      # the whole job
    pg_timeout: float = 60.0    # any one collective or receive
    backend: str | None = None  # gloo on CPU, nccl with CUDA
    threads: int = 1            # torch threads per worker
    host: str = "127.0.0.1"     # the address the store listens on
    replicas: int = 1           # data-parallel replicas (nprocs = replicas x pipeline ranks)


def launch(fn: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), options: Options = Options()) -> list[Any]:
    """Run `fn(ctx, *args)` on `nprocs` ranks; return each rank's result, or raise LaunchError.

    `fn` and `args` must be picklable (a module-level function): they go to the workers through
    the multiprocessing spawn pipe. Results come back as JSON (`wire`: JSON values, tuples and
    registered dataclasses).
    """
    if nprocs < 1:
        raise LaunchError(f"cannot launch {nprocs} processes: give at least 1")
    if options.replicas < 1 or nprocs % options.replicas:
        raise LaunchError(f"{nprocs} processes do not split into {options.replicas} data-parallel replicas: give a "
                          f"multiple of {options.replicas} processes")
    if not options.timeout > 0 or not options.pg_timeout > 0:
        raise LaunchError(f"timeouts must be > 0 s, got {options.timeout:g} and {options.pg_timeout:g}: give "
                          "positive seconds")
    server, port = serve_store(options.host, options.pg_timeout)
    job = comm.Job(options.host, port, f"tessel/{secrets.token_hex(16)}", secrets.token_hex(32),
                   options.replicas)
    store = comm.Context(0, nprocs, torch.device("cpu"), PrefixStore(job.prefix, server),
                         timedelta(seconds=options.pg_timeout), bytes.fromhex(job.key))
    ctx = forkserver.context()
    procs = [ctx.Process(target=_worker, args=(r, nprocs, job, fn, tuple(args), options),
                         name=f"tessel-rank-{r}", daemon=True) for r in range(nprocs)]
    try:
        for p in procs:
            p.start()
        _supervise(procs, store, options)
    finally:
        # kill every survivor before waiting for any: a rank that saw a peer die would report it
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join()
    return _collect(procs, store)


def serve_store(host: str, timeout: float) -> tuple[Any, int]:
    """A TCPStore server listening on `host` only (torch's own listens on every address)."""
    listener = socket.create_server((host, 0), family=_family(host), backlog=128)
    port = listener.getsockname()[1]
    server = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout),
                      master_listen_fd=listener.detach(), use_libuv=True)
    return server, port


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _supervise(procs: list[Any], store: comm.Context, options: Options) -> None:
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


def _abort(store: comm.Context, message: str) -> None:
    store.abort(f"launcher|{message}")


def _rank(p: Any) -> int:
    return int(p.name.rsplit("-", 1)[1])


def _collect(procs: list[Any], store: comm.Context) -> list[Any]:
    if all(p.exitcode == 0 for p in procs):
        results = [store.read(f"result/{r}") for r in range(len(procs))]
        missing = [r for r, x in enumerate(results) if x is None]
        if missing:
            raise LaunchError(f"ranks {missing} finished without a signed result (another process wrote to the job's "
                              "store? run again)")
        try:
            return [wire.decode(x) for x in results if x is not None]
        except wire.WireError as e:
            raise LaunchError(f"a rank's result cannot be read: {e}; return JSON values, tuples or dataclasses "
                              "registered with tessel.runtime.wire.register") from None
    notes = []
    for r, p in enumerate(procs):
        note = store.read(f"error/{r}") or store.read(f"stopped/{r}")
        notes.append(note or (f"rank {r} exited with code {p.exitcode}" if p.exitcode else f"rank {r} finished"))
    first = notes[0]
    abort = store.aborted()
    if abort is not None:
        first = abort.partition("|")[2]
    raise LaunchError("\n".join([first] + [f"  {n}" for n in notes]))


def _worker(rank: int, world: int, job: comm.Job, fn: Callable[..., Any], args: tuple[Any, ...],
            options: Options) -> None:
    # the launcher handles a Ctrl-C to the process group; ranks end when it kills them or leaves
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if job.host in ("127.0.0.1", "localhost", "::1"):
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()
    torch.set_num_threads(options.threads)
    ctx = None
    try:
        ctx = comm.init(options.pg_timeout, options.backend, job)
        result = wire.encode(fn(ctx, *args))
        ctx.put(f"result/{rank}", result)
        # leave together, through the store: a collective here would time out on a slow peer
        ctx.where = "the end (waiting for the other ranks)"
        ctx.store.wait([f"result/{r}" for r in range(world)], timedelta(seconds=options.timeout))
    except BaseException as e:
        _fail(rank, ctx, job, options, e)
    os._exit(0)


def _loopback_interface() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names or not names else next((n for n in names if n.startswith("lo")), "lo")


def _fail(rank: int, ctx: comm.Context | None, job: comm.Job, options: Options, e: BaseException) -> None:
    """Report the failure and end the process at once (a clean exit could wait on peers)."""
    message = str(e) if str(e).startswith(f"rank {rank}:") else f"rank {rank}: {type(e).__name__}: {e}"
    try:
        if ctx is None:
            td = timedelta(seconds=options.pg_timeout)
            ctx = comm.Context(rank, 0, torch.device("cpu"),
                               comm.connect(job.host, job.port, job.prefix, td), td, bytes.fromhex(job.key),
                               global_rank=rank)
        note = ctx.aborted() or ""
        origin = note.partition("|")[0]
        if note and origin != str(rank):
            # a peer failed first and its exit broke our connection: ours is a consequence
            stop = comm.stop_note(rank, ctx.where, origin)
            log.error("%s", stop)
            ctx.put(f"stopped/{rank}", stop)
        else:
            log.error("%s\n%s", message, "".join(traceback.format_exception(e)[-6:]))
            ctx.put(f"error/{rank}", message)
            ctx.abort(f"{rank}|{message}")
    finally:
        os._exit(1)

