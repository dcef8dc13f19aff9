"""The one family of library errors: bad input or a request that cannot be met.

Everything the library raises on purpose is a `TesselError`; the CLI prints it as one line and
exits 2. Any other exception is a bug (traceback, exit 1). `TesselError` is a ValueError so that
callers written against the older, separate error classes keep working.
"""
from __future__ import annotations

import reprlib

QUOTE_CHARS = 200  # most characters of user input an error message repeats


class TesselError(ValueError):
    """Bad input, or a request the library cannot meet; the message names the culprit."""


class UsageError(TesselError):
    """Bad command-line or call arguments (an option out of range, options that do not go together)."""


class LimitError(TesselError):
    """Input beyond a size the library accepts (document size or depth, devices, blocks, tasks)."""


class OutputError(TesselError):
    """An output file that cannot be written as asked (missing directory, read-only file)."""


class PlacementError(TesselError):
    """A placement that breaks a rule of FORMAT.md; the message names the culprit."""


class ScheduleError(TesselError):
    """A schedule that breaks a rule or cannot be built; `rule` is the rule number of FORMAT.md
    (0: a malformed document or a request that cannot be met, no rule broken)."""

    def __init__(self, message: str, rule: int = 0) -> None:
        super().__init__(message)
        self.rule = rule


class SearchError(TesselError):
    """A search or baseline that finds no schedule for the placement and limits given."""


# ---- the runtime's errors ---------------------------------------------------------------------------
# Defined here, torch-free, so the CLI and callers can catch them without importing torch; each
# module of tessel.runtime re-exports its own (`tessel.runtime.pipeline.PipelineError`, ...). Those
# that were a TypeError or RuntimeError before joining the family still are one.


class PipelineError(TesselError):
    """A `Pipeline` that cannot be built or run as given; the message names the block or batch field
    and what was expected."""


class SplitError(TesselError):
    """A model that cannot be cut as asked; the message names the part or module to change."""


class CheckpointError(TesselError):
    """A checkpoint that cannot be written or read as asked; the message names the entry or path."""


class WireError(TesselError):
    """A value that cannot cross processes, or a document this job did not write."""


class PackError(TesselError, TypeError):
    """A block output that cannot travel between blocks (a leaf that is not a tensor, an odd dtype)."""


class ExecutionError(TesselError, RuntimeError):
    """A step that failed on a rank; the message names the rank, the instruction, its block and
    micro-batch, and the cause."""


class LaunchError(TesselError, RuntimeError):
    """A job that could not start or failed; the message leads with the first failure, then what
    every rank reported."""


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)` cut to at most `limit` characters, so an error never echoes a whole document."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# reprlib stops at a few levels and items, so quoting a huge or deep document costs little
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxtuple = 3, 6, 6, 6
_SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = QUOTE_CHARS, 40, QUOTE_CHARS
