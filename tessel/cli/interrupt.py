"""SIGINT and SIGTERM stop any command quickly, with one line and exit 130 / 143.

Python runs signal handlers on the main thread between bytecodes, which never happens while
the main thread sits inside a CP-SAT solve (C++). So the signal module also writes each
signal to a socket (`signal.set_wakeup_fd`); a watchdog thread reading it asks every running
solve to stop. The solve returns, the main thread runs the handler, and `Interrupted` unwinds
the command before it writes any output file.
"""
from __future__ import annotations

import select
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_REPEAT_S = 0.05  # a solve that was just starting when the signal came is stopped again
STOP_FOR_S = 3.0


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT or SIGTERM) asked the command to stop. A KeyboardInterrupt, so that
    `except Exception` does not swallow it and cleanup written for Ctrl-C runs for SIGTERM too."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


@contextmanager
def catch_signals() -> Iterator[None]:
    """Inside: SIGINT/SIGTERM raise Interrupted on the main thread and stop running solves."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if not fired:  # a second Ctrl-C while unwinding must not interrupt the cleanup
            fired.append(signum)
            raise Interrupted(signum)

    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    old = {s: signal.signal(s, handler) for s in SIGNALS}
    done = threading.Event()
    watchdog = threading.Thread(target=_watch, args=(reader, done), name="tessel-signals", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(old_fd)
        done.set()
        writer.close()
        watchdog.join(1.0)
        reader.close()


def _watch(reader: socket.socket, done: threading.Event) -> None:
    while not done.is_set():
        ready, _, _ = select.select([reader], [], [], 0.2)
        if not ready or done.is_set():
            continue
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return
        if any(b in SIGNALS for b in data):
            _stop_solves(done)


def _stop_solves(done: threading.Event) -> None:
    """Stop every solve for a while: one may be entering C++ just as the signal arrives."""
    # still being imported (a signal early in a loaded machine's start-up): no solve runs yet
    stop = getattr(sys.modules.get("tessel.search.solver"), "stop_all_solves", None)
    if stop is None:
        return
    for _ in range(int(STOP_FOR_S / STOP_REPEAT_S)):
        stop()
        if done.wait(STOP_REPEAT_S):
            return
