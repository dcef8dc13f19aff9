"""Standard output that a closed pipe cannot break.

`tessel search ... -o f.json | head -3`: `head` exits after three lines and the next print
raises BrokenPipeError. Were it to unwind the command, the schedule file written after the
summary would be lost. Instead, output to a closed pipe is dropped and the command goes on.
"""
from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any, TextIO


class _Stdout:
    """Wraps sys.stdout: the first broken pipe points the descriptor at /dev/null."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner
        self.broken = False

    def write(self, text: str) -> int:
        if self.broken:
            return len(text)
        try:
            return self._inner.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self._inner.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._inner.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class PipeSafe:
    """Context manager: sys.stdout ignores a closed pipe inside, and is flushed on the way out."""

    def __enter__(self) -> _Stdout:
        self._saved = sys.stdout
        self._out = _Stdout(sys.stdout)
        sys.stdout = self._out  # type: ignore[assignment,unused-ignore]
        return self._out

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._out.flush()
        sys.stdout = self._saved
