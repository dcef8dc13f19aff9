"""Process set-up for the runtime: init, sub-groups, data-parallel replicas, stopping every rank when one fails.

A failing rank writes an abort note into the job's store (hosted by the launcher, or by torchrun's
agent). Every rank runs a watcher thread that polls for that note; a rank blocked in a receive or
a collective cannot be interrupted from Python, so the watcher writes where that rank stood, says
why it stops and ends the process. The process-group timeout bounds any wait even when no note
comes (a peer that vanished); a store that stops answering means the launcher is gone, and the
rank ends too.

Trust: everything the runtime itself writes into the store (notes) is text signed with a per-job
random key (HMAC-SHA256); a note whose signature does not verify is ignored, and logged once per
key. The key reaches local workers through their spawn arguments (never the network); there the
whole store is a `signed.SignedStore`, gloo's rendezvous records included, and the watcher also
stops the job when a key this rank wrote is deleted. Under torchrun rank 0 draws the key and
broadcasts it over the process group (the rendezvous is torchrun's). Nothing read from the store
is unpickled. A local worker reports its result or failure through its own pipe to the launcher
(`outbox`), which no other process can reach.

Data parallelism: with `replicas` R, the W ranks form R pipelines of W / R ranks. Rank g is
pipeline rank g % (W / R) of replica g // (W / R); the default process group is the replica's
pipeline (so the executor's ranks are pipeline ranks), and `Context.dp` all-reduces across the
replicas of one pipeline rank.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore

from ..errors import LaunchError
from .signed import SignedStore, StoreError

log = logging.getLogger(__name__)

ABORT_KEY = "abort"
POLL_SECONDS = 0.1
LOST_POLLS = 20  # consecutive failed polls (2 s) before a rank decides its store is gone


@dataclass(frozen=True)
class Job:
    """How a local worker reaches its launcher's store: address, namespace, signing key (hex)."""
    host: str
    port: int
    prefix: str
    key: str
    replicas: int = 1


@dataclass
class Context:
    """One worker process: its pipeline rank, device and store; `where` says what it is doing now."""
    rank: int            # rank in its pipeline (the placement's device)
    world: int           # ranks per pipeline (the placement's device count)
    device: torch.device
    store: Any           # the job's store (shared by every replica), namespaced
    timeout: timedelta
    key: bytes = b""
    global_rank: int = 0
    replica: int = 0
    replicas: int = 1
    dp: Any = None       # process group over the replicas of this pipeline rank (None with one replica)
    where: str = "start-up"
    groups: dict[tuple[int, ...], Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    watcher: threading.Thread | None = None
    outbox: Any = None   # a local worker's pipe to its launcher (multiprocessing Connection)
    warned: set[str] = field(default_factory=set)  # keys already logged as forged
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, name: str, text: str) -> None:
        """Write a signed note."""
        self.store.set(name, sign(self.key, name, text))

    def read(self, name: str) -> str | None:
        """A note if present and signed by this job, else None (a forged one is logged once)."""
        try:
            if not self.store.check([name]):
                return None
            text = verify(self.key, name, self.store.get(name))
        except StoreError:
            text = None
        if text is None and name not in self.warned:
            self.warned.add(name)
            log.warning("ignored a store value %r without this job's signature (logged once)", name)
        return text

    def tell(self, kind: str, text: str) -> None:
        """Report `kind` (result, error, stopped) to the launcher: through the pipe when there is
        one (no size limit, out of other processes' reach), else as a signed note."""
        if self.outbox is None:
            self.put(f"{kind}/{self.global_rank}", text)
            return
        from . import wire
        with self.lock:
            self.outbox.send_bytes(wire.encode({"kind": kind, "text": text}).encode())

    def aborted(self) -> str | None:
        return self.read(ABORT_KEY)

    def abort(self, note: str) -> None:
        """Write the abort note unless one is there (the first failure wins; a forged one does not)."""
        value = sign(self.key, ABORT_KEY, note)
        try:
            current = self.store.compare_set(ABORT_KEY, "", value)
        except StoreError:  # a forged value sits there
            current = b""
        if current != value.encode() and verify(self.key, ABORT_KEY, current) is None:
            self.store.set(ABORT_KEY, value)

    def group(self, devices: tuple[int, ...]) -> Any:
        return self.groups[tuple(sorted(devices))]

    def all_reduce_mean(self, tensors: list[torch.Tensor]) -> None:
        """Average tensors across the replicas (in place); nothing with one replica."""
        if self.dp is None:
            return
        for t in tensors:
            self.dp.allreduce([t]).wait()
            t.div_(self.replicas)


