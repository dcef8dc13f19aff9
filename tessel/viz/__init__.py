"""Pictures of schedules: Gantt charts (PNG/SVG), Chrome/Perfetto traces, comparison charts,
and a live progress line for long searches.

Submodules load matplotlib or rich only when used: `from tessel.viz.gantt import plot_schedule`.
The names below are re-exported lazily for convenience.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"plot_schedule": "gantt", "gantt_figure": "gantt", "write_trace": "trace",
            "trace_events": "trace", "plot_comparison": "compare", "plot_scaling": "compare",
            "ProgressLine": "progress"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
