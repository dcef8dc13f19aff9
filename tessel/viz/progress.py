"""A live progress line for long searches: current phase, best period and makespan, elapsed time.

A search reports through a plain callable, `progress(update: dict)`, with keys such as `phase`,
`period`, `makespan`, `bound`, `status` and `elapsed` (any subset, any time; the line shows its
own clock, started when the line is entered). `ProgressLine` is
such a callable: on a terminal it keeps one rich line up to date; when stdout is not a terminal
(a pipe, a file, CI) it stays silent, so logs and piped tables are never polluted.

    with ProgressLine("search") as progress:
        schedule = search(placement, ..., progress=progress)
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from ..numeric import fmt

# shown in this order; any other key is appended as `key value`
KNOWN_KEYS = ("phase", "period", "makespan", "bound", "status")


def describe(state: Mapping[str, Any], elapsed: float) -> str:
    """The text of the line: `phase repetend  period 6  makespan 80  elapsed 1.2s`."""
    parts = [f"{k} {fmt(state[k])}" for k in KNOWN_KEYS if state.get(k) is not None]
    parts += [f"{k} {fmt(v)}" for k, v in state.items()
              if k not in KNOWN_KEYS and k != "elapsed" and v is not None]
    parts.append(f"elapsed {elapsed:.1f}s")
    return "  ".join(parts)


class ProgressLine:
    """Callable progress sink; a live line on a terminal, silent otherwise (see module doc)."""

    def __init__(self, label: str = "search", console: Console | None = None,
                 enabled: bool | None = None) -> None:
        self.label = label
        self.console = console or Console()
        self.enabled = self.console.is_terminal if enabled is None else enabled
        self.state: dict[str, Any] = {}
        self._t0 = time.monotonic()
        self._live: Live | None = None
        self._closed = False
        self._spinner = Spinner("dots")

    def __enter__(self) -> ProgressLine:
        self._t0 = time.monotonic()
        self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __call__(self, update: Mapping[str, Any]) -> None:
        # a new dict, not an update in place: the solver's thread calls this while the refresh
        # thread reads the state
        self.state = {**self.state, **update}
        self._start()

    def __rich__(self) -> Text:
        # rendered by Live's refresh thread: the elapsed time ticks between updates; one line,
        # cut to the terminal's width, since a wrapped line would leave stale rows behind
        text = Text.assemble(self._spinner.render(self.console.get_time()),
                             f" {self.label}  {self.line()}")
        text.truncate(max(1, self.console.width - 1), overflow="ellipsis")
        return text

    def line(self) -> str:
        """The current text, also when silent (callers may log it)."""
        return describe(self.state, time.monotonic() - self._t0)

    def _start(self) -> None:
        if self.enabled and self._live is None and not self._closed:
            # transient: the line disappears when done, the command's summary takes its place
            self._live = Live(self, console=self.console, refresh_per_second=8,
                              transient=True)
            self._live.start()

    def close(self) -> None:
        self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None
