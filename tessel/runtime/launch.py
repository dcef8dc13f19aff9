"""Local launcher: N worker processes on this machine, one rendezvous store, nothing left hanging.

The launcher hosts the job's store (as torchrun's agent does) so the store outlives any worker;
workers report their result or their failure through it. The first failure (an exception, a
crash, or the job timeout) is written as the abort note every worker watches (see comm.py);
workers still alive after a grace period are killed, and so is every worker when the launcher is
interrupted (any exception, KeyboardInterrupt included). A worker whose launcher vanished (killed
outright) loses the store and ends itself (comm's watcher).

Security: the store listens on the address asked for only (loopback by default: the socket is
bound here and handed to the store), its keys live under a random namespace and hidden names, and
every value in it, gloo's rendezvous records included, is signed with a per-job random key that
reaches the workers only through their spawn arguments (`signed.SignedStore`). Each worker sends
its result or its reason for failing through its own pipe to the launcher (no size limit, out of
other processes' reach), as JSON (`wire`), never pickled; gloo binds to the loopback interface for
a loopback job.

Size: `forkserver.capacity` refuses, before any process starts, more ranks than the machine can hold (cores
and available memory; `Options.oversubscribe` overrides).
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

from ..errors import ExecutionError, TesselError
from ..errors import LaunchError as LaunchError
from . import comm, forkserver, wire
from .signed import SignedStore

log = logging.getLogger(__name__)
GRACE_SECONDS = 5.0
# a rank whose connection a peer's end closed waits for the note that names the failure (the peer's,
# or the launcher's once it sees the exit) at most this long: the launcher kills every survivor
# GRACE_SECONDS after the first failure it sees, so a note not written by then is not coming (under
# torchrun, whose agent writes none for a crash, the rank's own error leads, that much later)
NOTE_WAIT = GRACE_SECONDS
# what gloo and the store say when the other end went away: a consequence, not a reason
PEER_GONE = ("connection closed", "connection reset", "broken pipe", "end of file")
MAX_MESSAGE = 2**31 - 1   # most bytes one rank's report may take through its pipe


@dataclass(frozen=True)
class Options:
    timeout: float = 300.0      # the whole job
    pg_timeout: float = 60.0    # any one collective or receive
    backend: str | None = None  # gloo on CPU, nccl with CUDA
    threads: int = 1            # torch threads per worker
    host: str = "127.0.0.1"     # the address the store listens on
    replicas: int = 1           # data-parallel replicas (nprocs = replicas x pipeline ranks)
    oversubscribe: bool = False  # start more processes than the machine's cores and memory hold


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
    if not options.oversubscribe:
        forkserver.capacity(nprocs)
    server, port = serve_store(options.host, options.pg_timeout)
    job = comm.Job(options.host, port, f"tessel/{secrets.token_hex(16)}", secrets.token_hex(32),
                   options.replicas)
    key = bytes.fromhex(job.key)
    store = comm.Context(0, nprocs, torch.device("cpu"), SignedStore(PrefixStore(job.prefix, server), key),
                         timedelta(seconds=options.pg_timeout), key)
    ctx = forkserver.context()
    pipes = [ctx.Pipe(duplex=False) for _ in range(nprocs)]
    procs = [ctx.Process(target=_worker, args=(r, nprocs, job, fn, tuple(args), options, pipes[r][1]),
                         name=f"tessel-rank-{r}", daemon=True) for r in range(nprocs)]
    inbox = _Inbox({pipes[r][0]: r for r in range(nprocs)})
    try:
        for p, (_, send) in zip(procs, pipes):
            p.start()
            send.close()  # the worker holds the only writing end: its exit ends the pipe
        _supervise(procs, store, options, inbox)
    finally:
        # kill every survivor before waiting for any: a rank that saw a peer die would report it
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join()
        for _, send in pipes:
            send.close()  # those of ranks that never started
        inbox.drain()
    return _collect(procs, store, inbox)


class _Inbox:
    """What the workers send through their pipes: each rank's result, and the failures in the
    order they arrived (the first is the job's reason)."""

    def __init__(self, readers: dict[Any, int]) -> None:
        self.readers = readers
        self.results: dict[int, str] = {}
        self.notes: dict[int, str] = {}
        self.errors: list[str] = []

    def receive(self, conn: Any) -> None:
        rank = self.readers.pop(conn)
        try:
            data = conn.recv_bytes(MAX_MESSAGE)
        except (EOFError, OSError):  # the worker ended: nothing more from it
            conn.close()
            return
        self.readers[conn] = rank
        try:
            msg = wire.decode(data.decode())
            kind, text = msg["kind"], msg["text"]
        except (UnicodeDecodeError, wire.WireError, KeyError, TypeError):
            self.notes.setdefault(rank, f"rank {rank} sent a message that cannot be read")
            return
        if kind == "result":
            self.results[rank] = text
        elif kind == "error":
            self.notes[rank] = text
            self.errors.append(text)
        else:
            self.notes.setdefault(rank, text)

    def drain(self) -> None:
        """Read what the (now ended) workers left in their pipes."""
        while self.readers:
            ready = mp.connection.wait(list(self.readers), timeout=1.0)
            if not ready:
                break
            for conn in ready:
                self.receive(conn)
        for conn in list(self.readers):
            conn.close()
        self.readers.clear()


def serve_store(host: str, timeout: float) -> tuple[Any, int]:
    """A TCPStore server listening on `host` only (torch's own listens on every address)."""
    listener = socket.create_server((host, 0), family=_family(host), backlog=128)
    port = listener.getsockname()[1]
    server = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout),
                      master_listen_fd=listener.detach(), use_libuv=True)
    return server, port


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _supervise(procs: list[Any], store: comm.Context, options: Options, inbox: _Inbox) -> None:
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
        for s in mp.connection.wait(list(running) + list(inbox.readers), timeout=limit - now):
            if s in inbox.readers:
                inbox.receive(s)
                continue
            p = running.pop(s)
            p.join()
            if p.exitcode != 0 and failed_at is None:
                failed_at = time.monotonic()
                _abort(store, _exit_note(p))


