"""Nothing from the network is trusted: loopback store, signed notes, JSON results, no pickle."""
from __future__ import annotations

import os
import pickle
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from tessel.runtime import comm, wire
from tessel.runtime.launch import Options, launch, serve_store
from tessel.runtime.train import RankReport, StepReport

pytestmark = pytest.mark.torch

LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def _listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address hex, port) of every TCP socket in LISTEN state that one of `pids` holds."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                found = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
                if found:
                    inodes.add(found.group(1))
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                address, port = cols[1].split(":")
                out.append((address, int(port, 16)))
    return out


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [root], [root]
    while todo:
        for k in children.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _probe(ctx: comm.Context, launcher: int) -> dict[str, Any]:
    """Every rank up and connected; rank 1 forges an abort note; rank 0 reads the job's sockets."""
    dist.barrier()
    if ctx.global_rank == 1:
        ctx.store.set(comm.ABORT_KEY, "launcher|forged by someone who can reach the store")
    time.sleep(10 * comm.POLL_SECONDS)  # the watchers see the forged note, and must ignore it
    sockets = _listening(_tree(launcher)) if ctx.global_rank == 0 else []
    dist.barrier()
    return {"rank": ctx.global_rank, "sockets": sockets, "aborted": ctx.aborted()}


@pytest.mark.slow
def test_the_job_listens_on_loopback_only_and_ignores_forged_notes() -> None:
    out = launch(_probe, 4, (os.getpid(),), Options(timeout=120, pg_timeout=60))
    assert [o["rank"] for o in out] == [0, 1, 2, 3]  # every rank finished: the forged abort was ignored
    assert all(o["aborted"] is None for o in out)
    sockets = out[0]["sockets"]
    assert sockets, "the store and gloo listen somewhere"
    assert all(address in LOOPBACK for address, _ in sockets), sockets


def test_store_values_without_the_job_signature_are_ignored() -> None:
    server, port = serve_store("127.0.0.1", 10)
    assert [a for a, p in _listening([os.getpid()]) if p == port] == ["0100007F"]
    td = timedelta(seconds=10)
    key, prefix = os.urandom(32), "tessel/job"
    ctx = comm.Context(0, 1, torch.device("cpu"), PrefixStore(prefix, TCPStore("127.0.0.1", port, timeout=td)),
                       td, key)
    attacker = TCPStore("127.0.0.1", port, timeout=td)
    attacker.set(f"{prefix}/{comm.ABORT_KEY}", "launcher|stop everything")
    attacker.set(f"{prefix}/result/0", pickle.dumps(RankReport(0, (), ())))  # type: ignore[arg-type]
    assert ctx.store.check([comm.ABORT_KEY, "result/0"])  # the attacker wrote where the job reads
    assert ctx.aborted() is None and ctx.read("result/0") is None
    ctx.abort("0|a real failure")  # the forged note does not block the real one
    assert ctx.aborted() == "0|a real failure"
    ctx.put("result/0", wire.encode(7))
    assert ctx.read("result/0") == "7"
    stolen = attacker.get(f"{prefix}/result/0").decode()
    attacker.set(f"{prefix}/result/1", stolen)  # a signature is bound to its key name
    assert ctx.read("result/1") is None
    del server


def test_wire_round_trip_and_refusals() -> None:
    report = RankReport(1, ("f1",), (StepReport({"f1": 2.5}, 0.1, 3, None, float("inf"), 2, 1024),),
                        {"f1": 512}, ("x",), 1)
    assert wire.decode(wire.encode(report)) == report
    assert wire.decode(wire.encode({"a": (1, [2.0, None])})) == {"a": (1, [2.0, None])}
    with pytest.raises(wire.WireError, match="unknown type 'os.system'"):
        wire.decode('{"__tessel__": "os.system", "v": {}}')
    with pytest.raises(wire.WireError, match="RankReport has no fields"):
        wire.decode('{"__tessel__": "RankReport", "v": {"rank": 0, "__init__": 1}}')
    with pytest.raises(wire.WireError, match="cannot send a Tensor"):
        wire.encode(torch.zeros(1))


def test_no_runtime_module_unpickles() -> None:
    root = Path(__file__).resolve().parents[1] / "tessel"
    for path in [*root.joinpath("runtime").glob("*.py"), root / "cli" / "runtime.py"]:
        text = path.read_text()
        for call in ("pickle.load", "all_gather_object", "broadcast_object_list", "gather_object",
                     "recv_object_list", "torch.load("):
            assert call not in text, f"{path.name} uses {call}"


def _collectives(ctx: comm.Context) -> dict[str, Any]:
    shared = comm.share(ctx, b"schedule bytes" if ctx.global_rank == 0 else None)
    same = comm.same_everywhere(ctx, b"\x01" * 32)
    differ = comm.same_everywhere(ctx, bytes([ctx.global_rank]) * 32)
    gathered = comm.gather_bytes(ctx, f"rank {ctx.rank} of replica {ctx.replica}".encode())
    grad = torch.full((3,), float(ctx.replica + 1))
    ctx.all_reduce_mean([grad])
    return {"shared": shared.decode(), "same": same, "differ": differ,
            "gathered": [g.decode() for g in gathered], "grad": grad.tolist(),
            "ranks": (ctx.global_rank, ctx.rank, ctx.replica, ctx.world)}


@pytest.mark.slow
def test_collectives_across_pipelines_and_replicas() -> None:
    out = launch(_collectives, 4, (), Options(timeout=120, pg_timeout=60, replicas=2))
    assert [o["ranks"] for o in out] == [(0, 0, 0, 2), (1, 1, 0, 2), (2, 0, 1, 2), (3, 1, 1, 2)]
    assert all(o["shared"] == "schedule bytes" and o["same"] and not o["differ"] for o in out)
    assert out[3]["gathered"] == ["rank 0 of replica 1", "rank 1 of replica 1"]
    assert all(o["grad"] == [1.5, 1.5, 1.5] for o in out)


def test_the_torchrun_probe_accepts_a_real_store_of_either_server() -> None:
    """tessel.cli.environ pings the store in torch's own protocol: both TCPStore servers (libuv,
    the default, and the classic one) answer; a bare listener does not (tests/test_fuzz_cli.py)."""
    from tessel.cli.environ import TorchrunEnv, check_torchrun_env
    for libuv in (True, False):
        server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10),
                          use_libuv=libuv)
        env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port)}
        assert check_torchrun_env(env, probe=2.0) == TorchrunEnv(1, 2, None, "127.0.0.1", server.port)
        server.set("after", "probe")  # the store still serves its clients after the probe's ping
        client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))
        assert client.get("after") == b"probe"
