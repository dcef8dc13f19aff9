"""A store wrapper that trusts nobody: every key name hidden, every value signed, deletions noticed.

A local job's store listens on loopback, where any process of the machine can connect. Through
`SignedStore` every value the job writes, gloo's own rendezvous records (each rank's address)
included, carries an HMAC-SHA256 over its key name and bytes, under the per-job secret the
launcher hands its workers through their spawn arguments (never the network). A value that does
not verify (forged, rewritten, moved from another key, not ASCII, cut short) raises `StoreError`
naming the key before gloo sees it, so no rank ever connects to an address the job did not write.
Key names are stored as keyed hashes: `list_keys` shows opaque hex, not which record is whose.
A key this process wrote and did not delete that disappears is reported by `missing()` (the
abort watcher polls it), so a deleted record stops the job with its name instead of a stall.

torch calls these methods from C++ (the `Store` trampoline) for gloo's rendezvous: they take
and return bytes, and may run on several threads (a lock guards the bookkeeping).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import Store

from ..errors import TesselError, quote

MAC_HEX = 64  # hex digits of an HMAC-SHA256
NAME_HEX = 32  # hex digits of a hidden key name (128 bits)
ABSENT = b"\0absent"  # never a sealed value (those start with hex digits)


class StoreError(TesselError):
    """A store value the job did not write (forged, rewritten, deleted); the message names the key."""


class SignedStore(Store):
    """`inner` seen through hidden names and signed values (see the module docstring)."""

    def __init__(self, inner: Any, key: bytes) -> None:
        super().__init__()
        if len(key) < 16:
            raise StoreError("a job key has at least 16 bytes: give the launcher's secret")
        self.inner, self._key = inner, key
        self._written: dict[str, str] = {}  # key -> hidden name, of what this process wrote
        self._lock = threading.Lock()

    # ---- the naming and the seal ----------------------------------------------------------------
    def hidden(self, key: str) -> str:
        return hmac.new(self._key, b"name\0" + key.encode(), hashlib.sha256).hexdigest()[:NAME_HEX]

    def _seal(self, key: str, value: bytes) -> bytes:
        mac = hmac.new(self._key, key.encode() + b"\0" + value, hashlib.sha256).hexdigest()
        return mac.encode() + b"|" + value

    def _open(self, key: str, raw: bytes) -> bytes:
        raw = bytes(raw)
        value = raw[MAC_HEX + 1:]
        if raw[MAC_HEX:MAC_HEX + 1] != b"|" or not hmac.compare_digest(raw[:MAC_HEX], self._seal(key, value)[:MAC_HEX]):
            raise StoreError(f"store key {quote(key)}: its value was not written by this job "
                             f"(forged or rewritten by another process; {len(raw)} bytes)")
        return value

    def _wrote(self, key: str) -> None:
        with self._lock:
            self._written[key] = self.hidden(key)

    # ---- the Store interface ----------------------------------------------------------------------
    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self.inner.set(self.hidden(key), self._seal(key, data))
        self._wrote(key)

    def get(self, key: str) -> bytes:
        """The value, once the key exists; a key deleted meanwhile is an error naming it."""
        self.wait([key])
        # a compare that never matches reads without blocking: a missing key answers ABSENT
        raw = bytes(self.inner.compare_set(self.hidden(key), ABSENT, ABSENT))
        if raw == ABSENT:
            raise StoreError(f"store key {quote(key)}: deleted by another process before this rank read it")
        return self._open(key, raw)

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check([self.hidden(k) for k in keys]))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Poll rather than block in the store: torch's wait holds the GIL while it blocks (called
        from gloo's rendezvous), and the abort watcher must run meanwhile."""
        names = [self.hidden(k) for k in keys]
        limit = (timeout or self.inner.timeout).total_seconds()
        deadline, pause = time.monotonic() + limit, 0.002
        while not self.inner.check(names):
            if time.monotonic() >= deadline:
                missing = [k for k, n in zip(keys, names) if not self.inner.check([n])]
                raise StoreError(f"store key {quote(missing[0] if missing else keys[0])}: not written "
                                 f"within {limit:g} s")
            time.sleep(pause)
            pause = min(2 * pause, 0.05)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        exp = expected.encode() if isinstance(expected, str) else bytes(expected)
        want = self._seal(key, desired.encode() if isinstance(desired, str) else bytes(desired))
        got = bytes(self.inner.compare_set(self.hidden(key), self._seal(key, exp) if exp else b"", want))
        if got == want:
            self._wrote(key)
        return self._open(key, got)

    def add(self, key: str, amount: int) -> int:
        """A signed counter, by compare-and-set (a plain `add` would store an unsigned integer).
        Each value carries a nonce, so that a write can tell its own value from an equal one."""
        name, current = self.hidden(key), b""
        while True:
            count = int(self._open(key, current).split(b":")[0]) if current else 0
            want = self._seal(key, f"{count + amount}:{secrets.token_hex(8)}".encode())
            got = bytes(self.inner.compare_set(name, current, want))
            if got == want:
                self._wrote(key)
                return count + amount
            # torch's stores answer a compare on a missing key with the expected value: deleted
            # between two tries, the count starts again from nothing
            current = b"" if got == current else got

    def delete_key(self, key: str) -> bool:
        with self._lock:
            self._written.pop(key, None)
        return bool(self.inner.delete_key(self.hidden(key)))

    def num_keys(self) -> int:
        return int(self.inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def list_keys(self) -> list[str]:
        raise StoreError("the job's store does not list its keys")

    # ---- deletions --------------------------------------------------------------------------------
    def missing(self) -> list[str]:
        """Keys this process wrote, did not delete, and that are gone (one store call when none is)."""
        with self._lock:
            written = dict(self._written)
        if not written or self.inner.check(list(written.values())):
            return []
        return sorted(k for k, name in written.items() if not self.inner.check([name]))