def _exit_note(p: Any) -> str:
    """A rank's exit, or the fork server's death: its workers' statuses come through it, and it
    reports 255 for every rank it can no longer see (they may well be running)."""
    if p.exitcode == 255 and _fork_server_died():
        return f"the fork server ended (killed?); rank {_rank(p)}'s exit status is unknown"
    return f"rank {_rank(p)} exited with code {p.exitcode}"


def _fork_server_died(wait: float = 1.0) -> bool:
    """Whether the fork server is gone; its workers' pipes close a moment before it shows as dead."""
    deadline = time.monotonic() + wait
    while forkserver.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _abort(store: comm.Context, message: str) -> None:
    store.abort(f"launcher|{message}")


def _rank(p: Any) -> int:
    return int(p.name.rsplit("-", 1)[1])


def _collect(procs: list[Any], store: comm.Context, inbox: _Inbox) -> list[Any]:
    abort = store.aborted()
    origin, _, message = (abort or "").partition("|")
    # a job the launcher stopped (its timeout passed) failed, though every rank may have finished
    # before it saw the note: a time limit is a wall clock, not a hint the ranks may miss
    if all(p.exitcode == 0 for p in procs) and origin != "launcher":
        missing = [r for r in range(len(procs)) if r not in inbox.results]
        if missing:
            raise LaunchError(f"ranks {missing} finished without sending a result (see their messages above; run again)")
        try:
            return [wire.decode(inbox.results[r]) for r in range(len(procs))]
        except wire.WireError as e:
            raise LaunchError(f"a rank's result cannot be read: {e}; return JSON values, tuples or dataclasses "
                              "registered with tessel.runtime.wire.register") from None
    notes = []
    for r, p in enumerate(procs):
        note = inbox.notes.get(r)
        notes.append(note or (_exit_note(p) if p.exitcode else f"rank {r} finished"))
    # a rank's own reason leads, one that is not a peer gone before a consequence (the two race to
    # the pipe); the launcher's (a timeout, an exit code) only when no rank gave one
    first = next((e for e in inbox.errors if not _says_peer_gone(e)), inbox.errors[0]) if inbox.errors else None
    if first is None:
        first = message if origin == "launcher" else next(
            (_exit_note(p) for p in procs if p.exitcode), notes[0])
    raise LaunchError("\n".join([first] + [f"  {n}" for n in notes]))


