"""The torchrun environment a rank reads, checked before any work: one line naming the variable.

`tessel run` under torchrun reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
Left to torch, a missing or malformed one is a KeyError or ValueError traceback, and a store
address where nothing listens is a 20 s wait and a 66-line traceback. Here each is refused up
front as a UsageError, and the store is probed (a connect and a ping in the store's own protocol,
a few seconds at most: a listener that is not a torch store is refused, not waited on forever).
"""
from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import UsageError, quote

RANK_VARIABLES = ("RANK", "WORLD_SIZE")
MAX_WORLD = 2**20  # far beyond any job; keeps the arithmetic of ranks small
PROBE_SECONDS = 3.0  # how long a rank waits for its store to listen before refusing
MAX_HOST_CHARS = 253  # the longest DNS name


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world: int
    local_rank: int | None
    host: str
    port: int


def wants_torchrun(environ: Mapping[str, str]) -> bool:
    """True when the environment names a rank (torchrun's RANK and WORLD_SIZE); only one of them is
    a half-set environment, refused rather than silently ignored."""
    given = [v for v in RANK_VARIABLES if v in environ]
    if len(given) == 1:
        missing = next(v for v in RANK_VARIABLES if v not in environ)
        raise UsageError(f"environment: {given[0]} is set but {missing} is not (set both, as torchrun does, "
                         "or neither to launch locally)")
    return len(given) == 2


def check_torchrun_env(environ: Mapping[str, str], replicas: int = 1, probe: float | None = None) -> TorchrunEnv:
    """The rank's environment, or a UsageError naming the variable at fault. With `probe` > 0
    (default PROBE_SECONDS), waits up to that many seconds for something to listen at
    MASTER_ADDR:MASTER_PORT."""
    probe = PROBE_SECONDS if probe is None else probe
    world = _integer(environ, "WORLD_SIZE", 1, MAX_WORLD)
    rank = _integer(environ, "RANK", 0, world - 1, f"0..WORLD_SIZE-1 = 0..{world - 1}")
    local = _integer(environ, "LOCAL_RANK", 0, world - 1, f"0..WORLD_SIZE-1 = 0..{world - 1}") \
        if "LOCAL_RANK" in environ else None
    if world % replicas:
        raise UsageError(f"environment: WORLD_SIZE={world} processes do not split into --data-parallel "
                         f"{replicas} replicas")
    host = environ.get("MASTER_ADDR")
    if host is None:
        raise UsageError("environment: MASTER_ADDR is not set (the address of the job's store; torchrun sets it)")
    if not host or len(host) > MAX_HOST_CHARS or not host.isprintable() or not host.isascii() or " " in host:
        raise UsageError(f"environment: MASTER_ADDR must be a host name or address, got {quote(host)}")
    port = _integer(environ, "MASTER_PORT", 1, 65535)
    env = TorchrunEnv(rank, world, local, host, port)
    if probe > 0:
        _probe(env, probe)
    return env


def _integer(environ: Mapping[str, str], name: str, low: int, high: int, shown: str | None = None) -> int:
    text = environ.get(name)
    if text is None:
        raise UsageError(f"environment: {name} is not set")
    stripped = text.strip()
    value = int(stripped) if stripped.isascii() and stripped.isdigit() and len(stripped) <= 12 else None
    if value is None or not low <= value <= high:
        raise UsageError(f"environment: {name} must be an integer in {shown or f'{low}..{high}'}, got {quote(text)}")
    return value


def _probe(env: TorchrunEnv, seconds: float) -> None:
    """Refuse at once when no torch store answers at the store's address: connect and ping it as
    a TCPStore client does, retrying a refused connection briefly (the agent may be a moment
    behind its ranks). A listener that accepts but does not answer the ping (some networks accept
    a connection to anything) is refused too: torch's own client would wait for it forever."""
    deadline = time.monotonic() + seconds
    last = ""
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((env.host, env.port), timeout=max(0.1, min(1.0, left))) as conn:
                _ping(conn, env, max(0.5, deadline - time.monotonic()))
                return
        except socket.gaierror as e:
            raise UsageError(f"environment: MASTER_ADDR={quote(env.host)} does not resolve ({e.strerror or e})") \
                from None
        except OSError as e:
            last = e.strerror or str(e)
        if time.monotonic() + 0.2 >= deadline:
            break
        time.sleep(0.2)
    raise UsageError(f"environment: nothing listens at MASTER_ADDR:MASTER_PORT = {env.host}:{env.port} "
                     f"({last}; waited {seconds:g} s): start the job with torchrun, or unset RANK and WORLD_SIZE "
                     "to launch locally")


# torch's TCPStore wire protocol (c10d/TCPStoreBackend.hpp, both the libuv and the classic server):
# a client opens with VALIDATE and the magic number, then PING sends a nonce the store echoes
STORE_VALIDATE, STORE_PING, STORE_MAGIC = 0, 13, 0x3C85F7CE


def _ping(conn: socket.socket, env: TorchrunEnv, seconds: float) -> None:
    """The store's echo of a nonce within `seconds`, or a UsageError naming MASTER_ADDR/MASTER_PORT."""
    nonce = os.getpid() & 0xFFFFFFFF
    conn.settimeout(seconds)
    got = b""
    try:
        conn.sendall(bytes([STORE_VALIDATE]) + struct.pack("=I", STORE_MAGIC) + bytes([STORE_PING])
                     + struct.pack("=I", nonce))
        while len(got) < 4:
            chunk = conn.recv(4 - len(got))
            if not chunk:
                break
            got += chunk
    except TimeoutError:
        why = f"no answer to a store's ping within {seconds:.1f} s"
    except OSError as e:
        why = f"the connection failed at a store's ping: {e.strerror or e}"
    else:
        if len(got) == 4 and struct.unpack("=I", got)[0] == nonce:
            return
        why = "it closed the connection at a store's ping" if len(got) < 4 else "its answer to a store's ping is wrong"
    raise UsageError(f"environment: MASTER_ADDR:MASTER_PORT = {env.host}:{env.port} accepts connections but is not "
                     f"a torch store ({why}): point them at the job's store (torchrun sets both), or unset RANK and "
                     "WORLD_SIZE to launch locally")