def sign(key: bytes, name: str, text: str) -> str:
    mac = hmac.new(key, f"{name}\0{text}".encode(), hashlib.sha256).hexdigest()
    return f"{mac}|{text}"


def verify(key: bytes, name: str, value: bytes) -> str | None:
    """The text of a signed note, or None (any bytes at all: compared as bytes, never decoded first)."""
    mac, sep, text = bytes(value).partition(b"|")
    good = hmac.new(key, name.encode() + b"\0" + text, hashlib.sha256).hexdigest().encode()
    if not sep or not hmac.compare_digest(mac, good):
        return None
    try:
        return text.decode()
    except UnicodeDecodeError:
        return None


def connect(host: str, port: int, prefix: str, timeout: timedelta) -> Any:
    """A client of the store at host:port, seeing only the keys under `prefix`."""
    tcp = TCPStore(host, port, is_master=False, timeout=timeout)
    return PrefixStore(prefix, tcp)


def init(timeout: float = 60.0, backend: str | None = None, job: Job | None = None,
         replicas: int = 1, outbox: Any = None) -> Context:
    """Join the job: a local launcher's (`job`, reporting through `outbox`), or the one the
    environment describes (torchrun). A local job's watcher starts before the rendezvous: a
    record deleted there stops the job instead of leaving its readers waiting."""
    grank, gworld = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    replicas = job.replicas if job is not None else replicas
    if replicas < 1 or gworld % replicas:
        raise LaunchError(f"{gworld} processes do not split into {replicas} data-parallel replicas: start a "
                          f"multiple of {replicas} processes")
    world = gworld // replicas
    replica, rank = divmod(grank, world)
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = _device(backend, grank)
    td = timedelta(seconds=timeout)
    if job is not None:
        store = SignedStore(connect(job.host, job.port, job.prefix, td), bytes.fromhex(job.key))
    else:
        store = connect(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), "tessel", td)
    ctx = Context(rank, world, device, store, td, b"", grank, replica, replicas, outbox=outbox)
    if job is not None:
        ctx.key = bytes.fromhex(job.key)
        _start_watcher(ctx)
    dist.init_process_group(backend, store=PrefixStore(f"replica{replica}", store), rank=rank,
                            world_size=world, timeout=td)
    ctx.dp = _replica_group(backend, PrefixStore(f"dp{rank}", store), replica, replicas, td)
    if job is None:
        ctx.key = _shared_key(device, grank, ctx.dp)
        _start_watcher(ctx)
    return ctx


def _start_watcher(ctx: Context) -> None:
    ctx.watcher = threading.Thread(target=_watch, args=(ctx,), name="tessel-abort-watcher", daemon=True)
    ctx.watcher.start()


def _device(backend: str, grank: int) -> torch.device:
    if backend != "nccl":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", grank)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def _shared_key(device: torch.device, grank: int, dp: Any) -> bytes:
    """Global rank 0 draws the job key; every rank gets it over its pipeline and replica groups."""
    buf = torch.zeros(16, dtype=torch.int64, device=device)
    if grank == 0:
        buf.copy_(torch.tensor(list(secrets.token_bytes(16)), dtype=torch.int64))
    dist.all_reduce(buf)  # a sum where one rank holds the key and the others zeros
    if dp is not None:
        dp.allreduce([buf]).wait()
    return bytes(buf.cpu().tolist())


def _replica_group(backend: str, store: Any, replica: int, replicas: int, td: timedelta) -> Any:
    if replicas == 1:
        return None
    if backend == "nccl":
        from torch._C._distributed_c10d import ProcessGroupNCCL
        return ProcessGroupNCCL(store, replica, replicas, ProcessGroupNCCL.Options())
    return ProcessGroupGloo(store, replica, replicas, td)