def _worker(rank: int, world: int, job: comm.Job, fn: Callable[..., Any], args: tuple[Any, ...],
            options: Options, outbox: Any) -> None:
    # the launcher handles a Ctrl-C to the process group; ranks end when it kills them or leaves
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if job.host in ("127.0.0.1", "localhost", "::1"):
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()
    torch.set_num_threads(options.threads)
    ctx = None
    try:
        ctx = comm.init(options.pg_timeout, options.backend, job, outbox=outbox)
        result = wire.encode(fn(ctx, *args))
        ctx.tell("result", result)
        # leave together, through the store: a collective here would time out on a slow peer
        ctx.where = "the end (waiting for the other ranks)"
        ctx.put(f"done/{rank}", "1")
        ctx.store.wait([f"done/{r}" for r in range(world)], timedelta(seconds=options.timeout))
    except BaseException as e:
        _fail(rank, ctx, job, options, e, outbox)
    os._exit(0)


def _awaited_note(ctx: comm.Context, e: BaseException) -> str:
    """The abort note; when `e` says a peer's end closed the connection and there is none yet,
    the note that peer's failure brings (its own, or the launcher's when it sees the exit),
    waited for on the wall clock (NOTE_WAIT at most), not a guess of how long it takes: on a
    loaded machine the launcher may take over a second to run."""
    note = ctx.aborted() or ""
    if note or not peer_gone(e):
        return note
    deadline = time.monotonic() + NOTE_WAIT
    while not note and time.monotonic() < deadline:
        time.sleep(comm.POLL_SECONDS)
        note = ctx.aborted() or ""
    return note


def peer_gone(e: BaseException) -> bool:
    """Whether `e` says the other end of a connection went away (its cause is elsewhere); an
    instruction's failure is judged by the error it wraps (gloo's, when a peer's exit cut it off)."""
    while isinstance(e, ExecutionError) and e.__cause__ is not None:
        e = e.__cause__
    if isinstance(e, TesselError):
        return False
    return isinstance(e, ConnectionError) or _says_peer_gone(str(e))


def _says_peer_gone(text: str) -> bool:
    return any(s in text.lower() for s in PEER_GONE)


def _loopback_interface() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names or not names else next((n for n in names if n.startswith("lo")), "lo")


def _fail(rank: int, ctx: comm.Context | None, job: comm.Job, options: Options, e: BaseException,
          outbox: Any) -> None:
    """Report the failure and end the process at once (a clean exit could wait on peers)."""
    text = str(e).splitlines()[0] if str(e).strip() else ""
    message = text if text.startswith(f"rank {rank}:") else f"rank {rank}: {type(e).__name__}: {text}"
    told = False
    try:
        if ctx is None:
            td = timedelta(seconds=options.pg_timeout)
            key = bytes.fromhex(job.key)
            ctx = comm.Context(rank, 0, torch.device("cpu"),
                               SignedStore(comm.connect(job.host, job.port, job.prefix, td), key), td, key,
                               global_rank=rank, outbox=outbox)
        note = _awaited_note(ctx, e)
        origin = note.partition("|")[0]
        if note and origin != str(rank):
            # a peer failed first and its exit broke our connection: ours is a consequence
            stop = comm.stop_note(rank, ctx.where, origin)
            log.error("%s", stop)
            ctx.tell("stopped", stop)
        else:
            # a TesselError (a forged store value, bad input) is its message; anything else a bug
            trace = "" if isinstance(e, TesselError) else "\n" + "".join(traceback.format_exception(e)[-6:])
            log.error("%s%s", message, trace)
            ctx.tell("error", message)
            told = True
            ctx.abort(f"{rank}|{message}")
    except BaseException:
        # the store may be what failed: the reason still reaches the launcher through the pipe
        if not told:
            try:
                outbox.send_bytes(wire.encode({"kind": "error", "text": message}).encode())
            except BaseException:
                pass
    finally:
        os._exit(1)
