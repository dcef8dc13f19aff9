"""The files a command that produces a schedule can write: schedule JSON, picture, trace.

Output paths are checked when arguments are parsed (name length, directory there, file not
read-only), and together before the command starts (`check_outputs`: no two outputs the same file,
no output one of the command's inputs), so a bad name fails before a long search, not after; the
files are written only once the command has its result, atomically and all or none (a chart that
fails leaves no schedule file either), so a failed or interrupted command leaves them untouched.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import OutputError, UsageError, quote
from ..io import all_or_nothing, check_writable
from ..schedule import Schedule

OUTPUT_OPTIONS = {"output": "-o", "plot": "--plot", "trace": "--trace", "placement_out": "--placement-out"}
INPUT_ARGUMENTS = {"placement": "PLACEMENT", "schedule": "SCHEDULE", "model": "MODEL"}

PICTURE_SUFFIXES = (".png", ".svg")


def output_path(text: str) -> str:
    """An argparse type: a file this command may create or replace."""
    try:
        check_writable(text)
    except OutputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def picture_path(text: str) -> str:
    if Path(text).suffix.lower() not in PICTURE_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text[:200]}: a picture must end in .png or .svg")
    return output_path(text)


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE", type=output_path, help="write the schedule JSON here")
    p.add_argument("--plot", metavar="FILE", type=picture_path, help="write a Gantt chart (.png or .svg)")
    p.add_argument("--trace", metavar="FILE", type=output_path, help="write a Chrome/Perfetto trace (.json)")


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, two outputs that are the same file, or an output that is an input."""
    seen: dict[str, str] = {}
    for dest, option in OUTPUT_OPTIONS.items():
        path = getattr(args, dest, None)
        if not isinstance(path, str):
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"{option} and {seen[real]} name the same file {quote(path)}: "
                             "one would replace the other")
        seen[real] = option
    for dest, name in INPUT_ARGUMENTS.items():
        path = getattr(args, dest, None)
        if isinstance(path, str) and os.path.realpath(path) in seen:
            option = seen[os.path.realpath(path)]
            raise UsageError(f"{option} {quote(path)} is the command's input {name}: "
                             "write the result to another file")


def write_outputs(s: Schedule, args: argparse.Namespace, extra: dict[str, str] | None = None) -> None:
    """Write the schedule's files (and `extra`: path -> text), all of them or none."""
    written = []
    with all_or_nothing():
        from ..io import atomic_write
        for path, text in (extra or {}).items():
            atomic_write(path, text)
            written.append(path)
        if getattr(args, "output", None):
            s.save(args.output)
            written.append(args.output)
        if getattr(args, "plot", None):
            from ..viz.gantt import plot_schedule
            plot_schedule(s, args.plot)
            written.append(args.plot)
        if getattr(args, "trace", None):
            from ..viz.trace import write_trace
            write_trace(s, args.trace)
            written.append(args.trace)
    for path in written:
        print(f"wrote {path}")