def _sum_everywhere(ctx: Context, t: torch.Tensor) -> torch.Tensor:
    """Sum over every rank of the job (the pipeline, then the replicas)."""
    dist.all_reduce(t)
    if ctx.dp is not None:
        ctx.dp.allreduce([t]).wait()
    return t


def share(ctx: Context, data: bytes | None) -> bytes:
    """Global rank 0's bytes, on every rank (a collective; the other ranks pass None)."""
    mine = data if ctx.global_rank == 0 else b""
    if ctx.global_rank == 0 and data is None:
        raise LaunchError("global rank 0 must give the bytes to share (a bug in the caller: please report it)")
    n = int(_sum_everywhere(ctx, torch.tensor([len(mine or b"")], dtype=torch.int64, device=ctx.device)))
    buf = torch.zeros(n, dtype=torch.int32, device=ctx.device)
    if mine:
        buf.copy_(torch.tensor(list(mine), dtype=torch.int32))
    return bytes(_sum_everywhere(ctx, buf).cpu().tolist())


def same_everywhere(ctx: Context, digest: bytes) -> bool:
    """Whether every rank of the job passed the same digest (a collective)."""
    mine = torch.tensor(list(digest), dtype=torch.int64, device=ctx.device)
    low, high = mine.clone(), mine.clone()
    for t, op in ((low, dist.ReduceOp.MIN), (high, dist.ReduceOp.MAX)):
        dist.all_reduce(t, op)
        if ctx.dp is not None:
            _dp_reduce(ctx, t, op)
    return bool(torch.equal(low, mine) and torch.equal(high, mine))


def _dp_reduce(ctx: Context, t: torch.Tensor, op: Any) -> None:
    from torch._C._distributed_c10d import AllreduceOptions
    opts = AllreduceOptions()
    opts.reduceOp = op
    ctx.dp.allreduce([t], opts).wait()


def gather_bytes(ctx: Context, data: bytes) -> list[bytes]:
    """Every pipeline rank's bytes, in rank order, on every rank of the pipeline (a collective)."""
    n = torch.tensor([len(data)], dtype=torch.int64, device=ctx.device)
    sizes = [torch.zeros_like(n) for _ in range(ctx.world)]
    dist.all_gather(sizes, n)
    most = max(int(s) for s in sizes)
    buf = torch.zeros(most, dtype=torch.uint8, device=ctx.device)
    buf[:len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    parts = [torch.zeros_like(buf) for _ in range(ctx.world)]
    dist.all_gather(parts, buf)
    return [bytes(p[:int(s)].cpu().tolist()) for p, s in zip(parts, sizes)]


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
    lost = 0
    while not ctx.done.wait(POLL_SECONDS):
        try:
            note = ctx.aborted()
            gone = ctx.store.missing() if isinstance(ctx.store, SignedStore) else []
            lost = 0
        except Exception:
            lost += 1
            if lost >= LOST_POLLS:  # the store is gone: so is the launcher (or torchrun's agent)
                log.error("rank %d stopped at %s: its job's store is gone", ctx.global_rank, ctx.where)
                os._exit(1)
            continue
        if gone:
            _tampered(ctx, gone)
        if note is None:
            continue
        origin, _, message = note.partition("|")
        if origin == str(ctx.global_rank):
            return
        stop = stop_note(ctx.global_rank, ctx.where, origin)
        try:
            ctx.tell("stopped", stop)
        except Exception:
            pass
        log.error("%s: %s", stop, message)
        os._exit(1)


def _tampered(ctx: Context, gone: list[str]) -> None:
    """A key this rank wrote was deleted from outside: its readers would wait for it until the
    timeout, so the job stops now, naming it."""
    message = (f"rank {ctx.global_rank}: store key {gone[0]!r} (written by this rank) was deleted by "
               f"a process outside the job; stopping at {ctx.where}")
    log.error("%s", message)
    try:
        ctx.tell("error", message)
        ctx.abort(f"{ctx.global_rank}|{message}")
    except Exception:
        pass
    os._exit(1)


def stop_note(rank: int, where: str, origin: str) -> str:
    """What a rank that stops because of another one's failure reports."""
    cause = "the launcher stopped the job" if origin == "launcher" else f"rank {origin} failed"
    return f"rank {rank} stopped at {where}: {cause}"
